"""ZeRO-Offload and ZeRO-Infinity: the optimizer step on the host, its states in memory or files."""
from .config import DEFAULT_CHUNK_SIZE, OffloadConfig
from .file_store import FileStore, MemoryStore, set_fault_hook
from .host_optimizer import SUPPORTED, HostRule, StepHyper, host_rule_for
from .host_step import HostOffload, OffloadedState

__all__ = ["OffloadConfig", "DEFAULT_CHUNK_SIZE", "FileStore", "MemoryStore", "set_fault_hook", "SUPPORTED",
           "HostRule", "StepHyper", "host_rule_for", "HostOffload", "OffloadedState"]
