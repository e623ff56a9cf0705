"""How a saved checkpoint maps onto a train network ([Note: resharding] in layout.py): the
checked folder (``SavedCheckpoint``) and, per Parameter, how to fetch this rank's block. No
communication and no writing.
"""
import json
import os
from typing import List

import numpy as np

from ..train.inventory import Held
from ..core.partition import merge_arrays, split_array
from .layout import KINDS, Layout, is_accum
from .naming import META, is_complete, latest_checkpoint, per_rank_kind, step_dir_name
from .readers import open_checkpoint
from ..core.split_info import full_shape_of, read_split_infos

__all__ = ["LOAD", "resolve_step_dir", "read_meta", "SavedCheckpoint", "plan_load"]

LOAD = "load_train_state"
_META_KEYS = {"step": int, "zero_stage": int, "world_size": int, "op_group_size": int, "format": str,
              "gradient_accumulation_steps": int, "accum_step": int, "files": dict, "split_info": list, "sizes": dict}


def resolve_step_dir(ckpt_dir: str, step) -> str:
    """The complete step folder to load: of ``step``, else the latest (``ckpt_dir`` itself if it is one)."""
    if step is None:
        found = ckpt_dir if is_complete(ckpt_dir) else latest_checkpoint(ckpt_dir)
        if found is None:
            raise FileNotFoundError(f"For '{LOAD}', the argument 'ckpt_dir' holds no complete checkpoint: "
                                    f"'{ckpt_dir}'.")
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
        self.infos = read_split_infos([self.path(p) for p in self.meta["split_info"]], self.n, LOAD,
                                      f"'{self.path(META)}' says a group of {self.n}")
        self._readers = {}

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

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
        same = ((meta["world_size"], saved.n, meta["gradient_accumulation_steps"])
                == (layout.world, layout.op_size, layout.accum_steps))
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
    mine = {it.param.name for it in items if not (skip_accum and is_accum(it.param.name))}
    theirs = {n for n in stored if not (skip_accum and is_accum(n))}
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
    return full_shape_of(name, shape, entry, saved.n, LOAD, f"the split info '{json_path}'"), True


_MASTER = "master."  # ZeroHelper's name of a parameter's fp32 master shard (stages 1-2)


def _master_changes(layout: Layout, kind: str, items: List[Held], stored) -> tuple:
    """(masters this run needs that the file lacks, masters the file has that this run lacks).

    [Note: masters and the split rule] Under MindOne's split rule (the default) whether a parameter
    is split, and so has a master shard at stages 1-2, depends on the group size: (6,) is split over
    2 ranks and whole over 4. Resharding therefore drops the masters of parameters that become whole
    (their full value is in the network file, which for fp32 parameters equals the master bit for
    bit) and builds the masters of parameters that become split from that network value.
    """
    if kind != "optimizer" or layout.stage not in (1, 2):
        return set(), set()
    mine = {it.param.name for it in items}
    network = {it.param.name for it in layout.items["network"]}
    need = {n for n in mine - set(stored) if n.startswith(_MASTER) and n[len(_MASTER):] in network}
    extra = {n for n in set(stored) - mine if n.startswith(_MASTER) and n[len(_MASTER):] in network}
    return need, extra


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
        need, extra = _master_changes(layout, kind, items, files[0].infos)
        stored = {n: v for n, v in files[0].infos.items() if n not in extra}
        _check_names(kind, [it for it in items if it.param.name not in need], stored, files[0].path,
                     skip_accum and kind == "train_state")
        for it in items:
            if kind == "train_state" and skip_accum and is_accum(it.param.name):
                plan.append((it.param, lambda p=it.param: np.zeros(p.shape, np.float32)))
                continue
            if it.param.name in need:
                plan.append((it.param, _master_from_network(layout, saved, it)))
                continue
            plan.append((it.param, _fetcher(layout, saved, kind, files, it)))
    return plan


def _master_from_network(layout: Layout, saved: SavedCheckpoint, it: Held):
    """This rank's master block of a parameter saved whole ([Note: masters and the split rule])."""
    name = it.param.name[len(_MASTER):]
    network = saved.readers("network")[0]
    full = tuple(network.infos[name].shape)
    if full != tuple(it.held.shape):
        raise ValueError(
            f"For '{LOAD}', {name!r} has the full shape {full} in the checkpoint file '{network.path}', but "
            f"{tuple(it.held.shape)} in the argument 'train_net'."
        )
    return lambda: split_array(network.read(name).astype(np.float32), layout.op_size, layout.op_rank)


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
