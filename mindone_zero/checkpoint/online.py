"""Online combine: the full (unpadded) parameters of a ZeRO train network, gathered from the
ranks, in memory or written as one inference checkpoint. Collective over the world.
"""
from typing import Dict

import numpy as np

from ..core.comm import eager_mode
from .atomic import atomic_save_checkpoint
from .layout import build_layout, world_and_rank
from .naming import check_dir
from .readers import FORMATS, format_of_path
from .resume import _agree, _attempt, _check_train_net

__all__ = ["gather_full_params", "save_full_checkpoint"]


def gather_full_params(train_net, rank0_only: bool = False, include_ema: bool = False) -> Dict[str, np.ndarray]:
    """Full, unpadded tensors of ``train_net``'s network (and EMA) on every rank, or on rank 0 only.

    Collective over the world (every rank must call it): sharded tensors (network parameters at
    stage 3, EMA weights at stages >= 1) are all-gathered over the optimizer parallel group one
    at a time, eagerly (PYNATIVE for the call, the previous mode restored). Whole tensors are
    copied. Peak extra memory on a rank is the returned dict plus one padded tensor.

    Args:
        train_net (TrainOneStepWrapper): from ``prepare_train_network``.
        rank0_only (bool): other ranks take part in the gathers but return ``{}``.
        include_ema (bool): add the EMA weights under their names ``ema.<param name>``.

    Returns:
        dict: parameter name -> numpy array, in the network's order, then the EMA's.

    Raises:
        TypeError: ``train_net`` is not a TrainOneStepWrapper.
        ValueError: ``include_ema`` is True but ``train_net`` has no EMA.
    """
    caller = "gather_full_params"
    _check_train_net(train_net, caller)
    if include_ema and train_net.ema is None:
        raise ValueError(f"For '{caller}', the argument 'include_ema' is True, but 'train_net' has no EMA.")
    layout = build_layout(train_net, caller)
    items = layout.items["network"]
    if include_ema:  # the EMA weights, not a scratch swap cache the EMA may keep beside them
        weights = {id(e) for e in train_net.ema.ema_weight}
        items = items + [it for it in layout.items["ema"] if id(it.param) in weights]
    keep = not rank0_only or layout.rank == 0
    out = {}
    with eager_mode():
        for it in items:
            if it.held.split and layout.op_size > 1:
                value = train_net.zero_helper.op_comm.all_gather(it.param).asnumpy()[:it.held.shape[0]]
            else:
                value = it.param.asnumpy()
            if keep:
                out[it.param.name] = value
    return out


def save_full_checkpoint(train_net, path, include_ema: bool = False) -> str:
    """Gather the full network (and EMA) and write one inference checkpoint at ``path`` (rank 0).

    Collective (every rank must call it; it returns when the file exists). The file is written
    atomically by global rank 0 with ``atomic_save_checkpoint``; its names are the network's, so
    ``mindspore.load_param_into_net`` loads it into the unsharded network.

    Args:
        train_net (TrainOneStepWrapper): from ``prepare_train_network``.
        path (str): destination ending with ``.ckpt`` or ``.safetensors``.
        include_ema (bool): also store the EMA weights (``ema.<param name>``).

    Returns:
        str: ``path``.

    Raises:
        ValueError: ``path`` has another extension; ``include_ema`` without an EMA.
        RuntimeError / OSError: writing failed (on rank 0, or reported by it).
    """
    caller = "save_full_checkpoint"
    _check_train_net(train_net, caller)
    path = check_dir(path, caller, "path")
    if not path.endswith(tuple("." + f for f in FORMATS)):
        raise ValueError(f"For '{caller}', the argument 'path' must end with '.ckpt' or '.safetensors', but got {path!r}.")
    full = gather_full_params(train_net, rank0_only=True, include_ema=include_ema)
    error = None
    if world_and_rank()[1] == 0:
        _, error = _attempt(lambda: atomic_save_checkpoint(full, path, format_of_path(path)))
    _agree(train_net, error, caller)
    return path
