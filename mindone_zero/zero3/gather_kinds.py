"""Which gather Cell a Cell of a sharded network is: questions the passes that read the network ask
of every Cell (``reshard.py`` while it marks recomputation, ``state.py`` when it lists the gathers).
Asking calls nothing else of the package, so these passes need not call back into
``param_wrapper.py``, which built the wrappers earlier in ``shard_network``."""
from mindspore import nn

from .param_wrapper import ZeroParamWrapper

__all__ = ["gathers_split"]


def gathers_split(cell: nn.Cell) -> bool:
    """Whether ``cell`` is a gather wrapper that all-gathers (a split parameter over 2+ ranks)."""
    record = cell.gather_record if isinstance(cell, ZeroParamWrapper) else None
    return record is not None and record.gathers
