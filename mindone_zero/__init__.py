"""mindone_zero: MindSpore-native ZeRO with MindOne's API (``mindone.trainers.zero``)."""
from .checkpoint import (convert_checkpoints, gather_full_params, latest_checkpoint, load_full_checkpoint,
                         load_train_state, save_full_checkpoint, save_train_state, transform_checkpoints)
from .train.ema import EMA
from .core.groups import create_hybrid_groups
from .core.materialize import sharded_init
from .memory.estimate import estimate_model_states_memory, estimate_peak_memory
from .train.prepare import prepare_ema, prepare_network, prepare_train_network
from .train.train_step import TrainOneStepWrapper
from .train.zero_helper import ZeroHelper
from .zero3.gathered import gathered_parameters
from .zero3.layers import PARALLEL_MODULES
from .zero3.zeropp import ZeroPPConfig

__all__ = [
    "prepare_train_network",
    "prepare_network",
    "prepare_ema",
    "ZeroHelper",
    "TrainOneStepWrapper",
    "EMA",
    "convert_checkpoints",
    "transform_checkpoints",
    "estimate_model_states_memory",
    "estimate_peak_memory",
    "save_train_state",
    "load_train_state",
    "latest_checkpoint",
    "gather_full_params",
    "save_full_checkpoint",
    "load_full_checkpoint",
    "PARALLEL_MODULES",
    "ZeroPPConfig",
    "create_hybrid_groups",
    "sharded_init",
    "gathered_parameters",
]

