"""prepare_train_network / prepare_network / prepare_ema: MindOne's entry points.

Each validates every argument before touching the network, so bad input raises without side
effects.
"""
import logging

from mindspore import nn

from .comm import check_hybrid_groups, world_group
from .fusion import FusionConfig
from .ema import EMA
from .train_step import TrainOneStepWrapper, _check_step_args
from .zero_helper import ZeroHelper, _check_stage, _is_distributed

__all__ = ["prepare_train_network", "prepare_network", "prepare_ema"]

_logger = logging.getLogger(__name__)


def _check_groups(where, optimizer_parallel_group, dp_group):
    if _is_distributed():
        check_hybrid_groups(where, optimizer_parallel_group or world_group(), dp_group)


def prepare_network(network, zero_stage=0, optimizer_parallel_group=None, parallel_modules=None):
    """Shard ``network``'s parameters in place for ZeRO-3 (other stages return it unchanged).

    Must run before the network (or anything using its parameters) is compiled, and before
    the optimizer is built if you want the optimizer states created at shard size. Not
    collective (no communication happens until the network runs).

    Returns:
        The network (the top Cell itself may have been replaced by its ZeRO-3 version).
    """
    _check_stage(zero_stage, "prepare_network")
    if not isinstance(network, nn.Cell):
        raise TypeError(f"For 'prepare_network', the argument 'network' must be a Cell, but got {type(network).__name__}.")
    if zero_stage != 3 or not _is_distributed():
        if zero_stage == 3:
            _logger.warning("ZeRO stage 3 needs ParallelMode.DATA_PARALLEL; the network is left unsharded.")
        return network
    from parallel_modules import shard_network

    return shard_network(network, group=optimizer_parallel_group, parallel_modules=parallel_modules)


def prepare_ema(ema, zero_stage=0, optimizer_parallel_group=None):
    """Check ``ema`` for ZeRO. Its weights are sharded when the train network is built
    (``prepare_train_network`` binds it to the optimizer's shards at stages >= 1), so this only
    validates and returns it, keeping MindOne's call pattern working."""
    _check_stage(zero_stage, "prepare_ema")
    if not isinstance(ema, EMA):
        raise TypeError(f"For 'prepare_ema', the argument 'ema' must be an EMA, but got {type(ema).__name__}.")
    return ema


def prepare_train_network(network, optimizer, scale_sense=1.0, ema=None, updates=0, drop_overflow_update=True,
                          gradient_accumulation_steps=1, clip_grad=False, clip_norm=1.0, verbose=False,
                          zero_stage=0, optimizer_offload=False, optimizer_parallel_group=None, dp_group=None,
                          comm_fusion=None, parallel_modules=None, params_split_info="params_info"):
    """Wrap ``network`` (returning the loss) and ``optimizer`` into a ZeRO train step.

    Same signature and defaults as MindOne's ``prepare_train_network``, plus
    ``params_split_info`` (folder of the split-info JSON files). At stage 3 the network is
    sharded here if ``prepare_network`` was not called before. Building is not collective;
    calling the returned wrapper is (every rank of the world, every step).

    Returns:
        TrainOneStepWrapper: call it with the network's inputs; returns (loss, overflow, loss_scale).

    Raises:
        TypeError / ValueError: naming the argument and the value, before any work is done.
    """
    _check_stage(zero_stage, "prepare_train_network")
    if not isinstance(network, nn.Cell):
        raise TypeError(
            f"For 'prepare_train_network', the argument 'network' must be a Cell, but got {type(network).__name__}."
        )
    if not isinstance(optimizer, nn.Optimizer):
        raise TypeError(
            f"For 'prepare_train_network', the argument 'optimizer' must be a mindspore.nn.Optimizer, "
            f"but got {type(optimizer).__name__}."
        )
    _check_step_args(gradient_accumulation_steps, clip_grad, clip_norm, ema)
    _check_groups("prepare_train_network", optimizer_parallel_group, dp_group)
    FusionConfig.from_mindone(comm_fusion)
    if zero_stage == 3 and not any(getattr(p, "zero_spec", None) is not None for p in network.get_parameters()):
        network = prepare_network(network, 3, optimizer_parallel_group, parallel_modules)
    helper = ZeroHelper(optimizer, zero_stage, optimizer_parallel_group, dp_group, optimizer_offload,
                        comm_fusion, params_split_info)
    if ema is not None and helper.zero_stage > 0:
        helper.register_split_entries(ema.bind_to_zero(helper))
    return TrainOneStepWrapper(network, optimizer, scale_sense, ema, updates, drop_overflow_update,
                               gradient_accumulation_steps, clip_grad, clip_norm, verbose, helper)
