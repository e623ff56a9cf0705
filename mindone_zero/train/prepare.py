"""prepare_train_network / prepare_network / prepare_ema: MindOne's entry points.

Each validates every argument before touching the network, so bad input raises without side
effects.
"""
import logging

from mindspore import nn

from ..core.comm import check_hybrid_groups, is_data_parallel, world_group
from ..core.group_alias import group_argument
from .ema import bind_ema_to_zero, check_ema, ema_entries
from .fusion import FusionConfig
from ..offload.host_optimizer import offload_for
from ..zero3.options import Stage3Options, options_of
from ..zero3.shard import shard_with_options
from .optimizer_states import check_optimizer, find_optimizer_states, optimizer_parameters
from ..core.materialize import materialize, restore_initializer
from ..core.partition import check_split_rule_flag, mark_shard_flag, uneven_split_names, zero_spec_of
from ..core.stage import StagePolicy, check_stage
from .train_step import TrainOneStepWrapper, _check_step_args
from .zero_helper import ZeroHelper

__all__ = ["prepare_train_network", "prepare_network", "prepare_ema"]

_logger = logging.getLogger(__name__)


def _check_groups(where, optimizer_parallel_group, dp_group):
    if is_data_parallel():
        check_hybrid_groups(where, optimizer_parallel_group or world_group(), dp_group)


def prepare_network(network, zero_stage=0, optimizer_parallel_group=None, parallel_modules=None,
                    special_cases_parallel_module=None, reshard_after_forward=True, zeropp=None, gather_units=None,
                    pad_uneven_params=False, *, op_group=None):
    """Shard ``network``'s parameters in place for ZeRO-3 (other stages return it unchanged).

    Must run before the network (or anything using its parameters) is compiled, and before
    the optimizer is built if you want the optimizer states created at shard size. Not
    collective (no communication happens until the network runs).

    Args:
        network (nn.Cell): the network.
        zero_stage (int): 0-3; only 3 changes the network.
        optimizer_parallel_group (str): the group the parameters are sharded over (None: world).
        parallel_modules (dict): ``{Cell class: ZeRO-3 Cell class}`` extending ``PARALLEL_MODULES``
            (exact type match), classes with MindOne's constructor ``(net, zero_stage=0,
            optimizer_parallel_group=None, cell_type=None)``.
        special_cases_parallel_module (dict): like ``parallel_modules`` but matched with
            ``isinstance`` (subclasses too), after the exact matches, as in MindOne.
        reshard_after_forward (bool): stage 3 only. True (default, as DeepSpeed and FSDP2): free
            each gathered parameter after its use in forward and gather it again for backward
            (3Φ traffic, peak memory about one layer's weights above the shards); False: keep it
            until its backward (2Φ, the whole model's weights gathered during backward). See
            [Note: reshard after forward] in ``mindone_zero/zero3/reshard.py``.
        zeropp (ZeroPPConfig | dict): stage 3 only, ZeRO++ (off by default): int8 weight all-gather
            (``quantize_weights``), int8 gradient reduce-scatter (``quantize_gradients``), backward
            re-gather in a secondary group (``hpz_group``), ``block_size`` elements per scale. See
            ``mindone_zero/zero3/zeropp.py``.
        gather_units (tuple): stage 3 only, FSDP-style units: a tuple of Cell classes; each instance
            gathers the split parameters of its subtree in one all-gather when its forward starts and
            reduce-scatters their gradients in one (per gather setting); with
            ``reshard_after_forward`` it is the recomputed region. None (default): each Cell gathers
            its own. Not with ``zeropp``. The whole unit is then full at once: for
            ``estimate_peak_memory`` the largest layer is the largest unit. See [Note: gather units]
            in ``mindone_zero/zero3/units.py``.
        pad_uneven_params (bool): stage 3 only. False (default, MindOne's rule): a parameter is split
            only when its dim 0 divides by the group size; the others stay whole on every rank and
            their gradients are all-reduced. True: split those too, zero-padded, so per-rank memory
            follows the ZeRO formulas; an ``ops.AllGather`` of such a shard then returns the padding
            rows (use ``gather_full_params`` or the offline combine). [Note: split rule] in
            partition.py.
        op_group (str): MindOne 0.2.0's name for ``optimizer_parallel_group``; give one or the other.

    Returns:
        nn.Cell: the network (the top Cell itself may have been replaced by its ZeRO-3 version); at
            stage 3 it carries these options, which ``prepare_train_network`` then keeps ([Note:
            stage-3 options] in ``mindone_zero/zero3/options.py``).

    Raises:
        TypeError / ValueError: naming the argument and the value, before anything is modified
            (``reshard_after_forward`` must be a bool; an int is not supported; ``zeropp`` as
            ``Stage3Options.build`` says; ``gather_units`` a tuple of Cell classes with an instance in
            the network, at stage 3, without ``zeropp``).
    """
    where = "prepare_network"
    optimizer_parallel_group = group_argument(where, optimizer_parallel_group, op_group)
    check_stage(zero_stage, where)
    options = Stage3Options.build(where, zero_stage, optimizer_parallel_group, reshard_after_forward, zeropp,
                                  gather_units, parallel_modules, special_cases_parallel_module, pad_uneven_params)
    if not isinstance(network, nn.Cell):
        raise TypeError(f"For '{where}', the argument 'network' must be a Cell, but got {type(network).__name__}.")
    if not StagePolicy.of(zero_stage, is_data_parallel(), where).shards_params:
        return network
    return shard_with_options(network, optimizer_parallel_group, options)


def prepare_ema(ema, zero_stage=0, optimizer_parallel_group=None, *, op_group=None):
    """Check that ``ema`` has MindOne's EMA interface ([Note: EMA interface] in ema.py).

    Its weights are sharded when the train network is built (``prepare_train_network`` binds it
    to the optimizer's shards at stages >= 1), so this only validates and returns it, keeping
    MindOne's call pattern working. Not collective.

    Args:
        op_group (str): MindOne 0.2.0's name for ``optimizer_parallel_group``; give one or the other.

    Raises:
        TypeError: naming what ``ema`` lacks, or both group keywords given.
    """
    group_argument("prepare_ema", optimizer_parallel_group, op_group)
    check_stage(zero_stage, "prepare_ema")
    check_ema(ema, "prepare_ema")
    return ema


def prepare_train_network(network, optimizer, scale_sense=1.0, ema=None, updates=0, drop_overflow_update=True,
                          gradient_accumulation_steps=1, clip_grad=False, clip_norm=1.0, verbose=False,
                          zero_stage=0, optimizer_offload=False, optimizer_parallel_group=None, dp_group=None,
                          comm_fusion=None, parallel_modules=None, params_split_info="params_info",
                          special_cases_parallel_module=None, reshard_after_forward=True, zeropp=None,
                          gather_units=None, pad_uneven_params=False, shard_ema=False, *, op_group=None):
    """Wrap ``network`` (returning the loss) and ``optimizer`` into a ZeRO train step.

    Same signature and defaults as MindOne's ``prepare_train_network``, plus
    ``params_split_info`` (folder of the split-info JSON files) and
    ``special_cases_parallel_module``, ``reshard_after_forward``, ``zeropp``, ``gather_units`` and
    ``pad_uneven_params`` (see ``prepare_network``; at stages 1-2 ``pad_uneven_params`` splits the
    optimizer's shards by the same rule), and ``shard_ema``. At stage 3 the network is sharded here
    if ``prepare_network`` (or ``shard_network``) was not called before; if it was, the network's
    options hold: leave these keywords out or pass the same values ([Note: stage-3 options] in
    ``mindone_zero/zero3/options.py``). ``ema`` may be any EMA with MindOne's interface ([Note: EMA
    interface] in ema.py); it is bound to the train network at every stage ([Note: ZeRO EMA]): whole
    on every rank at stages 0-2, sharded at stage 3, and its swaps work in place ([Note: in-place
    swaps]); ``shard_ema=True`` shards it at stages 1-2 too (1/N of its memory; its
    ``swap_before_eval`` is then collective). ``optimizer`` an ``nn.Optimizer`` or a
    ``mindspore.experimental.optim.Optimizer`` (``mint.optim``); ``optimizer_offload`` ``True``,
    ``{"device": "cpu"}`` or ``{"device": "nvme", "path": ...}`` runs the optimizer step on the
    host with its states in host memory or files ([Note: offload argument] in offload/config.py); for
    an optimizer that the host update does not cover, it warns and runs without offload, as MindOne does.
    Afterwards every Parameter's ``parallel_optimizer`` says whether this rank holds a shard of it
    ([Note: split rule] in partition.py). Building is not collective; calling the returned wrapper is (every rank of
    the world, every step).

    Args:
        op_group (str): MindOne 0.2.0's name for ``optimizer_parallel_group``; give one or the other.

    Returns:
        TrainOneStepWrapper: call it with the network's inputs; returns (loss, overflow, loss_scale).

    Raises:
        TypeError / ValueError: naming the argument and the value, before any work is done; a
            ValueError naming the arguments and both values when the network was already sharded
            with other options than the ones given.
    """
    where = "prepare_train_network"
    optimizer_parallel_group = group_argument(where, optimizer_parallel_group, op_group)
    check_stage(zero_stage, where)
    check_split_rule_flag(where, "shard_ema", shard_ema)
    if not isinstance(network, nn.Cell):
        raise TypeError(f"For '{where}', the argument 'network' must be a Cell, but got {type(network).__name__}.")
    check_optimizer(optimizer, where)
    _check_step_args(gradient_accumulation_steps, clip_grad, clip_norm, ema)
    _check_groups(where, optimizer_parallel_group, dp_group)
    options = Stage3Options.build(where, zero_stage, optimizer_parallel_group, reshard_after_forward, zeropp,
                                  gather_units, parallel_modules, special_cases_parallel_module, pad_uneven_params)
    fusion = FusionConfig.from_mindone(comm_fusion, where)
    offload = offload_for(optimizer_offload, optimizer, where)  # [Note: offload argument]
    policy = StagePolicy.of(zero_stage, is_data_parallel(), where)  # stage 0 without data parallelism
    sharded = policy.shards_params and any(zero_spec_of(p) is not None for p in network.get_parameters())
    for prepared in options_of(network) if sharded else ():  # [Note: stage-3 options]
        options.check_same_as(where, prepared)
    if policy.shards_optimizer:
        _check_shardable_optimizer(optimizer)
    if policy.shards_params and not sharded:
        network = shard_with_options(network, optimizer_parallel_group, options)
    elif not policy.shards_params:  # full on every rank; in the network's order ([Note: delayed initialisation])
        for _, param in network.parameters_and_names():
            materialize(param)
    helper = ZeroHelper(optimizer, policy.stage, optimizer_parallel_group, dp_group, offload,
                        fusion, params_split_info, options.pad_uneven_params)
    _warn_padded(helper)
    if ema is not None:
        entries = bind_ema_to_zero(ema, helper, shard_ema)
        if policy.is_zero:
            helper.register_split_entries(entries)
    if policy.is_zero:
        helper.dump_params_split_info()
    train = TrainOneStepWrapper(network, optimizer, scale_sense, ema, updates, drop_overflow_update,
                                gradient_accumulation_steps, clip_grad, clip_norm, verbose, helper)
    _mark_shard_flags(train)
    for param in train.get_parameters():  # what is still built without data initializes at compile
        restore_initializer(param)
    return train


def _warn_padded(helper) -> None:
    """One warning naming the zero-padded shards ([Note: split rule] in partition.py)."""
    padded = uneven_split_names(helper.specs)
    if padded:
        _logger.warning(
            "ZeRO stage %d with pad_uneven_params=True: %d parameter(s) whose dim 0 does not divide by %d are split "
            "with zero padding: %s. An ops.AllGather of their shards (MindOne's online combine) returns the padding "
            "rows too; use mindone_zero.gather_full_params(train_net) or the offline combine (convert_checkpoints).",
            helper.zero_stage, len(padded), helper.op_size, ", ".join(padded))


def _check_shardable_optimizer(optimizer) -> None:
    """Find the optimizer's states before anything is sharded, so that one ZeRO cannot shard
    raises here, with nothing modified (ValueError naming the state and why)."""
    shapes = []
    for p in optimizer_parameters(optimizer):
        spec = zero_spec_of(p)
        shapes.append(tuple(spec.shape) if spec is not None else tuple(p.shape))
    find_optimizer_states(optimizer, shapes)


def _mark_shard_flags(train) -> None:
    """``parallel_optimizer`` of every Parameter the train network holds: whether it is a shard."""
    helper = train.zero_helper
    sharded = set()
    for spec, p, q in zip(helper.specs, helper.params, helper.opt_params):
        if spec.split:
            sharded.add(id(q))  # the master shard at stages 1-2, the parameter itself at stage 3
    for values in helper.opt_states.values():
        sharded.update(id(v) for v, spec in zip(values, helper.specs) if spec.split)
    if train.accum_steps > 1 and train.reduce_each_micro_step and helper.policy.is_zero:
        sharded.update(id(a) for a, spec in zip(train.accum_grads, helper.specs) if spec.split)
    if train.ema is not None:
        sharded.update(id(e) for _, e, split in ema_entries(train.ema) if split)
    for p in train.network.get_parameters():
        spec = zero_spec_of(p)
        if spec is not None and spec.split and helper.policy.shards_params:
            sharded.add(id(p))
    for _, p in train.parameters_and_names():
        mark_shard_flag(p, id(p) in sharded)
