"""TrainOneStepWrapper: loss scale, overflow, gradient accumulation, clipping, EMA, with ZeRO.

``construct`` reads like MindSpore's ``TrainOneStepWithLossScaleCell``: forward and backward,
unscale, reduce (the ZeRO part), overflow and loss scale, then either an optimizer step or an
accumulation. What ZeRO changes is delegated to the ``GradSync`` Cell ([Note: train records] in
train_plan.py): how gradients are reduced, how the global norm is found, and what follows the
optimizer.

With ``optimizer_offload`` the train step is ``OffloadTrainOneStepWrapper``, a subclass whose graph
stops at the reduced gradients and whose ``__call__`` runs the update on the host ([Note: host step]
in offload/host_step.py). ``TrainOneStepWrapper(...)`` around a helper with offload builds one.
"""
import inspect
import logging
from dataclasses import dataclass

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from ..core.backend import overflow_uses_float_status
from ..core.comm import cast_if_needed, divide
from ..core.comm_plan import CommPlan, PlanContext
from ..core.graph_tuples import hyper_map
from ..core.scaling import any_nonfinite, times
from ..core.run_mode import IN_PYNATIVE
from .comm_accounting import network_gathers, param_gathers, step_plan
from .ema import check_ema
from .zero_helper import ZeroHelper

__all__ = ["TrainOneStepWrapper", "OffloadTrainOneStepWrapper", "StepSettings", "build_train_step"]

_logger = logging.getLogger(__name__)


def _check_scale_sense(scale_sense) -> None:
    """Raise unless ``scale_sense`` is a positive number, a one-element Tensor or a loss-scale Cell."""
    if isinstance(scale_sense, nn.Cell):
        if not hasattr(scale_sense, "get_loss_scale"):
            raise TypeError(
                f"For 'TrainOneStepWrapper', the argument 'scale_sense' must be a float, a Tensor or a loss-scale "
                f"update Cell such as nn.DynamicLossScaleUpdateCell, but got {type(scale_sense).__name__}."
            )
    elif isinstance(scale_sense, Tensor):
        if scale_sense.size != 1:
            raise ValueError(
                f"For 'TrainOneStepWrapper', the argument 'scale_sense' must hold one value, but got shape "
                f"{tuple(scale_sense.shape)}."
            )
    elif not (isinstance(scale_sense, (int, float)) and not isinstance(scale_sense, bool) and scale_sense > 0):
        raise ValueError(
            f"For 'TrainOneStepWrapper', the argument 'scale_sense' must be a positive float, a Tensor or a "
            f"loss-scale update Cell, but got {scale_sense!r}."
        )


def _positive_scale(sens) -> float:
    """``set_sense_scale``'s argument as a float; raises TypeError unless it is a positive number or a
    one-element Tensor."""
    value = sens.asnumpy().reshape(-1) if isinstance(sens, Tensor) else None
    if value is not None and value.size == 1:
        sens = float(value[0])
    if isinstance(sens, bool) or not isinstance(sens, (int, float)) or not sens > 0:
        raise TypeError(
            f"For 'set_sense_scale', the argument 'sens' must be a positive float or a one-element Tensor, "
            f"but got {sens!r}."
        )
    return float(sens)


def _scale_sense_parameter(scale_sense):
    """(Parameter holding the loss scale, update Cell or None) from a checked float, Tensor or Cell."""
    if isinstance(scale_sense, nn.Cell):
        return Parameter(Tensor(scale_sense.get_loss_scale(), ms.float32), name="scale_sense"), scale_sense
    if isinstance(scale_sense, Tensor):
        return Parameter(ops.cast(scale_sense.reshape(()), ms.float32), name="scale_sense"), None
    return Parameter(Tensor(float(scale_sense), ms.float32), name="scale_sense"), None


@dataclass(frozen=True, eq=False)
class StepSettings:
    """The train step's own arguments, checked once (``check``); ``prepare_train_network`` builds the
    step from them with ``build_train_step``. Names as ``TrainOneStepWrapper``'s."""

    scale_sense: object = 1.0
    ema: object = None
    updates: int = 0
    drop_overflow_update: bool = True
    accum_steps: int = 1
    clip_grad: bool = False
    clip_norm: float = 1.0
    verbose: bool = False

    @classmethod
    def check(cls, scale_sense=1.0, ema=None, updates=0, drop_overflow_update=True, gradient_accumulation_steps=1,
              clip_grad=False, clip_norm=1.0, verbose=False) -> "StepSettings":
        """The arguments of ``TrainOneStepWrapper`` (in its order), checked. Not collective.

        Raises:
            TypeError / ValueError: naming the argument and the value (see ``TrainOneStepWrapper``).
        """
        if isinstance(gradient_accumulation_steps, bool) or not isinstance(gradient_accumulation_steps, int) \
                or gradient_accumulation_steps < 1:
            raise ValueError(
                f"For 'TrainOneStepWrapper', the argument 'gradient_accumulation_steps' must be an integer >= 1, "
                f"but got {gradient_accumulation_steps!r}."
            )
        if not isinstance(clip_grad, bool):
            raise TypeError(f"For 'TrainOneStepWrapper', the argument 'clip_grad' must be a bool, but got {clip_grad!r}.")
        if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float)) or not clip_norm > 0:
            raise ValueError(f"For 'TrainOneStepWrapper', the argument 'clip_norm' must be > 0, but got {clip_norm!r}.")
        if ema is not None:
            check_ema(ema, "TrainOneStepWrapper")
        _check_scale_sense(scale_sense)
        return cls(scale_sense, ema, updates, drop_overflow_update, int(gradient_accumulation_steps), clip_grad,
                   float(clip_norm), verbose)


class _ScaledLoss(nn.Cell):
    """(loss * scale, loss) of ``network`` on ``inputs[:-1]``, the scale being ``inputs[-1]``;
    the gradient of the first output is that of the loss times the loss scale."""

    def __init__(self, network):
        super().__init__(auto_prefix=False)
        self.network = network

    def construct(self, *inputs):
        loss = self.network(*inputs[:-1])
        return loss * ops.cast(inputs[-1], loss.dtype), loss


# Per-tensor work runs through hyper_map ([Note: per-tensor maps] in core/graph_tuples.py).

_shard_shaped_grad = ops.MultitypeFuncGraph("shard_shaped_grad")


@_shard_shaped_grad.register("Tensor", "Tensor")
def _shard_shaped_tensor(g, weight):
    """``g``, or zeros shaped like ``weight`` where ``g`` has another shape (a static check)."""
    if g.shape == weight.shape:
        return g
    return ops.zeros_like(weight)


_accumulate_into = ops.MultitypeFuncGraph("accumulate_into")


@_accumulate_into.register("Tensor", "Tensor")
def _accumulate_tensor(acc, g):
    return ops.assign_add(acc, cast_if_needed(g, acc.dtype))


_divided = ops.MultitypeFuncGraph("divided")


@_divided.register("Number", "Tensor")
def _divided_tensor(n, x):
    return divide(x, n)  # [Note: Div on CPU] in comm.py


_zeroed = ops.MultitypeFuncGraph("zeroed")


@_zeroed.register("Tensor")
def _zeroed_tensor(x):
    """Sets the Parameter ``x`` to zeros (an assign)."""
    return ops.assign(x, ops.zeros_like(x))


_zeros_like = ops.MultitypeFuncGraph("zeros_like")


@_zeros_like.register("Tensor")
def _zeros_like_tensor(x):
    return ops.zeros_like(x)


class _FloatStatus(nn.Cell):
    """Ascend's float-status register, read as MindSpore's ``TrainOneStepWithLossScaleCell`` reads it
    where ``ops.isfinite`` cannot see an overflow (saturation mode; [Note: device targets] in
    backend.py): cleared before the forward, read after the gradients, cleared again after the
    ranks' agreement so that the all-reduce's own status does not reach the next step."""

    def __init__(self):
        super().__init__(auto_prefix=False)
        from mindspore.ops.operations.math_ops import NPUClearFloatStatusV2, NPUGetFloatStatusV2

        self.get_status = NPUGetFloatStatusV2()
        self.clear_status = NPUClearFloatStatusV2()

    def clear(self, after):
        """Clear the register once ``after`` exists; returns ``after``."""
        status = ops.depend(ops.zeros((8,), ms.int32), after)
        return ops.depend(after, self.clear_status(status))

    def overflowed(self, grads):
        """Whether any operation since the last clear overflowed (a bool, read after ``grads``)."""
        status = ops.depend(ops.zeros((8,), ms.int32), grads)
        return ops.reduce_sum(ops.cast(self.get_status(status), ms.float32)) > 0


class TrainOneStepWrapper(nn.Cell):
    """One training step with ZeRO; returns ``(loss, overflow, loss_scale)`` like MindOne's.

    ``prepare_train_network`` builds it; build it yourself only around a ``ZeroHelper`` of your
    own. ``loss`` is this rank's loss on its micro-batch; ``overflow`` is True on every rank when
    any rank's gradients hold inf/nan at this micro-step (on Ascend in saturation mode, also when
    the float-status register says an operation overflowed: ``_FloatStatus``); ``loss_scale`` is the scale used for
    this micro-step. Calling it is collective over the world group.

    Around a helper with ``optimizer_offload`` (``zero_helper.host_offload``) it is an
    ``OffloadTrainOneStepWrapper``: the same step with the optimizer's update on the host.

    Args:
        network (nn.Cell): returns the loss from the inputs.
        optimizer (nn.Optimizer): the optimizer (re-pointed at shards by ``zero_helper``).
        scale_sense (float | Tensor | nn.Cell): loss scale, or an update Cell such as
            ``nn.DynamicLossScaleUpdateCell``, which is run once per micro-step.
        ema (EMA): updated once per optimizer step (after the optimizer), if given.
        updates (int): EMA updates done so far (restored on resume).
        drop_overflow_update (bool): skip the optimizer step on every rank when any micro-step of
            it overflowed.
        gradient_accumulation_steps (int): micro-steps per optimizer step; gradients are averaged.
        clip_grad (bool): clip by the global norm of the full gradient.
        clip_norm (float): the largest global norm kept when ``clip_grad``, > 0.
        verbose (bool): log the configuration at build time.
        zero_helper (ZeroHelper): the ZeRO machinery; None builds a stage-0 helper.

    Raises:
        TypeError / ValueError: naming the argument and the value: ``gradient_accumulation_steps``
            not an integer >= 1, ``clip_grad`` not a bool, ``clip_norm`` not > 0, ``scale_sense``
            neither a positive number, a one-element Tensor nor a loss-scale Cell, or ``ema``
            without MindOne's EMA interface.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from mindone_zero import TrainOneStepWrapper, ZeroHelper
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
        >>> helper = ZeroHelper(optimizer, zero_stage=0)
        >>> scale = nn.FixedLossScaleUpdateCell(8.0)
        >>> train_net = TrainOneStepWrapper(net, optimizer, scale_sense=scale,
        ...                                 zero_helper=helper)
        >>> x = ms.Tensor(np.ones((8, 4), np.float32))
        >>> y = ms.Tensor(np.zeros((8, 2), np.float32))
        >>> loss, overflow, loss_scale = train_net(x, y)
        >>> bool(overflow), float(loss_scale)
        (False, 8.0)
        >>> train_net.comm_plan.count()   # one process: nothing to communicate
        0
    """

    offload = False  # the optimizer steps in the graph; OffloadTrainOneStepWrapper's on the host

    def __new__(cls, *args, **kwargs):
        # zero_helper is __init__'s eleventh argument; copy.copy calls this with none
        helper = kwargs.get("zero_helper", args[10] if len(args) > 10 else None)
        return super().__new__(_step_class(helper) if cls is TrainOneStepWrapper else cls, *args, **kwargs)

    def __init__(self, network, optimizer, scale_sense=1.0, ema=None, updates=0, drop_overflow_update=True,
                 gradient_accumulation_steps=1, clip_grad=False, clip_norm=1.0, verbose=False, zero_helper=None):
        super().__init__(auto_prefix=False)
        settings = StepSettings.check(scale_sense, ema, updates, drop_overflow_update, gradient_accumulation_steps,
                                      clip_grad, clip_norm, verbose)
        self._build(network, optimizer, settings, zero_helper if zero_helper is not None else ZeroHelper(optimizer, 0))

    def _build(self, network, optimizer, settings: StepSettings, helper) -> None:
        self.network = network
        self.zero_helper = helper
        # the train records ([Note: train records] in train_plan.py): read from here on, never the helper
        self.zero_plan, self.optimizer_shards, self.grad_sync = helper.zero_plan, helper.optimizer_shards, \
            helper.grad_sync
        policy = self.zero_plan.policy
        self.optimizer = optimizer
        self.weights = self.optimizer_shards.params
        # One forward for the loss and the gradients (GradOperation after a separate forward
        # runs the network twice in PYNATIVE, and at stage 3 gathers every parameter twice).
        self.loss_and_grads = ops.value_and_grad(_ScaledLoss(network), None, self.weights, has_aux=True)
        self.scale_sense, self.loss_scaling_manager = _scale_sense_parameter(settings.scale_sense)
        self.float_status = _FloatStatus() if overflow_uses_float_status() else None
        self.ema = settings.ema
        if self.ema is not None and settings.updates:
            self.ema.updates.set_data(Tensor(float(settings.updates), ms.float32))
        self.drop_overflow_update, self.clip_grad, self.clip_norm = settings.drop_overflow_update, settings.clip_grad, \
            settings.clip_norm
        self.accum_steps, self.verbose, self.zero_stage = settings.accum_steps, settings.verbose, policy.stage
        # [Note: gradient reduction] in grad_sync.py: stages 0/1 reduce once per optimizer step.
        self.reduce_each_micro_step = policy.reduce_each_micro_step(self.accum_steps)
        # only a ZeRO-3 network's parameters are shards, whose gradients may come full-shaped (_shard_shaped)
        self.sharded_params = policy.shards_params
        self._gathers = network_gathers(network)  # [Note: comm records] in core/comm_records.py
        self._comm_plan = self.plan_comm(self.accum_steps)
        if self.accum_steps > 1:
            like = self.optimizer_shards.opt_params if self.reduce_each_micro_step else self.weights
            self.accum_grads = like.clone(prefix="accum_grad", init="zeros")
            self.accum_step = Parameter(Tensor(0, ms.int32), name="accum_step", requires_grad=False)
            self.accum_overflow = Parameter(Tensor(0.0, ms.float32), name="accum_overflow", requires_grad=False)
        if self.verbose:
            _logger.info("TrainOneStepWrapper: ZeRO stage %d, accumulation %d, clip_grad %s (%.3g), drop_overflow_update "
                         "%s", self.zero_stage, self.accum_steps, self.clip_grad, self.clip_norm, self.drop_overflow_update)

    # ------------------------------------------------------------ communication accounting
    @property
    def comm_plan(self) -> CommPlan:
        """The collectives of one optimizer step on this rank, as the native path runs them
        (``CommPlan``, built with the wrapper; [Note: comm plan] in core/comm_plan.py)."""
        return self._comm_plan

    def plan_comm(self, micro_steps: int) -> CommPlan:
        """The collectives of one optimizer step of ``micro_steps`` micro-steps on this rank, counted
        from the train records and the network's gathers (train/comm_accounting.py), with gradients
        reduced as this stage reduces them at that accumulation. ``comm_plan`` is this at
        ``gradient_accumulation_steps``. Not collective.

        Args:
            micro_steps (int): forward/backward passes per optimizer step, >= 1.

        Returns:
            CommPlan: one entry per collective.

        Raises:
            ValueError: ``micro_steps`` is not an integer >= 1.
        """
        if isinstance(micro_steps, bool) or not isinstance(micro_steps, int) or micro_steps < 1:
            raise ValueError(f"For 'plan_comm', the argument 'micro_steps' must be an integer >= 1, but got "
                             f"{micro_steps!r}.")
        ctx = PlanContext(micro_steps, self.zero_plan.policy.reduce_each_micro_step(micro_steps), self.clip_grad)
        return step_plan(self.zero_plan.comm_record, self._gathers, ctx)

    def param_gathers(self) -> list:
        """How ZeRO-3 gathers each parameter the optimizer updates, in ``optimizer_shards.params`` order:
        ``{"name", "regathered", "coalesced"}``, ``regathered`` whether backward gathers it again
        ([Note: reshard after forward] in zero3/reshard.py, [Note: dropped re-gathers] in
        zero3/backward_reads.py) and ``coalesced`` the index of the coalesced gather it shares a
        collective with ([Note: coalesced gathers] in zero3/coalesce.py), or None. Parameters the
        network does not shard have False and None. Not collective."""
        return param_gathers(self._gathers, self.optimizer_shards.params, self.zero_plan.specs)

    def set_train(self, mode=True):
        self.network.set_train(mode)
        return super().set_train(mode)

    # ------------------------------------------------ MindOne's (and MindSpore's) public names
    def set_sense_scale(self, sens):
        """Set the loss scale (a positive float or a one-element Tensor), as MindSpore's
        ``TrainOneStepWithLossScaleCell.set_sense_scale``; a ``loss_scaling_manager`` keeps
        updating it from there. Not collective.

        Args:
            sens (float | Tensor): the new loss scale.

        Raises:
            TypeError / ValueError: ``sens`` is not a positive number or one-element Tensor.
        """
        self.scale_sense.set_data(Tensor(_positive_scale(sens), ms.float32))

    def run_optimizer(self, grads):
        """MindOne's name: the optimizer step on reduced ``grads`` (collective at stages 1-2).

        Args:
            grads (tuple): the reduced gradients, shaped like ``optimizer_shards.opt_params``.
        """
        return self.grad_sync.run_optimizer(grads)

    @property
    def grad_reducer(self):
        """MindOne's name: reduces gradients as this ZeRO stage does (collective)."""
        return self.grad_sync.reduce_grads

    @property
    def accumulated_grads(self):
        """MindOne's name of the gradient accumulation buffers (``accum_grads``)."""
        return self.accum_grads if self.accum_steps > 1 else None

    @property
    def cur_accum_step(self):
        """MindOne's name of the micro-step counter (``accum_step``)."""
        return self.accum_step if self.accum_steps > 1 else None

    @property
    def reducer_flag(self):
        """True when gradients are reduced across ranks (ParallelMode.DATA_PARALLEL)."""
        return self.zero_plan.is_parallel

    @property
    def degree(self):
        """Number of data-parallel ranks whose gradients are reduced."""
        return self.zero_plan.op.size * self.zero_plan.dp.size

    @property
    def mean(self):
        """Whether reduced gradients are averaged (stage 0 follows ``gradients_mean``)."""
        return self.zero_plan.grads_mean

    _pynative = IN_PYNATIVE  # [Note: mode property] in core/run_mode.py

    def construct(self, *inputs):
        loss, overflow, scale, grads = self._micro_step(*inputs)
        if self.accum_steps == 1:
            loss = ops.depend(loss, self._optimizer_step(grads, overflow))
        else:
            loss = ops.depend(loss, self._accumulate(grads, overflow))
        return loss, overflow, scale

    def _micro_step(self, *inputs):
        """(loss, overflow, loss scale, gradients) of one forward and backward: the gradients unscaled
        and, where this stage reduces every micro-step, reduced; ``overflow`` agreed by every rank."""
        scale = self.scale_sense * 1.0  # read the scale before the update cell may change it
        if self.float_status is not None:
            scale = self.float_status.clear(scale)
        (_, loss), grads = self.loss_and_grads(*inputs, scale)
        grads = self._shard_shaped(grads)
        if self.reduce_each_micro_step:  # unscaled in the buckets where it can ([Note: unscale and check in the buckets])
            grads, local = self.grad_sync.reduce_and_check(grads, 1.0 / scale)
        else:
            grads = hyper_map(ops.partial(times, 1.0 / scale), grads)
            local = any_nonfinite(grads)
        overflow = self._overflow(grads, local)
        if self.loss_scaling_manager is not None:
            overflow = self.loss_scaling_manager(self.scale_sense, overflow)
        return loss, overflow, scale, grads

    def _overflow(self, grads, local):
        """True on every rank when any rank's gradients overflowed: inf/nan in them (``local``, this
        rank's check), or, where MindSpore reads Ascend's float status (saturation mode), the status
        register. Collective."""
        if self.float_status is None:
            return self.grad_sync.any_rank(local)
        overflow = self.grad_sync.any_rank(ops.logical_or(local, self.float_status.overflowed(grads)))
        return self.float_status.clear(overflow)

    def _shard_shaped(self, grads):
        """PYNATIVE hands a ZeRO-3 parameter that got no gradient this step a zero gradient of
        its full shape; such a gradient is replaced by zeros of the shard's shape (static check).
        Below stage 3 every parameter is whole, and in GRAPH_MODE every gradient has its parameter's
        shape, so the gradients pass as they are: the map is not built ([Note: compile cost] in
        core/graph_tuples.py, [Note: mode property] in core/run_mode.py)."""
        if not self.sharded_params or not self._pynative:
            return grads
        return hyper_map(_shard_shaped_grad, grads, self.weights)

    def _accumulate(self, grads, overflow):
        """Add this micro-step's gradients to the buffers; at the last micro-step of an optimizer
        step, ``_boundary`` of their mean, else ``_between``."""
        done = hyper_map(_accumulate_into, self.accum_grads, grads)
        flag = ops.maximum(self.accum_overflow, ops.cast(overflow, ms.float32))
        done = ops.depend(ops.assign(self.accum_overflow, flag), done)
        step = ops.assign_add(self.accum_step, ops.ones((), ms.int32))
        step = ops.depend(step, done)
        if step >= self.accum_steps:
            mean = hyper_map(ops.partial(_divided, self.accum_steps), self.accum_grads)
            return self._boundary(mean, self.accum_overflow > 0)
        return self._between(overflow, step)

    def _boundary(self, grads, overflow):
        """The optimizer step on the accumulated mean ``grads``, then the buffers emptied."""
        return self._emptied(self._optimizer_step(grads, overflow))

    def _between(self, overflow, step):
        """A micro-step that ends no optimizer step: ``overflow``, after the counter ``step``."""
        return ops.depend(overflow, step)

    def _emptied(self, result):
        """``result`` once the accumulation buffers, counter and overflow flag are zero again."""
        result = ops.depend(result, hyper_map(_zeroed, self.accum_grads))
        result = ops.depend(result, ops.assign(self.accum_step, ops.zeros((), ms.int32)))
        return ops.depend(result, ops.assign(self.accum_overflow, ops.zeros((), ms.float32)))

    def _final_grads(self, grads):
        """Reduce (stages 0/1 with accumulation) and clip: the gradients the optimizer takes."""
        if not self.reduce_each_micro_step:
            grads = self.grad_sync.reduce_grads(grads)
        if self.clip_grad:
            norm = self.grad_sync.global_norm(grads)
            grads = hyper_map(ops.partial(times, self.clip_norm / ops.maximum(norm, self.clip_norm)), grads)
        return grads

    def _optimizer_step(self, grads, overflow):
        """Reduce (stages 0/1 with accumulation), clip, update and EMA; skipped on overflow."""
        grads = self._final_grads(grads)
        if self.drop_overflow_update and overflow:
            return overflow
        result = self.grad_sync.run_optimizer(grads)
        if self.ema is not None:
            result = ops.depend(result, self.ema.ema_update())
        return ops.depend(overflow, result)


# the signature MindOne's callers see is __init__'s (__new__ takes anything, so that copy.copy works)
TrainOneStepWrapper.__signature__ = inspect.Signature(list(inspect.signature(TrainOneStepWrapper.__init__).parameters.values())[1:])


class OffloadTrainOneStepWrapper(TrainOneStepWrapper):
    """``TrainOneStepWrapper`` with ``optimizer_offload``: the optimizer step runs on the host.

    Its graph (``construct``) returns ``(loss, overflow, loss_scale, go, grads)``: the reduced,
    clipped gradients, and ``go`` whether this call ends an optimizer step that is not dropped; then
    ``__call__`` runs the update on the host (``zero_helper.host_offload``), the all-gather and the EMA
    ([Note: host step] in offload/host_step.py), and returns ``(loss, overflow, loss_scale)`` as the
    device step does. Call the wrapper itself, not its ``construct`` from another graph.
    ``TrainOneStepWrapper(...)`` builds one around a helper with offload; the arguments are the same.
    """

    offload = True

    def _build(self, network, optimizer, settings: StepSettings, helper) -> None:
        super()._build(network, optimizer, settings, helper)
        self.host_offload = helper.host_offload
        self.host_offload.bind_after_step(self.ema)
        self._host_call = False  # set by __call__ around the graph call

    def __call__(self, *inputs):
        self._host_call = True
        try:
            loss, overflow, scale, go, grads = super().__call__(*inputs)
        finally:
            self._host_call = False
        if bool(go.asnumpy()):
            grads = list(grads)  # emptied as the host step goes ([Note: host step memory] in offload/host_step.py)
            self.host_offload.step(grads)
        return loss, overflow, scale

    def construct(self, *inputs):
        if not self._host_call:
            # [Note: host step] in offload/host_step.py: the update runs on the host between graphs.
            # Read when the graph is built, so this raises before the first step.
            raise RuntimeError(
                "For 'TrainOneStepWrapper', optimizer_offload runs the optimizer step on the host after the "
                "train graph, so the wrapper must be called directly, not from inside another graph such as "
                "the one ms.Model.train builds with dataset_sink_mode=True; use dataset_sink_mode=False."
            )
        loss, overflow, scale, grads = self._micro_step(*inputs)
        if self.accum_steps == 1:
            go, grads = self._host_grads(grads, overflow)
        else:
            go, grads = self._accumulate(grads, overflow)
        return loss, overflow, scale, go, grads

    def _boundary(self, grads, overflow):
        go, grads = self._host_grads(grads, overflow)
        return self._emptied(go), grads

    def _between(self, overflow, step):
        """Not a step boundary: nothing for the host."""
        return ops.depend(ops.zeros((), ms.bool_), step), hyper_map(_zeros_like, self.grad_sync.opt_params)

    def _host_grads(self, grads, overflow):
        """(whether the host steps, the gradients it takes) at an optimizer-step boundary."""
        grads = self._final_grads(grads)
        go = ops.logical_not(overflow) if self.drop_overflow_update else ops.ones((), ms.bool_)
        return go, grads


def build_train_step(network, optimizer, settings: StepSettings, zero_helper) -> TrainOneStepWrapper:
    """The train step of ``settings`` checked already (``prepare_train_network``'s), around
    ``zero_helper``: nothing is checked again. With ``zero_helper.host_offload``, an
    ``OffloadTrainOneStepWrapper``. Not collective."""
    step = TrainOneStepWrapper.__new__(TrainOneStepWrapper, network, optimizer, zero_helper=zero_helper)
    nn.Cell.__init__(step, auto_prefix=False)
    step._build(network, optimizer, settings, zero_helper)
    return step


def _step_class(helper) -> type:
    """The train step for ``helper``: on the device, or with its optimizer on the host."""
    return TrainOneStepWrapper if helper is None or helper.host_offload is None else OffloadTrainOneStepWrapper
