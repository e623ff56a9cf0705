"""Exponential moving average of a network's weights, shardable with ZeRO; any EMA with
MindOne's interface is accepted.

``EMA`` behaves like MindOne's (same constructor, ``ema_update``, ``swap_before_eval``,
``swap_after_eval``, weights named ``ema.<param name>``, decay warmed up as
``ema_decay * (1 - exp(-updates / 2000))``).

[Note: EMA interface]
``prepare_train_network`` takes ``ema`` from any class, MindOne's ``mindone.trainers.ema.EMA``
and a user's own included, when it is an ``nn.Cell`` with:

* ``net_weight``: the network Parameters it averages (a ParameterTuple);
* ``ema_weight``: one EMA Parameter per weight, shaped like it (a ParameterTuple);
* ``updates``: a Parameter counting updates (``updates=`` of ``prepare_train_network`` sets it);
* ``ema_update()``: ``ema_weight[i] <- d * ema_weight[i] + (1 - d) * net_weight[i]`` for every
  i, runnable inside the train step's graph (it is called once per optimizer step);
* ``swap_before_eval()`` and ``swap_after_eval()``.

[Note: ZeRO EMA]
At stages >= 1, ``bind_ema_to_zero`` makes each rank keep only the EMA of the shard its optimizer
updates, so the EMA costs 1/N memory like the other model states: each EMA weight of a sharded
parameter is cut to this rank's padded block (and so is an aligned ``swap_cache``, as MindOne
keeps one), and ``net_weight`` is re-pointed at what the optimizer updates (the fp32 master
shards at stages 1-2, the parameter shards themselves at stage 3), so the EMA's own
``ema_update`` averages shards. The network's Parameters are remembered for evaluation:
``swap_before_eval`` puts the EMA into them (all-gathering the shards at stages 1-2, where the
network holds whole weights) and ``swap_after_eval`` puts the trained weights back exactly. A
foreign EMA gets these two methods through a subclass made for it (``isinstance`` still holds,
its other methods are unchanged); below stage 1 nothing is changed.
"""
from dataclasses import dataclass, field
from typing import List, Optional

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from .comm import eager_mode
from .partition import ShardSpec, split_array

__all__ = ["EMA", "check_ema", "bind_ema_to_zero", "ema_entries", "EMA_ATTRIBUTES", "EMA_METHODS"]

_WARMUP = 2000.0
EMA_ATTRIBUTES = ("net_weight", "ema_weight", "updates")
EMA_METHODS = ("ema_update", "swap_before_eval", "swap_after_eval")


def check_ema(ema, where: str) -> None:
    """Raise unless ``ema`` has the interface of [Note: EMA interface].

    Raises:
        TypeError: ``ema`` is not a Cell, or lacks an attribute or method (all are named).
        ValueError: ``net_weight`` and ``ema_weight`` differ in length.
    """
    if not isinstance(ema, nn.Cell):
        raise TypeError(
            f"For '{where}', the argument 'ema' must be an nn.Cell with MindOne's EMA interface "
            f"({', '.join(EMA_ATTRIBUTES + EMA_METHODS)}), but got {type(ema).__name__}."
        )
    missing = [a for a in EMA_ATTRIBUTES if getattr(ema, a, None) is None]
    missing += [m + "()" for m in EMA_METHODS if not callable(getattr(ema, m, None))]
    if missing:
        raise TypeError(
            f"For '{where}', the argument 'ema' must have MindOne's EMA interface, but {type(ema).__name__} "
            f"lacks {missing}."
        )
    if len(ema.net_weight) != len(ema.ema_weight):
        raise ValueError(
            f"For '{where}', the argument 'ema' must hold one 'ema_weight' per 'net_weight', but got "
            f"{len(ema.ema_weight)} and {len(ema.net_weight)}."
        )


@dataclass
class _ZeroBinding:
    """How a ZeRO-bound EMA maps to the network (see [Note: ZeRO EMA])."""

    network_weight: List[Parameter]  # the network's Parameters, in EMA order
    split: List[bool]  # the EMA weight is a shard
    gather: List[bool]  # swapping it into the network needs an all-gather (stages 1-2)
    rows: List[int]  # full dim 0 of each weight
    comm: Optional[object]  # GroupComm of the optimizer parallel group
    cache: list = field(default_factory=list)


def _binding(ema) -> Optional[_ZeroBinding]:
    return ema.__dict__.get("_zero_binding")


def _aligned_swap_cache(ema, n: int) -> Optional[list]:
    """MindOne's EMA keeps ``swap_cache``, one Parameter per weight; ours keeps none."""
    caches = getattr(ema, "swap_cache", None)
    if isinstance(caches, ParameterTuple) and len(caches) == n:
        return list(caches)
    return None


def ema_entries(ema):
    """(network Parameter, held Parameter, held is a ZeRO shard) for every Parameter the EMA
    holds per weight: its EMA weights, then an aligned ``swap_cache``."""
    binding = _binding(ema)
    network = list(ema.net_weight) if binding is None else binding.network_weight
    split = [False] * len(network) if binding is None else binding.split
    caches = _aligned_swap_cache(ema, len(network)) or []
    out = list(zip(network, ema.ema_weight, split))
    return out + list(zip(network, caches, split))


def _cut(param: Parameter, spec: ShardSpec) -> None:
    if tuple(param.shape) != spec.shard_shape:  # built after sharding: already a block
        param.set_data(Tensor(split_array(param.asnumpy(), spec.group_size, spec.rank), param.dtype))


def bind_ema_to_zero(ema, zero_helper) -> List[ShardSpec]:
    """Shard ``ema`` like ``zero_helper``'s optimizer ([Note: ZeRO EMA]); not collective.

    Call once, before the train network is compiled, at stages >= 1.

    Returns:
        The split-info entries of the EMA weights (and of an aligned ``swap_cache``).

    Raises:
        ValueError: an EMA weight is shaped neither like its parameter nor like its shard.
    """
    network = list(ema.net_weight)
    caches = _aligned_swap_cache(ema, len(network))
    by_id = {id(p): i for i, p in enumerate(zero_helper.params)}
    n, r = max(zero_helper.op_size, 1), zero_helper.op_rank
    sources, specs, split, gather, rows = [], [], [], [], []
    for k, (w, e) in enumerate(zip(network, ema.ema_weight)):
        i = by_id.get(id(w))
        spec = zero_helper.specs[i] if i is not None else None
        full = tuple(spec.shape) if spec is not None else tuple(w.shape)
        if tuple(e.shape) not in (full, tuple(w.shape)):
            raise ValueError(
                f"For 'prepare_train_network', the argument 'ema' holds '{e.name}' of shape {tuple(e.shape)} "
                f"for parameter '{w.name}' of shape {full}."
            )
        is_split = spec is not None and spec.split
        entries = [e] + ([caches[k]] if caches is not None else [])
        for p in entries:
            if is_split:
                _cut(p, spec)
            specs.append(ShardSpec(p.name, full, n, r, is_split))
        sources.append(zero_helper.opt_params[i] if is_split else w)
        split.append(is_split)
        gather.append(is_split and not zero_helper.policy.shards_params)
        rows.append(full[0] if full else 0)
    comm = getattr(zero_helper, "op_comm", None)
    ema.net_weight = ParameterTuple(sources)
    ema.__dict__["_zero_binding"] = _ZeroBinding(network, split, gather, rows, comm)
    if not isinstance(ema, _ZeroSwap):
        cls = type(ema)
        ema.__class__ = type(cls.__name__, (_ZeroSwap, cls), {"__module__": cls.__module__})
    return specs


def _swap_in(ema, binding: _ZeroBinding) -> None:
    binding.cache = [w.asnumpy().copy() for w in binding.network_weight]
    with eager_mode():
        for w, e, gather, rows in zip(binding.network_weight, ema.ema_weight, binding.gather, binding.rows):
            value = binding.comm.all_gather(e).asnumpy()[:rows] if gather else e.asnumpy()
            w.set_data(Tensor(value, w.dtype))


def _swap_out(binding: _ZeroBinding) -> None:
    if not binding.cache:
        raise RuntimeError("For 'EMA', 'swap_after_eval' must follow 'swap_before_eval', but nothing is swapped.")
    for w, cached in zip(binding.network_weight, binding.cache):
        w.set_data(Tensor(cached, w.dtype))
    binding.cache = []


class _ZeroSwap:
    """``swap_before_eval`` / ``swap_after_eval`` of an EMA bound to ZeRO ([Note: ZeRO EMA]).

    ``swap_before_eval`` is collective at stages 1-2 (an all-gather over the optimizer parallel
    group: every rank must call it), local at stage 3; ``swap_after_eval`` is local. Both return
    True. An EMA that is not bound uses its class's own methods.
    """

    def swap_before_eval(self):
        binding = _binding(self)
        if binding is None:
            return super().swap_before_eval()
        _swap_in(self, binding)
        return True

    def swap_after_eval(self):
        binding = _binding(self)
        if binding is None:
            return super().swap_after_eval()
        _swap_out(binding)
        return True


class _PlainSwap:
    """The swap of an EMA holding whole weights: local copies through the host."""

    def swap_before_eval(self):
        self.swap_cache = [w.asnumpy().copy() for w in self.net_weight]
        for w, e in zip(self.net_weight, self.ema_weight):
            w.set_data(Tensor(e.asnumpy(), w.dtype))
        return True

    def swap_after_eval(self):
        for w, cached in zip(self.net_weight, self.swap_cache):
            w.set_data(Tensor(cached, w.dtype))
        self.swap_cache = []
        return True


class EMA(_ZeroSwap, _PlainSwap, nn.Cell):
    """EMA of ``network``'s weights (MindOne's EMA, shardable with ZeRO: [Note: ZeRO EMA]).

    ``swap_before_eval()`` puts the EMA weights into the network and ``swap_after_eval()`` puts the
    trained weights back exactly. Not collective at stages 0 and 3; at stages 1-2
    ``swap_before_eval`` all-gathers the EMA shards and must be called on every rank.

    Args:
        network (nn.Cell): the network whose weights are averaged.
        ema_decay (float): decay in (0, 1).
        updates (int): updates already done (restored on resume); drives the decay warm-up.
        trainable_only (bool): average only trainable parameters.
        offloading (bool): kept for MindOne's signature; swaps always go through the host.

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
        self.ema_decay = float(ema_decay)
        self.updates = Parameter(Tensor(float(updates), ms.float32), name="ema_updates", requires_grad=False)
        self.offloading = offloading
        self.swap_cache = []

    def ema_update(self):
        """One EMA step: ``ema = d * ema + (1 - d) * weight``. Returns the update count."""
        updates = ops.assign_add(self.updates, ops.ones((), ms.float32))
        decay = self.ema_decay * (1.0 - ops.exp(-updates / _WARMUP))
        done = ()
        for i in range(len(self.ema_weight)):
            done += (_ema_assign(decay, self.ema_weight[i], self.net_weight[i]),)
        return ops.depend(updates, done)


def _ema_assign(decay, ema, weight):
    return ops.assign(ema, ema * ops.cast(decay, ema.dtype) + ops.cast(weight, ema.dtype) * ops.cast(1.0 - decay, ema.dtype))
