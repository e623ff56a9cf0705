"""What a ZeRO train network's checkpoint holds and where, and how a saved one maps onto a
train network: no communication and no writing here (``checkpoint.py`` does both).

[Note: checkpoint layout]
``save_train_state(train_net, ckpt_dir, step)`` writes ``ckpt_dir/step_{step:08d}/`` (DESIGN §5,
MindOne's table). ``r`` is the rank's index in the optimizer parallel group, ``g`` its global
rank, ``fmt`` the format (``ckpt`` or ``safetensors``):

==============================================  ===========================  =======================================
file                                            written by                   holds
==============================================  ===========================  =======================================
``network.fmt`` (stages 0-2)                    global rank 0                every network parameter, full
``network_rank{r}.fmt`` (stage 3)               op rank r of replica 0       network shards (and whole 0-d/opted-out
                                                                             or frozen parameters)
``optimizer.fmt`` (stage 0) /                   rank 0 / op rank r of        optimizer states, fp32 master shards
``optimizer_rank{r}.fmt`` (stages >= 1)         replica 0                    ``master.*``, optimizer scalars
                                                                             (``global_step``, beta powers,
                                                                             ``learning_rate``)
``ema.fmt`` / ``ema_rank{r}.fmt`` (with EMA)    as the optimizer file        EMA weights ``ema.*``
``train_state_rank{g}.fmt``                     every global rank            loss scale ``scale_sense`` and the loss-
                                                                             scale update Cell's counters,
                                                                             ``accum_step``, ``accum_overflow``,
                                                                             ``accum_grad.*``, ``ema_updates``
``params_info/params_split_info_{r}.json``      op rank r of replica 0       every name above (``split``,
                                                                             ``group_size``, ``rank_id``, ``shape``,
                                                                             ``pad``)
``meta.json``                                   global rank 0, last          stage, world and group sizes, step,
                                                                             format, accumulation position, files
                                                                             and their sizes
==============================================  ===========================  =======================================

Hybrid groups (``dp_group`` given): ranks with the same index in ``dp_group`` are replicas that
hold identical shards, so only replica 0 (index 0 in ``dp_group``) writes the sharded files and
the JSON; the files of different replicas can never overwrite each other. The train state is
written per *global* rank because at stages 0 and 1 the accumulation buffers hold each rank's
own, not yet reduced, gradient sums.

In the JSON, an entry describes the tensor as the per-rank file holds it. The one exception keeps
MindOne's meaning: at stages 1-2 the network's names say whether their optimizer shards are
split (``ZeroHelper``'s entries), while ``network.fmt`` holds them full.

[Note: resharding]
Loading maps every Parameter of the new train network to the same name in the checkpoint. A
tensor saved in per-op-rank files with ``split`` is rebuilt from its N blocks with
``partition.merge_arrays`` (one tensor at a time) and cut for this rank with
``partition.split_array``; when N equals this run's group size and both sides are split, the
rank's own block is read directly. The accumulation state cannot be resharded mid-way (its
buffers hold per-rank partial sums); at an optimizer-step boundary it is all zeros and is reset.
"""
import json
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
from mindspore.communication import GlobalComm, get_group_size, get_rank

from .checkpoint_io import read_split_info
from .checkpoint_readers import open_checkpoint
from .comm import group_size_and_rank
from .inventory import Held, inventory
from .partition import merge_arrays, shard_rows, split_array
from .stage import StagePolicy

__all__ = ["KINDS", "META", "LATEST", "SPLIT_INFO_DIR", "LOAD", "Layout", "SavedCheckpoint", "build_layout", "check_dir",
           "check_step", "is_complete", "latest_checkpoint", "plan_load", "read_meta", "resolve_step_dir",
           "step_dir_name", "world_and_rank"]

KINDS = ("network", "optimizer", "ema", "train_state")
# the file each kind of the train network's inventory is saved in
_FILE_OF = {"params": "network", "master_shards": "optimizer", "optimizer_states": "optimizer",
            "optimizer_other": "optimizer", "ema": "ema", "accumulation": "train_state", "other": "train_state"}
META = "meta.json"
LATEST = "latest"
SPLIT_INFO_DIR = "params_info"
_ACCUM_SCALARS = ("accum_step", "accum_overflow")
_ACCUM_PREFIX = "accum_grad."
_STEP_DIR = re.compile(r"step_(\d+)")


def _is_accum(name: str) -> bool:
    return name in _ACCUM_SCALARS or name.startswith(_ACCUM_PREFIX)


# ----------------------------------------------------------------------------- layout


@dataclass
class Layout:
    """How one train network's state is spread over the ranks. Built without communication."""

    stage: int
    world: int
    rank: int
    op_size: int
    op_rank: int
    dp_size: int
    replica: int
    accum_steps: int
    items: Dict[str, List[Held]]

    def per_rank(self, kind: str) -> bool:
        """Whether ``kind`` is saved one file per op rank."""
        return per_rank_kind(kind, self.stage)

    def file_names(self, kind: str, fmt: str) -> List[str]:
        """Every file of ``kind`` in a checkpoint of this layout, in rank order."""
        return _file_names(kind, self.stage, self.world, self.op_size, fmt)

    def my_file(self, kind: str) -> Optional[int]:
        """Index of the file of ``kind`` this rank writes, or None."""
        if kind == "train_state":
            return self.rank
        if self.per_rank(kind):
            return self.op_rank if self.replica == 0 else None
        return 0 if self.rank == 0 else None


def per_rank_kind(kind: str, stage: int) -> bool:
    """Whether ``kind`` is saved one file per op rank (else one file, or one per global rank)."""
    policy = StagePolicy(stage)
    return kind != "train_state" and (policy.shards_params if kind == "network" else policy.shards_optimizer)


def _file_names(kind: str, stage: int, world: int, op_size: int, fmt: str) -> List[str]:
    if kind == "train_state":
        return [f"train_state_rank{g}.{fmt}" for g in range(world)]
    if per_rank_kind(kind, stage):
        return [f"{kind}_rank{r}.{fmt}" for r in range(op_size)]
    return [f"{kind}.{fmt}"]


def world_and_rank() -> tuple:
    """(world size, global rank); (1, 0) without communication."""
    if not GlobalComm.INITED:
        return 1, 0
    return get_group_size(), get_rank()


def build_layout(train_net, caller: str) -> Layout:
    """Classify every Parameter of ``train_net`` (a TrainOneStepWrapper) into a file kind with its
    layout ([Note: checkpoint layout]); raises ValueError naming ``caller`` if names repeat."""
    helper = train_net.zero_helper
    n, r, stage = helper.op_size, helper.op_rank, helper.zero_stage
    world, rank = world_and_rank()
    dp_size, replica = group_size_and_rank(helper.dp_group) if (helper.is_parallel and helper.dp_group) else (1, 0)
    items = {kind: [] for kind in KINDS}
    for held in inventory(train_net):
        items[_FILE_OF[held.kind]].append(held)
    layout = Layout(stage, world, rank, n, r, dp_size, replica, train_net.accum_steps, items)
    _check_layout(layout, caller)
    return layout


def _check_layout(layout: Layout, caller: str) -> None:
    names = {}
    for kind, kind_items in layout.items.items():
        for it in kind_items:
            if it.param.name in names:
                raise ValueError(
                    f"For '{caller}', the argument 'train_net' holds two Parameters named {it.param.name!r} "
                    f"({names[it.param.name]} and {kind}); checkpoint names must be unique."
                )
            names[it.param.name] = kind
            want = it.held.shard_shape
            if tuple(it.param.shape) != want:
                raise ValueError(
                    f"For '{caller}', the {kind} tensor {it.param.name!r} has shape {tuple(it.param.shape)}, "
                    f"but its ZeRO layout (full shape {it.held.shape}, split={it.held.split} over "
                    f"{it.held.group_size} ranks) gives {want}."
                )


# ----------------------------------------------------------------------------- folders and arguments


def check_dir(path, caller: str, arg: str = "ckpt_dir") -> str:
    """``path`` as a str; raises TypeError naming ``arg`` unless it is a non-empty path."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"For '{caller}', the argument '{arg}' must be a non-empty path, but got {path!r}.")
    return os.fspath(path)


def check_step(step, caller: str, allow_none: bool = False) -> None:
    """Raise ValueError unless ``step`` is an integer >= 0 (or None when allowed)."""
    if step is None and allow_none:
        return
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"For '{caller}', the argument 'step' must be an integer >= 0, but got {step!r}.")


def step_dir_name(step: int) -> str:
    """Folder name of the checkpoint of ``step`` under ``ckpt_dir``: ``step_{step:08d}``."""
    return f"step_{int(step):08d}"


def is_complete(step_dir: str) -> bool:
    """Whether ``step_dir`` holds a complete checkpoint ([Note: checkpoint completion] in checkpoint.py)."""
    return os.path.isfile(os.path.join(step_dir, META))


def latest_checkpoint(ckpt_dir) -> Optional[str]:
    """The newest complete checkpoint folder under ``ckpt_dir``, or None.

    Not collective. Takes the folder ``ckpt_dir/latest`` names when it is complete (holds
    ``meta.json``), else the complete ``step_*`` folder with the highest step.

    Raises:
        TypeError: ``ckpt_dir`` is not a path.
    """
    ckpt_dir = check_dir(ckpt_dir, "latest_checkpoint")
    try:
        with open(os.path.join(ckpt_dir, LATEST), encoding="utf-8") as f:
            named = os.path.join(ckpt_dir, json.load(f)["dir"])
        if is_complete(named):
            return named
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no or unreadable pointer: fall back to scanning
    if not os.path.isdir(ckpt_dir):
        return None
    steps = [(int(m.group(1)), name) for name in os.listdir(ckpt_dir)
             if (m := _STEP_DIR.fullmatch(name)) and is_complete(os.path.join(ckpt_dir, name))]
    return os.path.join(ckpt_dir, max(steps)[1]) if steps else None


# ----------------------------------------------------------------------------- load plan



LOAD = "load_train_state"
_META_KEYS = {"step": int, "zero_stage": int, "world_size": int, "op_group_size": int, "format": str,
              "gradient_accumulation_steps": int, "accum_step": int, "files": dict, "split_info": list, "sizes": dict}


def resolve_step_dir(ckpt_dir: str, step) -> str:
    """The complete step folder to load: of ``step``, else the latest (``ckpt_dir`` itself if it is one)."""
    if step is None:
        found = ckpt_dir if is_complete(ckpt_dir) else latest_checkpoint(ckpt_dir)
        if found is None:
            raise FileNotFoundError(f"For '{LOAD}', the argument 'ckpt_dir' holds no complete checkpoint: '{ckpt_dir}'.")
        return found
    found = os.path.join(ckpt_dir, step_dir_name(step))
    if not is_complete(found):
        raise FileNotFoundError(
            f"For '{LOAD}', the checkpoint of 'step' {step}, '{found}', is missing or incomplete (no {META})."
        )
    return found


def read_meta(step_dir: str) -> dict:
    """``meta.json`` of ``step_dir``, its keys checked; ValueError naming the file otherwise."""
    path = os.path.join(step_dir, META)
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except ValueError as err:
        raise ValueError(f"For '{LOAD}', the file '{path}' is not valid JSON: {err}.") from None
    bad = [k for k, t in _META_KEYS.items() if not isinstance(meta, dict) or not isinstance(meta.get(k), t)]
    if bad:
        raise ValueError(f"For '{LOAD}', the file '{path}' lacks or mistypes the keys {bad}.")
    return meta


class SavedCheckpoint:
    """A complete checkpoint folder: its meta, checked file sizes, split infos, lazily opened files."""

    def __init__(self, step_dir: str):
        self.dir = step_dir
        self.meta = read_meta(step_dir)
        self.n = self.meta["op_group_size"]
        self.per_rank = {k: per_rank_kind(k, self.meta["zero_stage"]) for k in self.meta["files"]}
        for name, size in self.meta["sizes"].items():
            path = self.path(name)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"For '{LOAD}', the file '{path}' listed in '{self.path(META)}' does not exist "
                    f"(checkpoint of {self.meta['world_size']} ranks, optimizer group of {self.n})."
                )
            if os.path.getsize(path) != size:
                raise ValueError(
                    f"For '{LOAD}', the file '{path}' is truncated or was changed: it has {os.path.getsize(path)} "
                    f"bytes, but '{self.path(META)}' records {size}."
                )
        for kind, names in self.meta["files"].items():
            want = self.meta["world_size"] if kind == "train_state" else self.n if self.per_rank[kind] else 1
            if kind not in KINDS or len(names) != want:
                raise ValueError(
                    f"For '{LOAD}', '{self.path(META)}' lists {len(names)} files of kind {kind!r}; a checkpoint of "
                    f"stage {self.meta['zero_stage']} over {self.meta['world_size']} ranks has {want}."
                )
        self.infos = self._split_infos()
        self._readers = {}

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _split_infos(self) -> List[dict]:
        paths = [self.path(p) for p in self.meta["split_info"]]
        infos = [read_split_info(p) for p in paths]
        for r, (path, info) in enumerate(zip(paths, infos)):
            for name, entry in info.items():
                if entry["group_size"] != self.n or entry["rank_id"] != r:
                    raise ValueError(
                        f"For '{LOAD}', the split info '{path}' gives {name!r} group_size {entry['group_size']} and "
                        f"rank_id {entry['rank_id']}, but '{self.path(META)}' says file {r} of a group of {self.n}."
                    )
                ref = infos[0].get(name)
                if ref is None or (entry["split"], entry.get("shape")) != (ref["split"], ref.get("shape")):
                    raise ValueError(
                        f"For '{LOAD}', the split info '{path}' disagrees with '{paths[0]}' on {name!r}: "
                        f"{entry} vs {ref}."
                    )
            if len(info) != len(infos[0]):
                raise ValueError(f"For '{LOAD}', the split info '{path}' lists other names than '{paths[0]}'.")
        return infos

    def reader(self, kind: str, index: int):
        key = (kind, index)
        if key not in self._readers:
            self._readers[key] = open_checkpoint(self.path(self.meta["files"][kind][index]), LOAD)
        return self._readers[key]

    def readers(self, kind: str) -> list:
        """Every file of a per-op-rank kind (or the single file), with names and shapes checked alike."""
        files = [self.reader(kind, i) for i in range(len(self.meta["files"][kind]))]
        for f in files[1:]:
            if f.infos != files[0].infos:
                diff = sorted(set(f.infos.items()) ^ set(files[0].infos.items()))[:4]
                raise ValueError(
                    f"For '{LOAD}', the checkpoint file '{f.path}' holds other names or shapes than "
                    f"'{files[0].path}': {diff}."
                )
        return files


def _check_compatible(layout: Layout, saved: SavedCheckpoint) -> None:
    meta, where = saved.meta, saved.path(META)
    if meta["zero_stage"] != layout.stage:
        raise ValueError(
            f"For '{LOAD}', the checkpoint '{saved.dir}' was written at ZeRO stage {meta['zero_stage']}, but the "
            f"argument 'train_net' is at stage {layout.stage} ({where})."
        )
    have = {k for k in KINDS if layout.items[k]}
    if set(meta["files"]) != have:
        raise ValueError(
            f"For '{LOAD}', the checkpoint '{saved.dir}' holds the parts {sorted(meta['files'])}, but the argument "
            f"'train_net' has {sorted(have)} (an EMA present in one and not the other?)."
        )
    if meta["accum_step"] != 0:
        same = (meta["world_size"], saved.n, meta["gradient_accumulation_steps"]) == \
            (layout.world, layout.op_size, layout.accum_steps)
        if not same:
            raise ValueError(
                f"For '{LOAD}', the checkpoint '{saved.dir}' was saved in the middle of gradient accumulation "
                f"(micro-step {meta['accum_step']} of {meta['gradient_accumulation_steps']}); its accumulation "
                f"buffers hold per-rank partial sums that cannot be resharded, so it loads only with world size "
                f"{meta['world_size']}, optimizer group size {saved.n} and gradient_accumulation_steps "
                f"{meta['gradient_accumulation_steps']}, but 'train_net' has {layout.world}, {layout.op_size} and "
                f"{layout.accum_steps}. Save at an optimizer-step boundary to change them."
            )


def _check_names(kind: str, items: List[Held], stored, path: str, skip_accum: bool) -> None:
    mine = {it.param.name for it in items if not (skip_accum and _is_accum(it.param.name))}
    theirs = {n for n in stored if not (skip_accum and _is_accum(n))}
    if mine != theirs:
        raise ValueError(
            f"For '{LOAD}', the checkpoint file '{path}' and the {kind} state of the argument 'train_net' hold "
            f"different names: missing from the file {sorted(mine - theirs)[:5]}, not in 'train_net' "
            f"{sorted(theirs - mine)[:5]}."
        )


def _saved_full_shape(saved: SavedCheckpoint, files: list, name: str, per_rank: bool):
    """(full shape, split) of ``name`` as saved; checks the shard shape against the split info."""
    shape = files[0].infos[name].shape
    if not per_rank:
        return shape, False
    entry = saved.infos[0].get(name)
    json_path = saved.path(saved.meta["split_info"][0])
    if entry is None:
        raise ValueError(f"For '{LOAD}', {name!r} of '{files[0].path}' has no entry in the split info '{json_path}'.")
    if not entry["split"]:
        return shape, False
    # MindOne's JSON has no shape: it split only tensors whose dim 0 divides by the group.
    full = tuple(entry["shape"]) if "shape" in entry else (shape[0] * saved.n,) + shape[1:]
    if len(full) == 0 or shape != (shard_rows(full[0], saved.n),) + full[1:]:
        raise ValueError(
            f"For '{LOAD}', the shard {name!r} in '{files[0].path}' has shape {shape}, which does not match the full "
            f"shape {full} over {saved.n} ranks in '{json_path}'."
        )
    return full, True


def plan_load(layout: Layout, saved: SavedCheckpoint) -> list:
    """[(Parameter, fetch)]: ``fetch()`` returns this rank's block. Validates everything first."""
    _check_compatible(layout, saved)
    meta, plan = saved.meta, []
    skip_accum = meta["accum_step"] == 0
    for kind in KINDS:
        items = layout.items[kind]
        if not items:
            continue
        if kind == "train_state":
            files = [saved.reader(kind, layout.rank if meta["world_size"] == layout.world else 0)]
        else:
            files = saved.readers(kind)
        _check_names(kind, items, files[0].infos, files[0].path, skip_accum and kind == "train_state")
        for it in items:
            if kind == "train_state" and skip_accum and _is_accum(it.param.name):
                plan.append((it.param, lambda p=it.param: np.zeros(p.shape, np.float32)))
                continue
            plan.append((it.param, _fetcher(layout, saved, kind, files, it)))
    return plan


def _fetcher(layout: Layout, saved: SavedCheckpoint, kind: str, files: list, it: Held):
    name, held = it.param.name, it.held
    if kind == "train_state":
        full, split = files[0].infos[name].shape, False
        want = tuple(it.param.shape)
    else:
        full, split = _saved_full_shape(saved, files, name, saved.per_rank.get(kind, False))
        want = held.shape
    if tuple(full) != tuple(want):
        raise ValueError(
            f"For '{LOAD}', {name!r} has the full shape {tuple(full)} in the checkpoint file '{files[0].path}', "
            f"but {tuple(want)} in the argument 'train_net'."
        )
    if kind == "train_state":
        return lambda: files[0].read(name)
    if split and held.split and saved.n == layout.op_size:
        return lambda: files[layout.op_rank].read(name)  # same layout: no merge needed

    def reshard():
        whole = merge_arrays([f.read(name) for f in files], full[0]) if split else files[0].read(name)
        return split_array(whole, layout.op_size, layout.op_rank) if held.split else whole

    return reshard
