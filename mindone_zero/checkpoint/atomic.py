"""Atomic checkpoint files: a checkpoint appears under its final name only once it is complete
([Note: atomic files] in ``core/atomic_files.py``). Not collective; no communication.
"""
import os
import shutil
import tempfile
from typing import Optional, Tuple

import mindspore as ms
import numpy as np

from .readers import FORMATS, format_of_path

__all__ = ["atomic_save_checkpoint"]


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
        raise TypeError(f"For 'atomic_save_checkpoint', the argument 'params' must be a dict or a list, but got "
                        f"{type(params).__name__}.")
    tensors, strings, seen = [], {}, set()
    for name, value in items:
        if not isinstance(name, str) or name in seen:
            raise ValueError(f"For 'atomic_save_checkpoint', every name must be a unique string, but got {name!r} "
                             f"twice or as a non-string.")
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
        raise TypeError(f"For 'atomic_save_checkpoint', safetensors cannot store strings, but got {sorted(strings)} "
                        f"for {path!r}.")
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
