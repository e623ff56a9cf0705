"""Gradient accumulation in the train step: the buffers, the micro-step counter, the mean at the
last micro-step of an optimizer step, and the buffers emptied after it.

``GradAccumulation`` is a base of ``TrainOneStepWrapper`` (``train_step.py``).
"""
import mindspore as ms
from mindspore import Parameter, Tensor, ops

from ..core.comm import cast_if_needed, divide
from ..core.graph_tuples import hyper_map

__all__ = ["GradAccumulation"]

# Per-tensor work runs through hyper_map ([Note: per-tensor maps] in core/graph_tuples.py).

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
    return ops.assign(x, ops.zeros_like(x))


class GradAccumulation:
    """The accumulation part of the train step. Reads the step's ``accum_steps``,
    ``reduce_each_micro_step``, ``optimizer_shards`` and ``weights``; the step class defines what an
    optimizer-step boundary and a micro-step in between return: ``_boundary(mean_grads, overflow)``
    (the device step runs the optimizer, the host step hands the gradients to the host) and
    ``_between(overflow, step)``."""

    def _build_accumulation(self) -> None:
        """The buffers (``accum_grads``, shaped like what is accumulated: the reduced shards when
        this stage reduces every micro-step, else the parameters), the counter and the overflow flag;
        none without accumulation."""
        if self.accum_steps > 1:
            like = self.optimizer_shards.opt_params if self.reduce_each_micro_step else self.weights
            self.accum_grads = like.clone(prefix="accum_grad", init="zeros")
            self.accum_step = Parameter(Tensor(0, ms.int32), name="accum_step", requires_grad=False)
            self.accum_overflow = Parameter(Tensor(0.0, ms.float32), name="accum_overflow", requires_grad=False)

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

    def _emptied(self, result):
        """``result`` once the accumulation buffers, counter and overflow flag are zero again."""
        result = ops.depend(result, hyper_map(_zeroed, self.accum_grads))
        result = ops.depend(result, ops.assign(self.accum_step, ops.zeros((), ms.int32)))
        return ops.depend(result, ops.assign(self.accum_overflow, ops.zeros((), ms.float32)))
