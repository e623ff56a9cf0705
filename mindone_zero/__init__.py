"""mindone_zero: MindSpore-native ZeRO with MindOne's API (``mindone.trainers.zero``)."""
from .checkpoint_io import convert_checkpoints
from .ema import EMA
from .memory import estimate_model_states_memory
from .prepare import prepare_ema, prepare_network, prepare_train_network
from .train_step import TrainOneStepWrapper
from .zero_helper import ZeroHelper

__all__ = [
    "prepare_train_network",
    "prepare_network",
    "prepare_ema",
    "ZeroHelper",
    "TrainOneStepWrapper",
    "EMA",
    "convert_checkpoints",
    "estimate_model_states_memory",
]
