"""Exponential moving average of a network's weights, shardable with ZeRO.

Behaves like MindOne's EMA (same constructor, ``ema_update``, ``swap_before_eval``,
``swap_after_eval``, weights named ``ema.<param name>``, decay warmed up as
``ema_decay * (1 - exp(-updates / 2000))``). With ZeRO stages >= 1 each rank keeps only the
EMA of the shard it updates: ``bind_to_zero`` re-points the EMA at the optimizer's shards, so
the EMA costs 1/N memory like the other model states, and ``TrainOneStepWrapper`` calls
``ema_update`` once per optimizer step (never per micro-step).
"""
from typing import List

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from .partition import ShardSpec, split_array

__all__ = ["EMA"]

_WARMUP = 2000.0


class EMA(nn.Cell):
    """EMA of ``network``'s weights.

    Args:
        network (nn.Cell): the network whose weights are averaged.
        ema_decay (float): decay in (0, 1).
        updates (int): updates already done (restored on resume); drives the decay warm-up.
        trainable_only (bool): average only trainable parameters.
        offloading (bool): swap with ``set_data`` on the host instead of in-graph assigns.

    Raises:
        ValueError: ``ema_decay`` outside (0, 1) or ``updates`` < 0.
    """

    def __init__(self, network, ema_decay=0.9999, updates=0, trainable_only=True, offloading=True):
        super().__init__()
        if not 0.0 < float(ema_decay) < 1.0:
            raise ValueError(f"For 'EMA', the argument 'ema_decay' must be in (0, 1), but got {ema_decay!r}.")
        if int(updates) < 0:
            raise ValueError(f"For 'EMA', the argument 'updates' must be >= 0, but got {updates!r}.")
        weights = network.trainable_params() if trainable_only else network.get_parameters()
        self.net_weight = ParameterTuple(list(weights))
        self.ema_weight = self.net_weight.clone(prefix="ema", init="same")
        self.source = self.net_weight  # what is averaged: the weights, or their ZeRO shards
        self.ema_decay = float(ema_decay)
        self.updates = Parameter(Tensor(float(updates), ms.float32), name="ema_updates", requires_grad=False)
        self.offloading = offloading
        self.sharded = False
        self.swap_cache = []

    def bind_to_zero(self, zero_helper) -> List[ShardSpec]:
        """Average the shards that ``zero_helper``'s optimizer updates instead of full weights.

        Slices each EMA weight to its shard (no collective) and returns the split-info entries
        of the EMA weights. Call before the train network is compiled.
        """
        sources, specs = [], []
        by_id = {id(p): i for i, p in enumerate(zero_helper.params)}
        for w, e in zip(self.net_weight, self.ema_weight):
            i = by_id.get(id(w))
            if i is None or not zero_helper.specs[i].split:
                sources.append(w)
                specs.append(ShardSpec(e.name, tuple(e.shape), max(zero_helper.op_size, 1), zero_helper.op_rank, False))
                continue
            spec = zero_helper.specs[i]
            if tuple(e.shape) != spec.shard_shape:
                e.set_data(Tensor(split_array(e.asnumpy(), spec.group_size, spec.rank), e.dtype))
            sources.append(zero_helper.opt_params[i])
            specs.append(ShardSpec(e.name, spec.shape, spec.group_size, spec.rank, True))
            self.sharded = True
        self.source = ParameterTuple(sources)
        return specs

    def ema_update(self):
        """One EMA step: ``ema = d * ema + (1 - d) * weight``. Returns the update count."""
        updates = ops.assign_add(self.updates, ops.ones((), ms.float32))
        decay = self.ema_decay * (1.0 - ops.exp(-updates / _WARMUP))
        done = ()
        for i in range(len(self.ema_weight)):
            done += (_ema_assign(decay, self.ema_weight[i], self.source[i]),)
        return ops.depend(updates, done)

    def _check_swappable(self):
        if self.sharded:
            raise RuntimeError(
                "For 'EMA', the EMA weights are ZeRO shards; gather them with "
                "mindone_zero.checkpoint.gather_full_params before evaluating with them."
            )

    def swap_before_eval(self):
        """Put the EMA weights into the network, keeping the trained ones aside (not collective)."""
        self._check_swappable()
        self.swap_cache = [w.asnumpy().copy() for w in self.net_weight]
        for w, e in zip(self.net_weight, self.ema_weight):
            w.set_data(Tensor(e.asnumpy(), w.dtype))
        return True

    def swap_after_eval(self):
        """Restore the trained weights after ``swap_before_eval`` (not collective)."""
        self._check_swappable()
        for w, cached in zip(self.net_weight, self.swap_cache):
            w.set_data(Tensor(cached, w.dtype))
        self.swap_cache = []
        return True


def _ema_assign(decay, ema, weight):
    return ops.assign(ema, ema * ops.cast(decay, ema.dtype) + ops.cast(weight, ema.dtype) * ops.cast(1.0 - decay, ema.dtype))
