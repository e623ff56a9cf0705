"""Where offloaded optimizer states live: host memory or files, read and written by element range.

No MindSpore and no communication here. Both stores hold float32 tensors by name and offer the
same calls: ``create``, ``read(name, start, stop)`` (a float32 array of that flat range),
``write(name, start, values)``, ``read_all``/``write_all`` (checkpoints), ``close``.

[Note: state files]
``FileStore`` keeps one raw little-endian float32 file per tensor in its own fresh folder and
moves data with ``os.preadv``/``os.pwrite`` at byte offsets into buffers it allocates per call:
no mapping, so only the chunk in flight is resident (page-cache pages of the files are not in the
process's RSS). A failed write (a full disk, say) raises an ``OSError`` naming the file, offset
and folder; the files are then partly updated, which is why they are working state only and a
resume always starts from a checkpoint (``save_train_state`` writes its own files atomically).
``FAULT_HOOK`` (tests only) is called as ``hook(name, offset)`` before every write.
"""
import os
import re
import shutil
import tempfile
import weakref
from typing import Callable, Dict, Optional, Tuple

import numpy as np

__all__ = ["MemoryStore", "FileStore", "FAULT_HOOK", "set_fault_hook"]

_F32 = np.dtype("<f4")
FAULT_HOOK: Optional[Callable[[str, int], None]] = None


def set_fault_hook(hook: Optional[Callable[[str, int], None]]) -> None:
    """Install (or with None remove) the write fault hook of [Note: state files]; tests only."""
    global FAULT_HOOK
    FAULT_HOOK = hook


class MemoryStore:
    """States in host memory (``optimizer_offload=True``); reads return views, no copies."""

    location = "host"

    def __init__(self):
        self.arrays: Dict[str, np.ndarray] = {}

    def create(self, name: str, values: np.ndarray) -> None:
        self.arrays[name] = np.array(values, _F32).reshape(-1)

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        return self.arrays[name][start:stop]

    def write(self, name: str, start: int, values: np.ndarray) -> None:
        view = self.arrays[name][start:start + values.size]
        if not np.may_share_memory(view, values):  # a bounds check; np.shares_memory can be very slow
            view[:] = values

    def read_all(self, name: str) -> np.ndarray:
        return self.arrays[name].copy()

    def write_all(self, name: str, values: np.ndarray) -> None:
        self.arrays[name][:] = np.asarray(values, _F32).reshape(-1)

    def close(self) -> None:
        self.arrays = {}


def _remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


class FileStore:
    """States in files under a fresh folder of ``root`` ([Note: state files]).

    Args:
        root: an existing writable folder (checked by ``OffloadConfig.parse``).
        tag: prefix of this store's folder (``rank{g}_``), so ranks sharing ``root`` never collide.
        chunk_bytes: bytes per tensor moved by ``read_all``/``write_all`` at a time.
        keep_files: leave the folder in place when the store is closed or freed.
    """

    location = "file"

    def __init__(self, root: str, tag: str, chunk_bytes: int, keep_files: bool = False):
        self.folder = tempfile.mkdtemp(prefix=tag, dir=root)
        self.chunk = max(1, chunk_bytes // _F32.itemsize)
        self.files: Dict[str, Tuple[str, int, int]] = {}  # name -> (path, fd, numel)
        self._finalizer = None if keep_files else weakref.finalize(self, _remove, self.folder)

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, f"{len(self.files):05d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.f32")

    def create(self, name: str, values: np.ndarray) -> None:
        flat = np.asarray(values).reshape(-1)
        path = self._path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.files[name] = (path, fd, flat.size)
        for start in range(0, flat.size, self.chunk):
            self.write(name, start, flat[start:start + self.chunk])

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        path, fd, _ = self.files[name]
        out = np.empty(stop - start, _F32)
        view, offset = memoryview(out).cast("B"), start * _F32.itemsize
        while view.nbytes:
            got = os.preadv(fd, [view], offset)
            if got <= 0:
                raise OSError(f"For 'optimizer_offload', the state file '{path}' ended at byte {offset}.")
            view, offset = view[got:], offset + got
        return out

    def write(self, name: str, start: int, values: np.ndarray) -> None:
        path, fd, _ = self.files[name]
        offset = start * _F32.itemsize
        data = np.ascontiguousarray(values, _F32)
        try:
            if FAULT_HOOK is not None:
                FAULT_HOOK(name, offset)
            view = memoryview(data).cast("B")
            while view.nbytes:
                done = os.pwrite(fd, view, offset)
                view, offset = view[done:], offset + done
        except OSError as err:
            raise OSError(
                err.errno, f"For 'optimizer_offload', writing the state file '{path}' at byte {offset} failed "
                f"({err.strerror or err}); the states under '{self.folder}' are now partly updated: resume from "
                f"the last checkpoint (load_train_state)"
            ) from err

    def read_all(self, name: str) -> np.ndarray:
        return self.read(name, 0, self.files[name][2])

    def write_all(self, name: str, values: np.ndarray) -> None:
        flat = np.asarray(values).reshape(-1)
        for start in range(0, flat.size, self.chunk):
            self.write(name, start, flat[start:start + self.chunk])

    def close(self) -> None:
        for _, fd, _ in self.files.values():
            os.close(fd)
        self.files = {}
        if self._finalizer is not None:
            self._finalizer()
