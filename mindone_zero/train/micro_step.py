"""One micro-step of the train step: forward and backward with the loss scale, the gradients
unscaled (and reduced where this stage reduces every micro-step), and the overflow every rank agrees on.

``MicroStep`` is a base of ``TrainOneStepWrapper`` (``train_step.py``), as MindSpore's
``TrainOneStepWithLossScaleCell`` reads: scale, grad, unscale, check, update the loss scale. What
ZeRO changes goes through the step's ``GradSync`` (``grad_sync``: [Note: train records] in
train_plan.py).
"""
import mindspore as ms
from mindspore import nn, ops

from ..core.backend import overflow_uses_float_status
from ..core.graph_tuples import hyper_map
from ..core.run_mode import IN_PYNATIVE
from ..core.scaling import unscaled
from .scale_sense import scale_sense_parameter

__all__ = ["MicroStep"]


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


class MicroStep:
    """The micro-step part of the train step (a base of ``TrainOneStepWrapper``). Reads the step's
    ``weights``, ``grad_sync``, ``reduce_each_micro_step``, ``sharded_params`` and ``summed_by`` (the
    group size the split gradients are still to be divided by: [Note: the group mean in the step] in
    zero3/gather_group.py)."""

    def _build_micro_step(self, network, scale_sense) -> None:
        """The loss-and-gradients function, the loss scale's Parameter (and update Cell) from a
        checked ``scale_sense``, and Ascend's float status where MindSpore reads it."""
        # One forward for the loss and the gradients (GradOperation after a separate forward
        # runs the network twice in PYNATIVE, and at stage 3 gathers every parameter twice).
        self.loss_and_grads = ops.value_and_grad(_ScaledLoss(network), None, self.weights, has_aux=True)
        self.scale_sense, self.loss_scaling_manager = scale_sense_parameter(scale_sense)
        self.float_status = _FloatStatus() if overflow_uses_float_status() else None

    _pynative = IN_PYNATIVE  # [Note: mode property] in core/run_mode.py

    def _micro_step(self, *inputs):
        """(loss, overflow, loss scale, gradients) of one forward and backward: the gradients unscaled
        and, where this stage reduces every micro-step, reduced; ``overflow`` agreed by every rank."""
        scale = self.scale_sense * 1.0  # read the scale before the update cell may change it
        if self.float_status is not None:
            scale = self.float_status.clear(scale)
        (_, loss), grads = self.loss_and_grads(*inputs, scale)
        grads = self._shard_shaped(grads)
        if self.reduce_each_micro_step:  # unscaled in the buckets where it can ([Note: unscale and check in the buckets])
            grads, local = self.grad_sync.reduce_and_check(grads, 1.0 / scale, self.summed_by)
        else:
            grads = unscaled(grads, 1.0 / scale)
            local = self.grad_sync.check(grads)
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
