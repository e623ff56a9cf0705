"""Atomic files: a JSON or a streamed file appears under its final name only once it is
complete. Not collective; no communication.

[Note: atomic files]
Every file is first written under a temporary name in the destination folder and then moved
into place with ``os.replace``, which is atomic on POSIX within one file system. A crash or an
exception therefore leaves either the previous file or the complete new one under the final
name, never a half-written one. On an exception the temporary files are removed; a process
killed outright (SIGKILL, power loss) may leave a hidden ``.{name}.*.tmp`` entry behind, which
is never read by anything here and may be deleted.
"""
import contextlib
import json
import os
import stat
import tempfile
from typing import Any

__all__ = ["atomic_file", "atomic_write_json"]


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "wb", read_only: bool = False, **open_kwargs):
    """A file to write that appears under ``path`` only once complete ([Note: atomic files]): a
    temporary file in ``path``'s folder (which must exist), flushed to disk and renamed into place
    when the block ends, removed when it raises. Not collective.

    Args:
        path: the final name.
        mode: ``open`` mode ("wb", "w").
        read_only: make the file read-only for its owner before the rename.
        open_kwargs: passed to ``open`` (``encoding``).
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the data must be on disk before the name points at it
        if read_only:
            os.chmod(tmp, stat.S_IRUSR)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
