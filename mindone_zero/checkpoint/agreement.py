"""Every rank raises, or none: the collective error agreement of the checkpoint functions.

A collective checkpoint call checks and writes on each rank, and a rank that failed must not leave
the others waiting in a collective, nor let them go on as if all went well. So each step runs under
``attempt`` (which catches the exception) and ends with ``agree`` (one all-reduce of one flag per
global rank): the failing rank re-raises its own exception, every other rank raises RuntimeError
naming the failed ranks.
"""
from typing import Optional

import numpy as np
from mindspore import Tensor

from ..core.comm import GroupComm, eager_mode, world_group
from ..train.train_step import TrainOneStepWrapper
from .layout import world_and_rank

__all__ = ["attempt", "agree"]

_OWN_COMM = {}


def attempt(fn):
    """(result, None) or (None, the exception ``fn`` raised)."""
    try:
        return fn(), None
    except Exception as err:  # noqa: BLE001 - handed to agree, which re-raises it
        return None, err


def _world_comm(network) -> GroupComm:
    """A train network's world-group Cell, or one of our own (a bare network, or ZeRO running outside
    DATA_PARALLEL, where the gradient synchronization has none but the ranks must still agree)."""
    comm = network.grad_sync.world_comm if isinstance(network, TrainOneStepWrapper) else None
    return comm if comm is not None else _OWN_COMM.setdefault("world", GroupComm(world_group()))


def agree(network, error: Optional[BaseException], caller: str) -> None:
    """Collective over the world: raise on every rank if ``error`` is set on any rank.

    Args:
        network: the train network (its world Cell is used) or any network.
        error: this rank's exception, or None.
        caller: the public function, named in the other ranks' RuntimeError.
    """
    world, rank = world_and_rank()
    failed = [rank] if error is not None else []
    if world > 1:
        flags = np.zeros((world,), np.float32)
        flags[rank] = 1.0 if error is not None else 0.0
        with eager_mode():
            total = _world_comm(network).all_reduce(Tensor(flags)).asnumpy()
        failed = [int(i) for i in np.nonzero(total > 0)[0]]
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"For '{caller}', global rank(s) {failed} failed (see their logs); nothing was changed here.")
