"""ZeRO-3 Cells and network sharding (mirrors ``mindone.models.modules.parallel``).

``shard_network`` turns a network into its ZeRO-3 form; ``PARALLEL_MODULES`` maps common layers
to the ZeRO-3 Cells below; ``ZeroParamWrapper`` gathers one sharded parameter.
"""
from mindone_zero.zero3.layers import (PARALLEL_MODULES, Conv1d, Conv2d, Conv3d, Dense, Embedding, Linear, Mint_Conv2d,
                                       Mint_Conv3d)
from mindone_zero.zero3.param_wrapper import ZeroParamWrapper, shard_parameter
from mindone_zero.zero3.shard import recomputed_cells, shard_network

__all__ = [
    "PARALLEL_MODULES",
    "ZeroParamWrapper",
    "Dense",
    "Linear",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "Mint_Conv2d",
    "Mint_Conv3d",
    "Embedding",
    "shard_network",
    "recomputed_cells",
    "shard_parameter",
]
