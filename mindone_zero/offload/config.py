"""``optimizer_offload``: the argument, parsed and checked before anything is built.

[Note: offload argument]
``optimizer_offload`` of ``prepare_train_network`` / ``ZeroHelper`` takes:

* ``False`` / ``None``: the optimizer runs on the device (MindOne's default);
* ``True`` or ``{"device": "cpu"}``: ZeRO-Offload; the optimizer states live in host memory and
  the update runs on the host (MindOne's meaning of ``True``);
* ``{"device": "nvme", "path": DIR, "chunk_size": BYTES, "keep_files": False}``: ZeRO-Infinity;
  the optimizer states live in files under ``DIR`` (DeepSpeed's ``nvme_path`` is accepted for
  ``path``) and are updated ``chunk_size`` bytes per state at a time (default 1 MiB:
  docs/benchmarks/offload_chunks.md), so host memory for them stays about one chunk. Each
  rank keeps its files in a fresh folder ``DIR/rank{g}_*``, removed when the train network is
  freed or the process exits, unless ``keep_files`` is True. Those files are working state, not
  checkpoints: ``save_train_state`` saves the states like any others.
"""
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Optional

__all__ = ["OffloadConfig", "DEFAULT_CHUNK_SIZE"]

_logger = logging.getLogger(__name__)

# DeepSpeed's aio block size: the host update's peak growth is about 4 chunks, and larger chunks
# save no time (`tools/bench/benchmark_offload.py --chunk_sweep`); smaller ones only add system calls,
# which a real NVMe drive pays for.
DEFAULT_CHUNK_SIZE = 2 ** 20
_KEYS = ("device", "path", "nvme_path", "chunk_size", "keep_files")


def _bad(where: str, what: str, value) -> ValueError:
    return ValueError(f"For '{where}', the argument 'optimizer_offload' {what}, but got {value!r}.")


@dataclass(frozen=True)
class OffloadConfig:
    """Where the optimizer states live and how the file store is cut ([Note: offload argument])."""

    device: str = "none"  # "none", "cpu" or "nvme"
    path: Optional[str] = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    keep_files: bool = False

    @property
    def enabled(self) -> bool:
        return self.device != "none"

    @classmethod
    def parse(cls, value, where: str = "prepare_train_network", check_path: bool = True) -> "OffloadConfig":
        """Check ``value`` and, for files, that ``path`` is a writable folder (created if missing;
        nothing is left behind when the check fails; with ``check_path`` False the folder is not
        touched, for an offload that will not run). Raises ValueError naming the argument."""
        if value is None or value is False:
            return cls()
        if value is True:
            return cls("cpu")
        if isinstance(value, OffloadConfig):
            return value
        if not isinstance(value, dict):
            raise _bad(where, "must be a bool or a dict such as {'device': 'nvme', 'path': ...}", value)
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise _bad(where, f"has unknown keys {unknown} (allowed: {list(_KEYS)})", value)
        device = value.get("device", "cpu")
        if device not in ("cpu", "nvme"):
            raise _bad(where, "must have 'device' 'cpu' or 'nvme'", value)
        chunk = value.get("chunk_size", DEFAULT_CHUNK_SIZE)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 4:
            raise _bad(where, "must have an integer 'chunk_size' >= 4 (bytes)", value)
        keep = value.get("keep_files", False)
        if not isinstance(keep, bool):
            raise _bad(where, "must have a bool 'keep_files'", value)
        if device == "cpu":
            _warn_ignored_path(value, where)
            return cls("cpu", None, chunk, keep)
        path = value.get("path", value.get("nvme_path"))
        if not isinstance(path, str) or not path:
            raise _bad(where, "with 'device' 'nvme' must have a folder 'path'", value)
        if check_path:
            _check_writable(path, where)
        return cls("nvme", os.path.abspath(path), chunk, keep)


def _warn_ignored_path(value: dict, where: str) -> None:
    # A DeepSpeed user writes {"nvme_path": "/nvme"} and expects files there; without
    # "device": "nvme" the states go to host memory, so say so rather than drop the folder silently.
    given = [key for key in ("path", "nvme_path") if key in value]
    if not given:
        return
    why = "has no 'device', so it means 'cpu'" if "device" not in value else "has 'device' 'cpu'"
    _logger.warning(
        "For '%s', the argument 'optimizer_offload' %s: the optimizer states are kept in host memory and "
        "%s is ignored; set \"device\": \"nvme\" to keep them in files there. Got %r.",
        where, why, " and ".join(f"'{key}' {value[key]!r}" for key in given), value)


def _check_writable(path: str, where: str) -> None:
    created = []
    try:
        head = os.path.abspath(path)
        while not os.path.exists(head):
            created.append(head)
            head = os.path.dirname(head)
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        for folder in created:  # deepest first
            try:
                os.rmdir(folder)
            except OSError:
                pass
        raise ValueError(
            f"For '{where}', the argument 'optimizer_offload' has 'path' {path!r}, which is not a writable "
            f"folder ({type(err).__name__}: {err})."
        ) from err
