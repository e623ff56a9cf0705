"""mindone_zero: MindSpore-native ZeRO with MindOne's API (``mindone.trainers.zero``)."""
from .checkpoint import (convert_checkpoints, gather_full_params, latest_checkpoint, load_train_state,
                         save_full_checkpoint, save_train_state)
from .ema import EMA
from .groups import create_hybrid_groups
from .memory import estimate_model_states_memory, estimate_peak_memory
from .prepare import prepare_ema, prepare_network, prepare_train_network
from .train_step import TrainOneStepWrapper
from .zero_helper import ZeroHelper
from .zeropp import ZeroPPConfig

__all__ = [
    "prepare_train_network",
    "prepare_network",
    "prepare_ema",
    "ZeroHelper",
    "TrainOneStepWrapper",
    "EMA",
    "convert_checkpoints",
    "estimate_model_states_memory",
    "estimate_peak_memory",
    "save_train_state",
    "load_train_state",
    "latest_checkpoint",
    "gather_full_params",
    "save_full_checkpoint",
    "PARALLEL_MODULES",
    "ZeroPPConfig",
    "create_hybrid_groups",
]


def __getattr__(name):
    # PARALLEL_MODULES is read lazily: parallel_modules imports mindone_zero's submodules, so an
    # import here would fail whenever parallel_modules is imported first (a circular import).
    if name == "PARALLEL_MODULES":
        from parallel_modules import PARALLEL_MODULES

        return PARALLEL_MODULES
    raise AttributeError(f"module 'mindone_zero' has no attribute {name!r}")
