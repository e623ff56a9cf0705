"""TrainOneStepWrapper: loss scale, overflow, gradient accumulation, clipping, EMA, with ZeRO.

``construct`` reads like MindSpore's ``TrainOneStepWithLossScaleCell``: forward and backward,
unscale, reduce (the ZeRO part), overflow and loss scale, then either an optimizer step or an
accumulation. What ZeRO changes is delegated to the ``GradSync`` Cell ([Note: train records] in
train_plan.py): how gradients are reduced, how the global norm is found, and what follows the
optimizer. With ``optimizer_offload`` the step is ``OffloadTrainOneStepWrapper``.

The step's parts are its bases, one module each: the micro-step (``micro_step.py``: forward and
backward with the loss scale, unscale, overflow), gradient accumulation (``accumulation.py``), the
communication plan (``comm_accounting.py``) and the names MindOne's callers read
(``step_names.py``); the loss scale argument is checked in ``scale_sense.py``.
"""
import inspect
import logging
from dataclasses import dataclass

import mindspore as ms
from mindspore import Tensor, nn, ops

from ..core.graph_tuples import hyper_map
from ..core.partition import zero_spec_of
from ..core.scaling import times
from ..zero3.gather_group import sum_grads_in_backward
from .accumulation import GradAccumulation
from .micro_step import MicroStep
from .comm_accounting import StepCommAccounting, network_gathers
from .ema import check_ema
from .scale_sense import check_scale_sense
from .step_names import MindOneStepNames
from .zero_helper import ZeroHelper

__all__ = ["TrainOneStepWrapper", "OffloadTrainOneStepWrapper", "StepSettings", "build_train_step"]

_logger = logging.getLogger(__name__)


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
        if (isinstance(gradient_accumulation_steps, bool) or not isinstance(gradient_accumulation_steps, int)
                or gradient_accumulation_steps < 1):
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
        check_scale_sense(scale_sense)
        return cls(scale_sense, ema, updates, drop_overflow_update, int(gradient_accumulation_steps), clip_grad,
                   float(clip_norm), verbose)


# Per-tensor work runs through hyper_map ([Note: per-tensor maps] in core/graph_tuples.py).

_zeros_like = ops.MultitypeFuncGraph("zeros_like")


@_zeros_like.register("Tensor")
def _zeros_like_tensor(x):
    return ops.zeros_like(x)


class TrainOneStepWrapper(MicroStep, GradAccumulation, StepCommAccounting, MindOneStepNames, nn.Cell):
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
        self.zero_plan, self.optimizer_shards, self.grad_sync = (helper.zero_plan, helper.optimizer_shards,
                                                                 helper.grad_sync)
        policy = self.zero_plan.policy
        self.optimizer = optimizer
        self.weights = self.optimizer_shards.params
        self._build_micro_step(network, settings.scale_sense)
        self.ema = settings.ema
        if self.ema is not None and settings.updates:
            self.ema.updates.set_data(Tensor(float(settings.updates), ms.float32))
        self.drop_overflow_update, self.clip_grad, self.clip_norm = (settings.drop_overflow_update,
                                                                     settings.clip_grad, settings.clip_norm)
        self.accum_steps, self.verbose, self.zero_stage = settings.accum_steps, settings.verbose, policy.stage
        # [Note: gradient reduction] in grad_sync.py: stages 0/1 reduce once per optimizer step.
        self.reduce_each_micro_step = policy.reduce_each_micro_step(self.accum_steps)
        # only a ZeRO-3 network's parameters are shards, whose gradients may come full-shaped (_shard_shaped)
        self.sharded_params = policy.shards_params
        self._gathers = network_gathers(network)  # [Note: comm records] in core/comm_records.py
        # [Note: the group mean in the step] in zero3/gather_group.py: the split gradients' 1/N in the unscale
        self.summed_by = (_take_over_group_mean(network, self._gathers, self.weights, self.zero_plan)
                          if self.sharded_params else None)
        self._comm_plan = self.plan_comm(self.accum_steps)
        self._build_accumulation()
        if self.verbose:
            _logger.info("TrainOneStepWrapper: ZeRO stage %d, accumulation %d, clip_grad %s (%.3g), drop_overflow_update "
                         "%s", self.zero_stage, self.accum_steps, self.clip_grad, self.clip_norm, self.drop_overflow_update)

    def set_train(self, mode=True):
        self.network.set_train(mode)
        return super().set_train(mode)

    def construct(self, *inputs):
        loss, overflow, scale, grads = self._micro_step(*inputs)
        if self.accum_steps == 1:
            loss = ops.depend(loss, self._optimizer_step(grads, overflow))
        else:
            loss = ops.depend(loss, self._accumulate(grads, overflow))
        return loss, overflow, scale

    def _boundary(self, grads, overflow):
        """The optimizer step on the accumulated mean ``grads``, then the buffers emptied."""
        return self._emptied(self._optimizer_step(grads, overflow))

    def _between(self, overflow, step):
        """A micro-step that ends no optimizer step: ``overflow``, after the counter ``step``."""
        return ops.depend(overflow, step)

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
    ``TrainOneStepWrapper(...)`` around a helper with offload builds one.
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


def _take_over_group_mean(network, gathers, weights, plan):
    """The group size N by which the train step divides the split parameters' gradients, which the
    network's gathers then leave summed ([Note: the group mean in the step] in zero3/gather_group.py);
    None where they stay means. Not collective."""
    if not plan.is_parallel:
        return None
    names = [getattr(zero_spec_of(weights[i]), "name", weights[i].name) for i in plan.split_index]
    return sum_grads_in_backward(network, gathers, names) if names else None


def _step_class(helper) -> type:
    """The train step for ``helper``: on the device, or with its optimizer on the host."""
    return TrainOneStepWrapper if helper is None or helper.host_offload is None else OffloadTrainOneStepWrapper
