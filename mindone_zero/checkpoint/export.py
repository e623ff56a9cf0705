"""What an export of full tensors writes: the output dtype, the file plan (one ``.ckpt`` or
``.safetensors`` file, or the Hugging Face sharded layout of [Note: sharded layout] in hf_index.py),
and the writing itself, one tensor at a time. Shared by the online export (``save_full_checkpoint``,
which gathers each tensor from the ranks) and the offline combine (``convert_checkpoints``, which
reads each tensor from the rank files). Not collective; no communication.

[Note: export order]
A plan fixes, before any tensor is produced, the order in which ``produce(name)`` is called: for a
``.ckpt`` file the entries' own order; for a ``.safetensors`` file ``SafetensorsWriter.write_order``
(by dtype, then name); for the sharded layout the files in order, each in its own write order. The
online export relies on it: every rank computes the same plan, so every rank gathers the tensors
in the same order while only global rank 0 writes.

[Note: export folder]
The sharded layout is written into a temporary sibling folder ``.{name}.*.tmp`` (each file and the
index atomically), and that folder is renamed onto ``path`` at the end. ``path`` must not exist or
must be an empty folder: a non-empty folder is never replaced (it may hold anything), so after an
error ``path`` is as before and the temporary folder is removed. Files copied from the folder a model
was loaded from ([Note: companion files] in hf_folder.py) go into the temporary folder after the
weights and the index, so they too appear only with the whole export.

[Note: export names]
An export names each tensor as the network does (EMA weights ``ema.<param name>``). A loss Cell
that holds the network as ``net`` puts ``net.`` in front of every parameter name; ``strip_prefix``
takes it off (and ``add_prefix`` puts another on) so that the export's names are those of the
folder the model was loaded from. An EMA weight keeps ``ema.`` in front of its mapped parameter
name. Two tensors that would get one name are an error, raised before anything is written.
"""
import io
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np

from .hf_folder import companion_files, copy_companion_files
from .hf_index import group_into_shards, index_json, parse_size, write_index, shard_file_name
from .naming import prefix_mapper
from .readers import FORMATS
from .writers import SafetensorsWriter, TensorEntry, stream_checkpoint

__all__ = ["EXPORT_DTYPES", "check_dtype", "check_max_shard_size", "check_export_path", "check_export_target",
           "cast_tensor", "export_names", "check_copy_files_from", "ExportPlan", "plan_export", "write_export"]

_logger = logging.getLogger(__name__)
_EMA = "ema."

# Importing mindspore (readers does) registers numpy's "bfloat16".
EXPORT_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype("bfloat16")}
_FLOATS = (np.dtype(np.float16), np.dtype("bfloat16"), np.dtype(np.float32), np.dtype(np.float64))


def check_dtype(dtype, caller: str) -> Optional[np.dtype]:
    """The numpy dtype floating tensors are exported in, or None to keep each tensor's own.

    Args:
        dtype: None, ``"fp32"``, ``"fp16"``, ``"bf16"``, or ``mindspore.float32`` / ``float16`` /
            ``bfloat16``.
        caller: the public function, named in the error.

    Raises:
        ValueError: any other value, naming ``caller``, the argument ``dtype`` and the value.
    """
    if dtype is None:
        return None
    if isinstance(dtype, str) and dtype in EXPORT_DTYPES:
        return EXPORT_DTYPES[dtype]
    if isinstance(dtype, ms.dtype.Type):
        for key, ms_dtype in (("fp32", ms.float32), ("fp16", ms.float16), ("bf16", ms.bfloat16)):
            if dtype == ms_dtype:
                return EXPORT_DTYPES[key]
    raise ValueError(f"For '{caller}', the argument 'dtype' must be one of {list(EXPORT_DTYPES)} or None, "
                     f"but got {dtype!r}.")


def check_max_shard_size(max_shard_size, caller: str) -> Optional[int]:
    """None, or ``max_shard_size`` in bytes (``hf_index.parse_size``; ValueError naming the value)."""
    return None if max_shard_size is None else parse_size(max_shard_size, caller, "max_shard_size")


def check_export_path(path: str, sharded: bool, caller: str, arg: str = "path") -> str:
    """The format of the export at ``path``: ``.ckpt`` / ``.safetensors`` for one file; a folder
    (no such extension) written as sharded ``safetensors`` when ``sharded``. Looks at the name only.

    Raises:
        ValueError: naming ``caller``, ``arg`` and the value.
    """
    ext = os.path.splitext(os.path.normpath(path))[1].lstrip(".")
    if sharded:
        if ext in FORMATS:
            raise ValueError(f"For '{caller}', the argument '{arg}' must be a folder (no '.ckpt' or '.safetensors' "
                             f"extension) when 'max_shard_size' is set, but got {path!r}.")
        return "safetensors"
    if ext not in FORMATS:
        raise ValueError(f"For '{caller}', the argument '{arg}' must end with '.ckpt' or '.safetensors', "
                         f"but got {path!r}.")
    return ext


def check_export_target(path: str, sharded: bool, caller: str, label: str = "argument 'path'") -> None:
    """Check the file system at ``path`` ([Note: export folder]): a file export must not be a folder;
    a sharded export must be absent or an empty folder.

    Args:
        label: what ``path`` is to the caller, named in the error ("argument 'path'").

    Raises:
        ValueError: naming ``caller``, ``label`` and the value.
    """
    if not sharded:
        if os.path.isdir(path):
            raise ValueError(f"For '{caller}', the {label} must be a file path, but {path!r} is a folder.")
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"For '{caller}', the {label} must be a folder when 'max_shard_size' is set, "
                         f"but {path!r} is a file.")
    if os.path.isdir(path) and os.listdir(path):
        raise ValueError(f"For '{caller}', the {label} must be a new or empty folder, but {path!r} "
                         f"holds {len(os.listdir(path))} entries; remove them first.")


def export_names(names: Sequence[str], strip_prefix: Optional[str], add_prefix: Optional[str],
                 caller: str) -> List[str]:
    """The exported name of each of ``names``, in order ([Note: export names]).

    Raises:
        TypeError: a prefix that is neither a str nor None.
        ValueError: two names that would be exported under one, naming ``caller``, the prefixes and
            both names.
    """
    mapper = prefix_mapper(strip_prefix, add_prefix, caller)
    out, taken = [], {}
    for name in names:
        new = _EMA + mapper(name[len(_EMA):]) if name.startswith(_EMA) else mapper(name)
        if new in taken:
            raise ValueError(f"For '{caller}', the arguments 'strip_prefix' ({strip_prefix!r}) and 'add_prefix' "
                             f"({add_prefix!r}) would export both {taken[new]!r} and {name!r} as {new!r}.")
        taken[new] = name
        out.append(new)
    return out


def check_copy_files_from(copy_files_from, sharded: bool, caller: str, look: bool = True) -> List[str]:
    """The files an export copies from ``copy_files_from`` ([Note: companion files] in hf_folder.py):
    none for None. With ``look`` False only the arguments are checked (the ranks that do not write
    do not look at the file system) and the result is empty.

    Raises:
        TypeError / ValueError: naming ``caller``, the argument ``copy_files_from`` and the value: not
            a path, not an existing folder, or given without ``max_shard_size`` (a one-file export
            has no folder to copy into).
    """
    if copy_files_from is None:
        return []
    if not sharded:
        raise ValueError(f"For '{caller}', the argument 'copy_files_from' needs 'max_shard_size' (an export into a "
                         f"folder), but got copy_files_from={copy_files_from!r} with max_shard_size=None.")
    if not isinstance(copy_files_from, (str, os.PathLike)) or not os.fspath(copy_files_from):
        raise TypeError(f"For '{caller}', the argument 'copy_files_from' must be a folder path or None, but got "
                        f"{copy_files_from!r}.")
    return companion_files(copy_files_from, caller) if look else []


def out_dtype(dtype, target: Optional[np.dtype]):
    """The exported dtype of a tensor held as ``dtype``: ``target`` for floating tensors."""
    if target is None or dtype is str or np.dtype(dtype) not in _FLOATS:
        return dtype
    return target


def cast_tensor(value, target: Optional[np.dtype]):
    """``value`` in ``out_dtype(value.dtype, target)`` (numpy's rounding: to nearest, ties to even);
    strings and non-floating tensors unchanged, and no copy when the dtype already matches."""
    if isinstance(value, str):
        return value
    return value.astype(out_dtype(value.dtype, target), copy=False)


@dataclass
class ExportPlan:
    """The files of an export: ``files`` holds (file name or None for ``path`` itself, its entries);
    ``order`` is the order of ``produce`` calls ([Note: export order])."""

    fmt: str
    sharded: bool
    files: List[Tuple[Optional[str], List[TensorEntry]]]
    order: List[str]
    total_size: int


def _nbytes(entry: TensorEntry) -> int:
    dtype = entry[2]
    return 0 if dtype is str else int(np.prod(entry[1], dtype=np.int64)) * np.dtype(dtype).itemsize


def _write_order(fmt: str, entries: Sequence[TensorEntry]) -> List[str]:
    if fmt == "safetensors":  # the header alone fixes the order; written to memory, it is a few bytes per tensor
        return SafetensorsWriter(io.BytesIO(), entries).write_order
    return [e[0] for e in entries]


def plan_export(entries: Sequence[TensorEntry], fmt: str, target: Optional[np.dtype],
                max_shard_size: Optional[int]) -> ExportPlan:
    """The plan of an export of ``entries`` (as held: name, full shape, dtype), their floating
    tensors in ``target``; sharded ([Note: sharded layout]) when ``max_shard_size`` is set.

    Raises:
        ValueError: a dtype the format cannot store.
    """
    entries = [(name, tuple(shape), out_dtype(dtype, target)) for name, shape, dtype in entries]
    total = sum(_nbytes(e) for e in entries)
    if max_shard_size is None:
        return ExportPlan(fmt, False, [(None, entries)], _write_order(fmt, entries), total)
    by_name = dict((e[0], e) for e in entries)
    groups = group_into_shards([(e[0], _nbytes(e)) for e in entries], max_shard_size)
    files = [(shard_file_name(k + 1, len(groups)), [by_name[n] for n in names]) for k, names in enumerate(groups)]
    order = [name for _, file_entries in files for name in _write_order("safetensors", file_entries)]
    return ExportPlan("safetensors", True, files, order, total)


def write_export(path: str, plan: ExportPlan, produce: Callable, on_written: Optional[Callable] = None,
                 copy_files: Sequence[str] = ()) -> str:
    """Write ``plan`` at ``path``, calling ``produce(name)`` once per tensor in ``plan.order``; each
    value is written and dropped before the next call. Not collective.

    Args:
        path: the file, or (sharded) the folder ([Note: export folder]); parent folders are created.
        plan: from ``plan_export``.
        produce: name -> numpy array in the planned dtype and shape (or ``str``, ``.ckpt`` only).
        on_written: called as ``on_written(name)`` after each tensor.
        copy_files: sharded only, files copied as they are into the folder
            (``hf_folder.companion_files``); their names are logged (INFO).

    Returns:
        ``path``.

    Raises:
        Exception: whatever ``produce`` or the file system raises (also when a sharded ``path``
            is not empty when the folder is moved into place); nothing is then left at ``path``
            that was not there before, and no temporary file or folder remains.
    """
    folder = os.path.normpath(os.path.abspath(path))  # a trailing "/" would make the final rename fail
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    if not plan.sharded:
        return stream_checkpoint(path, plan.fmt, plan.files[0][1], produce, on_written)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.", suffix=".tmp", dir=parent)
    try:
        for file_name, entries in plan.files:
            stream_checkpoint(os.path.join(tmp, file_name), "safetensors", entries, produce, on_written)
        write_index(tmp, index_json([[e[0] for e in entries] for _, entries in plan.files], plan.total_size))
        copied = copy_companion_files(copy_files, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's folder is private; the export is an ordinary folder
        os.replace(tmp, folder)  # onto an absent or empty folder only (rename(2))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if copy_files:
        _logger.info("Copied %d file(s) from %s into the export %s: %s.", len(copied),
                     os.path.dirname(copy_files[0]), path, ", ".join(copied))
    return path
