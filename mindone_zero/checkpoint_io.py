"""File-level checkpoint I/O: atomic writes, split-info JSON, and the offline combine.

Nothing here communicates: every function works on files in one process, so it can run on
a machine with no accelerator and no ``msrun`` (DESIGN §5).

[Note: atomic files]
Every file is first written under a temporary name in the destination folder and then moved
into place with ``os.replace``, which is atomic on POSIX within one file system. A crash or an
exception therefore leaves either the previous file or the complete new one under the final
name, never a half-written one. On an exception the temporary files are removed; a process
killed outright (SIGKILL, power loss) may leave a hidden ``.{name}.*.tmp`` entry behind, which
is never read by anything here and may be deleted.
"""
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np

from .checkpoint_readers import FORMATS, format_of_path, open_checkpoint
from .checkpoint_writers import TensorEntry, atomic_file, stream_checkpoint
from .partition import ShardSpec, merge_arrays, padding_rows, shard_rows

__all__ = [
    "atomic_save_checkpoint",
    "atomic_write_json",
    "write_split_info",
    "read_split_info",
    "convert_checkpoints",
    "OPTIMIZER_STATE_PREFIXES",
    "OPTIMIZER_SCALAR_NAMES",
]

# First dotted component of the names MindSpore / MindOne optimizers give their states
# (nn.Adam: moment1/moment2, AdamWeightDecay: adam_m/adam_v, Momentum: moments, Adagrad: accum,
# ASGD/Rprop-style: stat, AMSGrad: vhat).
OPTIMIZER_STATE_PREFIXES = ("moment1", "moment2", "moments", "adam_m", "adam_v", "accum", "stat", "vhat")
# Whole names of optimizer scalars.
OPTIMIZER_SCALAR_NAMES = ("global_step", "beta1_power", "beta2_power", "learning_rate")
# Prefixes whose tensors are copies of network weights, not optimizer states: kept by
# ``exclude_optimizer_states`` even when recognised only by prefix stripping.
_NON_OPTIMIZER_PREFIXES = ("ema",)


# ----------------------------------------------------------------------------- atomic writes


def atomic_write_json(obj: Any, path: str) -> str:
    """Write ``obj`` as indented JSON to ``path`` atomically (see [Note: atomic files]).

    Not collective. Creates the parent folder if needed.

    Args:
        obj: anything ``json.dump`` accepts.
        path: destination file.

    Returns:
        ``path``.

    Raises:
        TypeError: if ``obj`` is not JSON serialisable (``path`` is left untouched).
        OSError: if the folder cannot be written.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_file(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
    return path


def _save_entries(params) -> Tuple[list, dict]:
    """Split ``params`` into MindSpore's list form [{"name", "data": Tensor}] and a dict of
    string values (which only ``append_dict`` accepts). Arrays are wrapped without a copy."""
    if isinstance(params, dict):
        items = list(params.items())
    elif isinstance(params, (list, tuple)):
        items = []
        for p in params:
            if isinstance(p, ms.Parameter):
                items.append((p.name, p))
            elif isinstance(p, dict) and "name" in p and "data" in p:
                items.append((p["name"], p["data"]))
            else:
                raise TypeError(
                    "For 'atomic_save_checkpoint', the argument 'params' must be a dict, or a list of Parameters "
                    f"or of {{'name', 'data'}} dicts, but got an item of type {type(p).__name__}."
                )
    else:
        raise TypeError(
            "For 'atomic_save_checkpoint',"
            f" the argument 'params' must be a dict or a list, but got {type(params).__name__}."
        )
    tensors, strings, seen = [], {}, set()
    for name, value in items:
        if not isinstance(name, str) or name in seen:
            raise ValueError(
                "For 'atomic_save_checkpoint', every name must be a unique string,"
                f" but got {name!r} twice or as a non-string."
            )
        seen.add(name)
        if isinstance(value, str):
            strings[name] = value
        elif isinstance(value, ms.Tensor):
            tensors.append({"name": name, "data": value})
        else:
            arr = np.asarray(value)
            # np.ascontiguousarray would turn 0-d arrays into 1-d ones.
            arr = arr if arr.flags.c_contiguous else arr.copy(order="C")
            tensors.append({"name": name, "data": ms.Tensor.from_numpy(arr)})
    return tensors, strings


def atomic_save_checkpoint(params, path: str, format: Optional[str] = None) -> str:  # noqa: A002 (MindSpore's name)
    """Save named tensors with ``mindspore.save_checkpoint`` atomically (see [Note: atomic files]).

    Not collective: every rank saves its own file. Creates the parent folder if needed. MindSpore
    marks the saved file read-only for its owner, as ``save_checkpoint`` always does.

    Args:
        params: ``{name: value}`` or a list of Parameters or of ``{"name": ..., "data": ...}`` dicts;
            a value is a numpy array (wrapped without a copy), a ``mindspore.Tensor``/``Parameter``,
            or a ``str`` (``.ckpt`` only, stored through ``append_dict`` and so written last).
        path: destination; must end with ``.ckpt`` or ``.safetensors`` (MindSpore would otherwise
            append an extension and the final name would not be ``path``).
        format: ``"ckpt"`` or ``"safetensors"``; ``None`` takes it from the extension.

    Returns:
        ``path``.

    Raises:
        ValueError: if ``format`` is unknown or disagrees with the extension, or names repeat.
        TypeError: if ``params`` has the wrong type, or holds strings for ``safetensors``.
        Exception: whatever ``mindspore.save_checkpoint`` raises; ``path`` then keeps its old
            content (or stays absent) and no temporary file remains.
    """
    fmt = format_of_path(path) if format is None else format
    if fmt not in FORMATS or not path.endswith("." + fmt):
        raise ValueError(
            "For 'atomic_save_checkpoint', the argument 'path' must end with '.ckpt' or '.safetensors' "
            f"matching 'format', but got path {path!r} and format {format!r}."
        )
    tensors, strings = _save_entries(params)
    if strings and fmt == "safetensors":
        raise TypeError(
            "For 'atomic_save_checkpoint', safetensors cannot store strings,"
            f" but got {sorted(strings)} for {path!r}."
        )
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # A private folder, because MindSpore itself writes a second temporary (.tmp) next to the
    # name it is given and does not remove it on failure; rmtree removes both.
    tmp_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        tmp_path = os.path.join(tmp_dir, os.path.basename(path))
        ms.save_checkpoint(tensors, tmp_path, format=fmt, append_dict=strings or None)
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            os.fsync(fd)  # the data must be on disk before the name points at it
        finally:
            os.close(fd)
        os.replace(tmp_path, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return path


# ----------------------------------------------------------------------------- split-info JSON


def write_split_info(
    specs: Sequence[ShardSpec], folder: str, rank_id: int, prefix: str = "params_split_info", tag: str = ""
) -> str:
    """Write ``{folder}/{prefix}_{rank_id}{tag}.json`` = ``{name: spec.to_json()}`` atomically.

    Not collective. Each entry has MindOne's keys ``split``, ``group_size``, ``rank_id`` plus ours,
    ``shape`` (full, unpadded) and ``pad`` (padding rows); see [Note: padding] in partition.py.

    With hybrid groups (several data-parallel replicas of one optimizer group writing to the same
    folder), ranks of different replicas share ``rank_id``; give each replica its own ``tag``
    (for example ``f"_dp{replica}"``) so the files stay distinct, and pass the matching pattern
    (``"params_split_info_{}_dp0.json"``) to ``convert_checkpoints``. The default tag ``""`` gives
    MindOne's name ``params_split_info_{rank_id}.json``.

    Args:
        specs: one ShardSpec per saved name (network params, optimizer states, EMA).
        folder: destination folder (created if needed).
        rank_id: this rank's index in the optimizer parallel group; every spec's ``rank`` must equal it.
        prefix: file name prefix.
        tag: suffix placed after ``rank_id``.

    Returns:
        The path written.

    Raises:
        ValueError: if a spec's rank differs from ``rank_id``, group sizes differ, or names repeat.
    """
    entries = {}
    for spec in specs:
        if spec.rank != rank_id or spec.group_size != specs[0].group_size or spec.name in entries:
            raise ValueError(
                f"For 'write_split_info', every spec must have rank {rank_id}, one group size and a unique name, "
                f"but got {spec}."
            )
        entries[spec.name] = spec.to_json()
    return atomic_write_json(entries, os.path.join(folder, f"{prefix}_{rank_id}{tag}.json"))


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_entry(entry) -> Optional[str]:
    """The problem with one split-info entry, or None."""
    if not isinstance(entry, dict):
        return f"the entry is a {type(entry).__name__}, not an object"
    if not isinstance(entry.get("split"), bool):
        return f"'split' must be a bool, got {entry.get('split')!r}"
    size, rank = entry.get("group_size"), entry.get("rank_id")
    if not _is_int(size) or size < 1 or not _is_int(rank) or not 0 <= rank < size:
        return f"'group_size' and 'rank_id' must be integers with 0 <= rank_id < group_size, got {size!r}, {rank!r}"
    shape, pad = entry.get("shape"), entry.get("pad")
    if shape is not None and (not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape)):
        return f"'shape' must be a list of non-negative integers, got {shape!r}"
    if shape is not None and entry["split"] and len(shape) == 0:
        return "a 0-d tensor cannot be split"
    if pad is not None and not (_is_int(pad) and pad >= 0):
        return f"'pad' must be a non-negative integer, got {pad!r}"
    if shape is not None and pad is not None:
        want = padding_rows(shape[0], size) if entry["split"] else 0
        if pad != want:
            return f"'pad' is {pad}, but shape {shape} over {size} ranks needs {want}"
    return None


def read_split_info(path: str) -> Dict[str, dict]:
    """Read and validate one ``params_split_info_*.json``.

    Accepts our entries and MindOne's (which lack ``shape`` and ``pad``). Not collective.

    Args:
        path: the JSON file.

    Returns:
        ``{name: entry}``; each entry has ``split``, ``group_size``, ``rank_id`` and, when the
        file has them, ``shape`` and ``pad``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file is not JSON, not an object, or an entry is malformed; the
            message names the file and the entry.
    """
    with open(path, encoding="utf-8") as f:
        try:
            info = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"For 'read_split_info', the file '{path}' is not valid JSON: {err}.") from err
    if not isinstance(info, dict):
        raise ValueError(
            f"For 'read_split_info', the file '{path}' must hold a JSON object,"
            f" but got {type(info).__name__}."
        )
    for name, entry in info.items():
        problem = _check_entry(entry)
        if problem:
            raise ValueError(f"For 'read_split_info', the entry {name!r} in '{path}' is malformed: {problem}.")
    return info


# ----------------------------------------------------------------------------- offline combine

_CALLER = "convert_checkpoints"


def _check_convert_args(src_checkpoint, src_param_split_info_json, group_size, output_format, progress) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(
            f"For '{_CALLER}',"
            f" the argument 'group_size' must be a positive integer, but got {group_size!r}."
        )
    for arg, value in (("src_checkpoint", src_checkpoint), ("src_param_split_info_json", src_param_split_info_json)):
        ok = isinstance(value, str) and "{}" in value
        try:
            ok = ok and bool(value.format(0))
        except (IndexError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                f"For '{_CALLER}', the argument '{arg}' must be a path with one '{{}}' standing for the rank index "
                f"(and no other braces), but got {value!r}."
            )
    if not src_checkpoint.endswith((".ckpt", ".safetensors")):
        raise ValueError(
            f"For '{_CALLER}',"
            f" the argument 'src_checkpoint' must end with '.ckpt' or '.safetensors', but got {src_checkpoint!r}."
        )
    if output_format is not None and output_format not in FORMATS:
        raise ValueError(
            f"For '{_CALLER}',"
            f" the argument 'output_format' must be one of {list(FORMATS)} or None, but got {output_format!r}."
        )
    if progress is not None and not callable(progress):
        raise TypeError(f"For '{_CALLER}', the argument 'progress' must be callable or None, but got {progress!r}.")


def _output_path(src_checkpoint: str, group_size: int, output_format: Optional[str]) -> Tuple[str, str]:
    """MindOne's output name, with the extension switched when ``output_format`` asks for it."""
    path = src_checkpoint.format(f"all_{group_size}")
    fmt = output_format or format_of_path(path)
    if format_of_path(path) != fmt:
        path = os.path.splitext(path)[0] + "." + fmt
    return path, fmt


def _load_split_infos(paths: List[str], group_size: int) -> List[Dict[str, dict]]:
    """Read every rank's JSON and check it against ``group_size``, its file index and rank 0's."""
    infos = [read_split_info(p) for p in paths]
    for rank, (path, info) in enumerate(zip(paths, infos)):
        for name, entry in info.items():
            if entry["group_size"] != group_size:
                raise ValueError(
                    f"For '{_CALLER}', the split info '{path}' was written for a group of {entry['group_size']} ranks "
                    f"(entry {name!r}), but the argument 'group_size' is {group_size}."
                )
            if entry["rank_id"] != rank:
                raise ValueError(
                    f"For '{_CALLER}', the split info '{path}' is file {rank} of the group, but its entry {name!r} "
                    f"has rank_id {entry['rank_id']}."
                )
        if set(info) != set(infos[0]):
            diff = sorted(set(info) ^ set(infos[0]))[:5]
            raise ValueError(f"For '{_CALLER}', the split info '{path}' lists other names than '{paths[0]}': {diff}.")
        for name, entry in info.items():
            ref = infos[0][name]
            if (entry["split"], entry.get("shape")) != (ref["split"], ref.get("shape")):
                raise ValueError(
                    f"For '{_CALLER}', the split info '{path}' disagrees with "
                    f"'{paths[0]}' on {name!r}: {entry} vs {ref}."
                )
    return infos


def _lookup(name: str, info: Dict[str, dict]) -> Tuple[Optional[str], bool]:
    """The split-info key for ``name`` and whether it was found only after stripping leading
    dotted components ("moment1.dense.weight" -> "dense.weight"): MindOne's JSON lists network
    parameter names only, and optimizer states carry the parameter name behind a prefix."""
    if name in info:
        return name, False
    parts = name.split(".")
    for i in range(1, len(parts)):
        key = ".".join(parts[i:])
        if key in info:
            return key, True
    return None, False


def _is_optimizer_state(name: str, stripped: bool) -> bool:
    """The ``exclude_optimizer_states`` rule; see ``convert_checkpoints``."""
    first = name.split(".", 1)[0]
    if name in OPTIMIZER_SCALAR_NAMES or ("." in name and first in OPTIMIZER_STATE_PREFIXES):
        return True
    return stripped and first not in _NON_OPTIMIZER_PREFIXES


def _check_same_names(files) -> None:
    ref = files[0]
    for f in files[1:]:
        if set(f.infos) != set(ref.infos):
            missing, extra = sorted(set(ref.infos) - set(f.infos)), sorted(set(f.infos) - set(ref.infos))
            raise ValueError(
                f"For '{_CALLER}', the checkpoint '{f.path}' holds other names than '{ref.path}': "
                f"missing {missing[:5]}, extra {extra[:5]}."
            )
        for name, info in ref.infos.items():
            if f.infos[name] != info:
                raise ValueError(
                    f"For '{_CALLER}', the shard {name!r} has shape {f.infos[name].shape} ({f.infos[name].dtype}) in "
                    f"'{f.path}' but {info.shape} ({info.dtype}) in '{ref.path}'."
                )


def _split_rows(name: str, shard: Tuple[int, ...], entry: dict, key: str, n: int, where: str) -> int:
    """Full dim 0 of a split tensor whose blocks have shape ``shard``; checks it against the JSON."""
    if len(shard) == 0:
        raise ValueError(f"For '{_CALLER}', {name!r} is split in {where}, but the checkpoint holds a 0-d tensor.")
    if "shape" not in entry:
        # MindOne split only tensors whose dim 0 divides by the group: no padding to drop.
        return shard[0] * n
    full = tuple(entry["shape"])
    expected = (shard_rows(full[0], n),) + full[1:]
    if shard != expected:
        raise ValueError(
            f"For '{_CALLER}', the shard {name!r} has shape {shard}, but {where} gives {key!r} the full shape {full}, "
            f"whose shards over {n} ranks have shape {expected} (rows = ceil({full[0]} / {n}))."
        )
    return full[0]


def _plan(files, info: Dict[str, dict], json_path: str, n: int, exclude: bool) -> List[Tuple[str, Optional[int]]]:
    """(name, full dim 0 or None when taken whole from rank 0), in rank 0's order; raises on
    every inconsistency between the files and the split info before anything is read."""
    plan = []
    for name, tensor in files[0].infos.items():
        key, stripped = _lookup(name, info)
        if exclude and _is_optimizer_state(name, stripped):
            continue
        entry = info.get(key) if key is not None else None
        where = f"the split info '{json_path}'"
        if entry is not None and entry["split"]:
            plan.append((name, _split_rows(name, tensor.shape, entry, key, n, where)))
            continue
        # A state found by prefix stripping may legitimately differ in shape from its
        # replicated parameter (factored second moments), so only direct matches are checked.
        if entry is not None and not stripped and "shape" in entry and tuple(entry["shape"]) != tensor.shape:
            raise ValueError(
                f"For '{_CALLER}', the replicated tensor {name!r} has shape {tensor.shape} in '{files[0].path}', "
                f"but {where} gives {tuple(entry['shape'])}."
            )
        plan.append((name, None))
    return plan


def convert_checkpoints(
    src_checkpoint: str,
    src_param_split_info_json: str,
    group_size: int,
    *,
    output_format: Optional[str] = None,
    exclude_optimizer_states: bool = False,
    progress: Optional[Callable[[int, int, str], None]] = None,
) -> str:
    """Combine per-rank ZeRO checkpoints into one file of full tensors (MindOne's naming).

    Not collective; runs in one process. Reads ``src_checkpoint.format(r)`` and
    ``src_param_split_info_json.format(r)`` for ``r`` in ``0 .. group_size - 1`` and writes
    ``src_checkpoint.format(f"all_{group_size}")`` (extension switched to ``output_format``).

    For each name, in rank 0's order:

    * found in the split info (directly, or after stripping leading dotted components, as for
      optimizer states "moment1.w" or "adam_m.w" of a network parameter "w") with ``split``:
      the blocks of all ranks are concatenated in rank order and the padding dropped
      ([Note: padding] in partition.py). The full dim 0 is the JSON ``shape``; MindOne's JSON has
      no ``shape``, but MindOne split only tensors whose dim 0 divides by the group, so nothing
      is dropped;
    * otherwise (not split, or unknown to the split info): replicated, taken from rank 0 (every
      rank must hold the same shape and dtype).

    ``exclude_optimizer_states`` drops a name when: it is one of ``OPTIMIZER_SCALAR_NAMES``; or
    its first dotted component is one of ``OPTIMIZER_STATE_PREFIXES``; or it is absent from the
    split info and found there only by prefix stripping, unless its first component is ``ema``
    (EMA weights are copies of the network, not optimizer states).

    Every check runs before anything is written, and the output is written atomically
    ([Note: atomic files]): after any error no output file exists (or a previous one is intact).

    Memory: tensors are read lazily, one at a time (``checkpoint_readers``), and the output is
    written as it goes, one tensor at a time (``checkpoint_writers``), byte for byte the file
    ``mindspore.save_checkpoint`` would write for the same tensors. At most one tensor's blocks
    from all ranks and their concatenation are held at once: the call raises the peak RSS by
    about twice the largest tensor, whatever the checkpoint's size. ``tools/measure_combine_memory.py``
    measures it (README, "Checkpoints"); ``tests/unit/test_checkpoint_io.py`` checks the bound.

    Args:
        src_checkpoint: per-rank checkpoint path with ``{}`` for the rank index, ending with
            ``.ckpt`` or ``.safetensors``, e.g. ``"ckpt/rank_{}/net.ckpt"``.
        src_param_split_info_json: per-rank split-info path with ``{}``, e.g.
            ``"params_info/params_split_info_{}.json"``; ours or MindOne's format.
        group_size: ranks in the optimizer parallel group that wrote the files.
        output_format: ``"ckpt"``, ``"safetensors"`` or None (the input's format).
        exclude_optimizer_states: drop optimizer states (rule above).
        progress: called as ``progress(done, total, name)`` after each tensor.

    Returns:
        The output path.

    Raises:
        ValueError: bad arguments; a JSON whose ``group_size`` or ``rank_id`` disagrees with the
            argument or its file index, or that disagrees with rank 0's; rank files with different
            names, shapes or dtypes; a shard shape inconsistent with the JSON ``shape``; a
            truncated or corrupted checkpoint; strings requested in ``.safetensors`` output.
            Each message names the file and the problem.
        FileNotFoundError: a rank's checkpoint or JSON is missing.
    """
    _check_convert_args(src_checkpoint, src_param_split_info_json, group_size, output_format, progress)
    n = int(group_size)
    ckpt_paths = [src_checkpoint.format(r) for r in range(n)]
    json_paths = [src_param_split_info_json.format(r) for r in range(n)]
    for kind, path in [("checkpoint", p) for p in ckpt_paths] + [("split info", p) for p in json_paths]:
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"For '{_CALLER}',"
                f" the {kind} file '{path}' of the group of {n} ranks does not exist."
            )
    out_path, out_format = _output_path(src_checkpoint, n, output_format)
    info = _load_split_infos(json_paths, n)[0]
    files = [open_checkpoint(p, _CALLER) for p in ckpt_paths]
    _check_same_names(files)
    plan = _plan(files, info, json_paths[0], n, exclude_optimizer_states)
    strings = [name for name, _ in plan if files[0].infos[name].dtype == "str"]
    if strings and out_format == "safetensors":
        raise ValueError(
            f"For '{_CALLER}', '{ckpt_paths[0]}' holds strings {strings[:5]},"
            " which safetensors cannot store."
        )
    full_d0_of = dict(plan)

    def produce(name):
        if full_d0_of[name] is None:
            return files[0].read(name)
        return merge_arrays([f.read(name) for f in files], full_d0_of[name])

    done = []

    def written(name):
        done.append(name)
        if progress is not None:
            progress(len(done), len(plan), name)

    return stream_checkpoint(out_path, out_format, _entries(files[0], plan), produce, written)


def _entries(rank0, plan) -> List[TensorEntry]:
    """(name, full shape, numpy dtype or str) of every output tensor, in ``plan``'s order."""
    entries = []
    for name, full_d0 in plan:
        shape = rank0.infos[name].shape
        if full_d0 is not None:
            shape = (full_d0,) + tuple(shape[1:])
        entries.append((name, tuple(shape), rank0.numpy_dtype(name)))
    return entries
