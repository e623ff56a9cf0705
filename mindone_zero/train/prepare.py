"""prepare_train_network / prepare_network / prepare_ema: MindOne's entry points.

Each validates every argument before touching the network, so bad input raises without side
effects: an EMA weight's shape too (``check_ema``). The one check that needs the sharded layout
comes after: an EMA weight of a parameter the optimizer does not update (``bind_ema_to_zero``).
"""
import logging

from mindspore import nn

from ..core.comm import is_data_parallel
from ..core.group_alias import group_argument
from .ema import bind_ema_to_zero, check_ema, ema_entries
from ..zero3.options import AUTO_UNITS, Stage3Options
from ..zero3.shard import shard_with_options
from ..zero3.state import options_of
from .optimizer_states import find_optimizer_states, optimizer_parameters
from ..core.materialize import materialize, restore_initializer
from ..core.partition import check_split_rule_flag, mark_shard_flag, uneven_split_names, zero_spec_of
from ..core.stage import StagePolicy, check_stage
from .train_plan import ZeroOptions
from .train_step import StepSettings, build_train_step
from .zero_helper import ZeroHelper, build_zero

__all__ = ["prepare_train_network", "prepare_network", "prepare_ema"]

_logger = logging.getLogger(__name__)


def prepare_network(network, zero_stage=0, optimizer_parallel_group=None, parallel_modules=None,
                    special_cases_parallel_module=None, reshard_after_forward=True, zeropp=None,
                    gather_units=AUTO_UNITS, pad_uneven_params=False, *, op_group=None):
    """Shard ``network``'s parameters in place for ZeRO-3 (other stages return it unchanged).

    Must run before the network (or anything using its parameters) is compiled, and before
    the optimizer is built if you want the optimizer states created at shard size. Not
    collective (no communication happens until the network runs). Outside
    ``ParallelMode.DATA_PARALLEL`` (one process) nothing is sharded and the network is returned as
    it is.

    Args:
        network (nn.Cell): the network.
        zero_stage (int): 0-3; only 3 changes the network.
        optimizer_parallel_group (str): the group the parameters are sharded over (None: world).
        parallel_modules (dict): ``{Cell class: ZeRO-3 Cell class}`` extending ``PARALLEL_MODULES``
            (exact type match), classes with MindOne's constructor ``(net, zero_stage=0,
            optimizer_parallel_group=None, cell_type=None)`` (``ZeroCell`` on the
            ``parallel_modules`` page). None: ``PARALLEL_MODULES`` alone.
        special_cases_parallel_module (dict): like ``parallel_modules`` but matched with
            ``isinstance`` (subclasses too), after the exact matches, as in MindOne. None: none.
        reshard_after_forward (bool): stage 3 only. True (default, as DeepSpeed and FSDP2): free
            each gathered parameter after its use in forward and gather it again for backward
            (3Φ traffic, peak memory about one layer's weights above the shards); False: keep it
            until its backward (2Φ, the whole model's weights gathered during backward). See
            [Note: reshard after forward] in ``mindone_zero/zero3/reshard.py``.
        zeropp (ZeroPPConfig | dict): stage 3 only, ZeRO++ (None, the default: off): int8 weight
            all-gather (``quantize_weights``), int8 gradient reduce-scatter (``quantize_gradients``),
            backward re-gather in a secondary group (``hpz_group``), ``block_size`` elements per
            scale. See ``ZeroPPConfig``.
        gather_units (str | tuple): stage 3 only, FSDP-style units: a tuple of Cell classes; each
            instance gathers the split parameters of its subtree in one all-gather when its forward
            starts and reduce-scatters their gradients in one (per gather setting); with
            ``reshard_after_forward`` it is the recomputed region. ``"auto"`` (default): the
            network's repeated blocks (the Cells of a ``CellList`` or ``SequentialCell`` of one
            class), falling back to a gather per Cell where they cannot be units or with ``zeropp``
            ([Note: units by default] in ``mindone_zero/zero3/auto_units.py``). None or ``()``:
            each Cell gathers its own. A tuple is not allowed with ``zeropp``. The whole unit is full
            at once: for ``estimate_peak_memory`` the largest layer is the largest unit. See [Note:
            gather units] in ``mindone_zero/zero3/units.py``.
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
            (``zero_stage`` not one of 0-3; ``network`` not a Cell; ``reshard_after_forward`` not a
            bool, an int included; ``zeropp`` not a ``ZeroPPConfig`` or a dict of its fields, or
            hpZ without GRAPH_MODE; ``gather_units`` not a tuple of Cell classes with an instance in
            the network, at stage 3, without ``zeropp``).

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import prepare_network
        >>> net = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4)])
        >>> prepare_network(net, zero_stage=3) is net   # one process: nothing to shard
        True

        On every rank of a data-parallel job, before the optimizer is built
        (tests/dist/test_zero_parity.py runs these calls at stage 3 on 2 and 4 ranks):

        >>> init()
        >>> ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
        ...                              gradients_mean=True)
        >>> loss_net = prepare_network(loss_net, zero_stage=3)
        >>> optimizer = nn.AdamWeightDecay(loss_net.trainable_params(), 1e-4)
        >>> train_net = prepare_train_network(loss_net, optimizer, zero_stage=3)
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
    """Check that ``ema`` has MindOne's EMA interface ([Note: EMA interface] in ema.py); return it.

    Its weights are sharded when the train network is built (``prepare_train_network`` binds it
    to the optimizer's shards at stages >= 1), so this only validates and returns it, keeping
    MindOne's call pattern working. Not collective.

    Args:
        ema (EMA | nn.Cell): ``mindone_zero.EMA``, MindOne's EMA, or any Cell with
            ``ema_update()``, ``swap_before_eval()``, ``swap_after_eval()``, the ``net_weight`` /
            ``ema_weight`` ParameterTuples and an ``updates`` counter.
        zero_stage (int): 0-3 (checked only; the stage used is ``prepare_train_network``'s).
        optimizer_parallel_group (str): accepted for MindOne's signature; the group used is
            ``prepare_train_network``'s.
        op_group (str): MindOne 0.2.0's name for ``optimizer_parallel_group``; give one or the other.

    Returns:
        The same ``ema`` object.

    Raises:
        ValueError: ``zero_stage`` is not one of 0, 1, 2, 3.
        TypeError: naming what ``ema`` lacks, or both group keywords given.

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import EMA, prepare_ema
        >>> net = nn.Dense(4, 2)
        >>> ema = EMA(net, ema_decay=0.999)
        >>> prepare_ema(ema, zero_stage=2) is ema
        True
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
                          gather_units=AUTO_UNITS, pad_uneven_params=False, shard_ema=False, *, op_group=None):
    """Wrap ``network`` (returning the loss) and ``optimizer`` into a ZeRO train step.

    MindOne's ``prepare_train_network``: the same parameters, in the same order, with the same
    defaults, plus ``params_split_info``, the stage-3 options of ``prepare_network``
    (``special_cases_parallel_module``, ``reshard_after_forward``, ``zeropp``, ``gather_units``,
    ``pad_uneven_params``) and ``shard_ema``. The parameters come in three groups: the train step
    (``network`` to ``verbose``, as MindSpore's ``TrainOneStepWithLossScaleCell``), ZeRO
    (``zero_stage`` to ``pad_uneven_params``) and the options of stage 3 only.

    At stage 3 the network is sharded here if ``prepare_network`` (or ``shard_network``) was not
    called before; if it was, the network's options hold: leave these keywords out or pass the
    same values ([Note: stage-3 options] in ``mindone_zero/zero3/options.py``). Afterwards every
    Parameter's ``parallel_optimizer`` says whether this rank holds a shard of it ([Note: split
    rule] in partition.py). Building is not collective; calling the returned wrapper is (every rank
    of the world, every step).

    Args:
        network (nn.Cell): the network returning the loss (for example ``nn.WithLossCell``); its
            inputs are the wrapper's inputs.
        optimizer (nn.Optimizer | mindspore.experimental.optim.Optimizer): built over
            ``network.trainable_params()``; ``mint.optim`` optimizers work too. At stages 1-2 it is
            re-pointed at the fp32 master shards.
        scale_sense (float | Tensor | nn.Cell): the loss scale: a positive number or one-element
            Tensor (static), or an update Cell such as ``nn.DynamicLossScaleUpdateCell``, run once
            per micro-step. 1.0: no scaling.
        ema (EMA): an EMA of the network's weights, updated after each optimizer step; any EMA with
            MindOne's interface ([Note: EMA interface] in ema.py). It is bound to the train network
            ([Note: ZeRO EMA]): whole on every rank at stages 0-2, sharded at stage 3, and its swaps
            work in place ([Note: in-place swaps]). None (default): no EMA.
        updates (int): EMA updates already done (when resuming); sets ``ema.updates``.
        drop_overflow_update (bool): True (default): skip the optimizer step on every rank when any
            micro-step of it overflowed (inf or nan gradients on any rank).
        gradient_accumulation_steps (int): micro-steps (calls) per optimizer step, an integer >= 1;
            the gradients are averaged.
        clip_grad (bool): clip the gradients by the global norm of the full (unsharded) gradient
            before the optimizer step.
        clip_norm (float): the largest global norm kept when ``clip_grad``, > 0.
        verbose (bool): log the configuration (INFO) when the wrapper is built.
        zero_stage (int): 0 (data parallel), 1 (optimizer states sharded), 2 (and gradients) or 3
            (and parameters). Outside ``ParallelMode.DATA_PARALLEL`` a stage above 0 warns and
            runs as stage 0, as MindOne does.
        optimizer_offload (bool | dict): False (default): the optimizer runs on the device.
            ``True`` or ``{"device": "cpu"}``: its states live in host memory and the step runs on
            the host; ``{"device": "nvme", "path": DIR}``: they live in files under ``DIR`` ([Note:
            offload argument] in offload/config.py). Needs an optimizer with a host update
            (``nn.AdamWeightDecay``, ``nn.Adam``, ``nn.Momentum``, ``nn.SGD``); with another
            optimizer it warns and runs without offload, as MindOne does.
        optimizer_parallel_group (str): the group whose ranks share one copy of the model states;
            None (default): the world group. ``create_hybrid_groups`` makes one.
        dp_group (str): the group of the ranks that hold the same shard (hybrid sharding); needed
            when ``optimizer_parallel_group`` is not the world group. None (default): none.
        comm_fusion (dict): MindOne's fusion dict, ``{"allreduce" | "reduce_scatter" | "allgather":
            {"bucket_size": BYTES}}``: the gradient and parameter collectives are sent in buckets
            of that size. None (default): 25 MiB buckets for every kind (MindOne: no fusion);
            ``{}``: one collective per tensor ([Note: buckets] in fusion.py).
        params_split_info (str): the folder where ``params_split_info_{rank}.json`` is written at
            stages >= 1 (MindOne's file, which the offline combine ``convert_checkpoints`` reads).
        shard_ema (bool): shard the EMA at stages 1-2 too (1/N of its memory; its
            ``swap_before_eval`` then all-gathers and is collective).
        pad_uneven_params (bool): split also the parameters whose dim 0 does not divide by the group
            size, zero-padded (stages 1-3; see ``prepare_network``). False: they stay whole,
            MindOne's rule.
        parallel_modules (dict): stage 3 only: ``{Cell class: ZeRO-3 Cell class}`` extending
            ``PARALLEL_MODULES``; see ``prepare_network``.
        special_cases_parallel_module (dict): stage 3 only: like ``parallel_modules``, matched with
            ``isinstance``; see ``prepare_network``.
        reshard_after_forward (bool): stage 3 only: free gathered parameters after their forward use
            (True, default) or keep them until backward; see ``prepare_network``.
        zeropp (ZeroPPConfig | dict): stage 3 only: ZeRO++ (qwZ, qgZ, hpZ); None (default): off. See
            ``ZeroPPConfig``.
        gather_units (str | tuple): stage 3 only: Cell classes whose instances gather their parameters
            in one collective; ``"auto"`` (default): the repeated blocks; None: per Cell. See
            ``prepare_network``.
        op_group (str): MindOne 0.2.0's name for ``optimizer_parallel_group``; give one or the other.

    Returns:
        TrainOneStepWrapper: call it with the network's inputs; returns (loss, overflow, loss_scale).

    Raises:
        TypeError / ValueError: naming the argument and the value, before any work is done (a stage
            not in 0-3, ``network`` not a Cell, an optimizer of another kind, a bad
            ``gradient_accumulation_steps``, ``clip_grad``, ``clip_norm``, ``scale_sense``,
            ``ema``, ``comm_fusion``, ``optimizer_offload``, groups or stage-3 option); a
            ValueError naming the arguments and both values when the network was already sharded
            with other options than the ones given.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from mindone_zero import prepare_train_network
        >>> net = nn.Dense(4, 2)
        >>> loss_net = nn.WithLossCell(net, nn.MSELoss())
        >>> optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
        >>> train_net = prepare_train_network(loss_net, optimizer, zero_stage=0,
        ...                                   clip_grad=True, clip_norm=1.0)
        >>> x = ms.Tensor(np.ones((8, 4), np.float32))
        >>> y = ms.Tensor(np.zeros((8, 2), np.float32))
        >>> loss, overflow, loss_scale = train_net(x, y)
        >>> bool(overflow), float(loss_scale)
        (False, 1.0)

        On every rank of a data-parallel job, stage 3 with accumulation and a dynamic loss scale
        (tests/dist/test_mindone_dropin.py and tests/dist/test_zero_parity.py run these calls):

        >>> init()
        >>> ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
        ...                              gradients_mean=True)
        >>> scale = nn.DynamicLossScaleUpdateCell(2**16, 2, 1000)
        >>> train_net = prepare_train_network(
        ...     loss_net, optimizer, scale_sense=scale, gradient_accumulation_steps=2,
        ...     zero_stage=3)
        >>> loss, overflow, loss_scale = train_net(*batch)
    """
    where = "prepare_train_network"
    optimizer_parallel_group = group_argument(where, optimizer_parallel_group, op_group)
    check_stage(zero_stage, where)
    check_split_rule_flag(where, "shard_ema", shard_ema)
    if not isinstance(network, nn.Cell):
        raise TypeError(f"For '{where}', the argument 'network' must be a Cell, but got {type(network).__name__}.")
    step = StepSettings.check(scale_sense, ema, updates, drop_overflow_update, gradient_accumulation_steps, clip_grad,
                              clip_norm, verbose)
    options = Stage3Options.build(where, zero_stage, optimizer_parallel_group, reshard_after_forward, zeropp,
                                  gather_units, parallel_modules, special_cases_parallel_module, pad_uneven_params)
    zero = ZeroOptions.check(where, optimizer, zero_stage, optimizer_parallel_group, dp_group, optimizer_offload,
                             comm_fusion, options.pad_uneven_params)  # stage 0 without data parallelism
    policy = zero.policy
    sharded = policy.shards_params and any(zero_spec_of(p) is not None for p in network.get_parameters())
    for prepared in options_of(network) if sharded else ():  # [Note: stage-3 options]
        options.check_same_as(where, prepared)
    states = _check_shardable_optimizer(optimizer) if policy.shards_optimizer else None
    if policy.shards_params and not sharded:
        network = shard_with_options(network, optimizer_parallel_group, options)
    elif not policy.shards_params:  # full on every rank; in the network's order ([Note: delayed initialisation])
        for _, param in network.parameters_and_names():
            materialize(param)
            mark_shard_flag(param, False)  # at stage 3 the pass that shards marks them
    parts = build_zero(zero, optimizer, states)  # [Note: train records] in train_plan.py
    helper = ZeroHelper.from_parts(parts, params_split_info)
    _warn_padded(parts.plan)
    if ema is not None:
        entries = bind_ema_to_zero(ema, parts.plan, parts.shards, parts.sync.op_comm, shard_ema)
        if policy.is_zero:
            helper.register_split_entries(entries)
    if policy.is_zero:
        helper.dump_params_split_info()
    train = build_train_step(network, optimizer, step, helper)
    _mark_shard_flags(train)
    for param in train.get_parameters():  # what is still built without data initializes at compile
        restore_initializer(param)
    return train


def _warn_padded(plan) -> None:
    """One warning naming the zero-padded shards ([Note: split rule] in partition.py)."""
    padded = uneven_split_names(plan.specs)
    if padded:
        _logger.warning(
            "ZeRO stage %d with pad_uneven_params=True: %d parameter(s) whose dim 0 does not divide by %d are split "
            "with zero padding: %s. An ops.AllGather of their shards (MindOne's online combine) returns the padding "
            "rows too; use mindone_zero.gather_full_params(train_net) or the offline combine (convert_checkpoints).",
            plan.policy.stage, len(padded), plan.op.size, ", ".join(padded))


def _check_shardable_optimizer(optimizer) -> dict:
    """Find the optimizer's states before anything is sharded, so that one ZeRO cannot shard
    raises here, with nothing modified (ValueError naming the state and why); returns them."""
    shapes = []
    for p in optimizer_parameters(optimizer):
        spec = zero_spec_of(p)
        shapes.append(tuple(spec.shape) if spec is not None else tuple(p.shape))
    return find_optimizer_states(optimizer, shapes)


def _mark_shard_flags(train) -> None:
    """``parallel_optimizer`` of every Parameter the train network built (masters, states,
    accumulators, EMA): whether it is a shard. The network's own were marked when it was laid out."""
    plan, shards = train.zero_plan, train.optimizer_shards
    sharded = set()
    for spec, q in zip(plan.specs, shards.opt_params):
        if spec.split:
            sharded.add(id(q))  # the master shard at stages 1-2, the parameter itself at stage 3
    for values in shards.opt_states.values():
        sharded.update(id(v) for v, spec in zip(values, plan.specs) if spec.split)
    if train.accum_steps > 1 and train.reduce_each_micro_step and plan.policy.is_zero:
        sharded.update(id(a) for a, spec in zip(train.accum_grads, plan.specs) if spec.split)
    if train.ema is not None:
        sharded.update(id(e) for _, e, split in ema_entries(train.ema) if split)
    network_params = {id(p) for p in train.network.get_parameters()}
    for _, p in train.parameters_and_names():
        if id(p) not in network_params:
            mark_shard_flag(p, id(p) in sharded)
