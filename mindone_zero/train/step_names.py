"""The names that MindOne's and MindSpore's callers read on a train step, over its records.

``MindOneStepNames`` is a base of ``TrainOneStepWrapper`` (``train_step.py``). Each name reads the
step's records (``zero_plan``, ``grad_sync``) and buffers; none is read by the step's own graph.
"""
import mindspore as ms
from mindspore import Tensor

from .scale_sense import positive_scale

__all__ = ["MindOneStepNames"]


class MindOneStepNames:
    """MindOne's (and MindSpore's) public names of the train step (a base of ``TrainOneStepWrapper``)."""

    def set_sense_scale(self, sens):
        """Set the loss scale (a positive float or a one-element Tensor), as MindSpore's
        ``TrainOneStepWithLossScaleCell.set_sense_scale``; a ``loss_scaling_manager`` keeps
        updating it from there. Not collective.

        Args:
            sens (float | Tensor): the new loss scale.

        Raises:
            TypeError / ValueError: ``sens`` is not a positive number or one-element Tensor.
        """
        self.scale_sense.set_data(Tensor(positive_scale(sens), ms.float32))

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
