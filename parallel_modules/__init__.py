"""ZeRO-3 Cells and network sharding (mirrors ``mindone.models.modules.parallel``).

``shard_network`` turns a network into its ZeRO-3 form; ``PARALLEL_MODULES`` maps common layers
to the ZeRO-3 Cells below; ``ZeroParamWrapper`` gathers one sharded parameter.
"""
from .layers import PARALLEL_MODULES, Conv1d, Conv2d, Conv3d, Dense, Embedding, Linear
from .param_wrapper import ZeroParamWrapper, shard_parameter
from .shard import shard_network

__all__ = [
    "PARALLEL_MODULES",
    "ZeroParamWrapper",
    "Dense",
    "Linear",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "Embedding",
    "shard_network",
    "shard_parameter",
]
