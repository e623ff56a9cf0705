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
``prepare_train_network`` binds the EMA to the train network at every stage (``bind_ema_to_zero``),
in the layout MindOne's callers observe:

* stages 0-2 (default): the EMA is whole on every rank, like the network's weights, and averages
  the network's Parameters (at stages 1-2, after the post-step all-gather has written the new
  weights into them). Its swaps are local: any subset of ranks may call them, as MindOne's
  ``EvalSaveCallback`` does on rank 0 only.
* stage 3: the network holds shards, so each EMA weight of a split parameter is cut to this rank's
  block (and so is an aligned ``swap_cache``, as MindOne keeps one) and averages that shard. Swaps
  are local here too, on every rank or any subset.
* stages 1-2 with ``shard_ema=True`` (opt-in): each rank keeps only the EMA of the fp32 master
  shard its optimizer updates (``net_weight`` is re-pointed at the master shards), 1/N of the EMA's
  memory. ``swap_before_eval`` then all-gathers the shards and is collective: every rank of the
  optimizer parallel group must call it.

[Note: in-place swaps]
The swaps change the network's Parameters in place (``ops.assign`` of the value into the same
Parameter, run eagerly): ``swap_before_eval`` keeps a host copy of the trained weights and writes
the EMA into them, ``swap_after_eval`` writes the copy back exactly. The Parameter objects, and
the buffers that compiled graphs hold, stay the same. ``param.set_data(new_tensor)``, which
MindOne's EMA and scripts' own EMAs use, installs a new tensor: in PYNATIVE_MODE the optimizer's
jitted step keeps updating the old buffer, so training silently stops after the first swap. A
foreign EMA gets the in-place methods through a subclass made for it (``isinstance`` still holds,
its other methods are unchanged). ``swap_after_eval`` without a ``swap_before_eval`` before it
changes nothing (MindOne's callback calls it so when it saved nothing).
"""
from dataclasses import dataclass, field
from typing import List, Optional

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ..core.comm import eager_mode
from ..core.graph_tuples import hyper_map
from ..core.materialize import host_value, is_unmaterialized, materialize, set_value
from ..core.partition import ShardSpec, split_array, zero_spec_of

__all__ = ["EMA", "check_ema", "bind_ema_to_zero", "ema_entries", "EMA_ATTRIBUTES", "EMA_METHODS"]

_WARMUP = 2000.0
EMA_ATTRIBUTES = ("net_weight", "ema_weight", "updates")
EMA_METHODS = ("ema_update", "swap_before_eval", "swap_after_eval")


def check_ema(ema, where: str) -> None:
    """Raise unless ``ema`` has the interface of [Note: EMA interface].

    Raises:
        TypeError: ``ema`` is not a Cell, or lacks an attribute or method (all are named).
        ValueError: ``net_weight`` and ``ema_weight`` differ in length, or an EMA weight is shaped
            neither like its parameter's full tensor nor like the parameter as it is (a shard).
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
    for w, e in zip(ema.net_weight, ema.ema_weight):  # before anything is sharded: bad input leaves no trace
        spec = zero_spec_of(w)
        full = tuple(spec.shape) if spec is not None else tuple(w.shape)
        if tuple(e.shape) not in (full, tuple(w.shape)):
            raise ValueError(f"For '{where}', the argument 'ema' holds '{e.name}' of shape {tuple(e.shape)} for "
                             f"parameter '{w.name}' of shape {full}.")


@dataclass
class _ZeroBinding:
    """How a bound EMA maps to the network (see [Note: ZeRO EMA])."""

    network_weight: List[Parameter]  # the network's Parameters, in EMA order
    split: List[bool]  # the EMA weight is a shard
    gather: List[bool]  # swapping it into the network needs an all-gather (stages 1-2, shard_ema)
    rows: List[int]  # full dim 0 of each weight
    comm: Optional[object]  # GroupComm of the optimizer parallel group
    cache: list = field(default_factory=list)


def _binding(ema) -> Optional[_ZeroBinding]:
    return ema.__dict__.get("_zero_binding")


def _whole_binding(ema) -> _ZeroBinding:
    network = list(ema.net_weight)
    n = len(network)
    return _ZeroBinding(network, [False] * n, [False] * n, [w.shape[0] if w.shape else 0 for w in network], None)


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


def _copy_of(param: Parameter, source: Parameter, spec: Optional[ShardSpec]) -> None:
    """Give ``param``, an unmaterialized ``clone(init='same')`` of ``source``, the value it would
    have had eagerly: ``source``'s, or its block per ``spec`` ([Note: delayed initialisation])."""
    materialize(source)
    value = host_value(source)
    if spec is not None and tuple(value.shape) != spec.shard_shape:
        value = split_array(value, spec.group_size, spec.rank)
    set_value(param, value)


def bind_ema_to_zero(ema, plan, shards, comm=None, shard_ema: bool = False) -> List[ShardSpec]:
    """Bind ``ema`` to the train network's layout ([Note: ZeRO EMA]) and give it in-place swaps
    ([Note: in-place swaps]). Not collective; call once, before the train network is compiled.

    ``plan`` and ``shards`` are train records ([Note: train records] in train_plan.py); ``comm``, the
    optimizer parallel group's (None outside data parallelism), serves ``swap_before_eval``'s
    all-gather with ``shard_ema`` (stages 1-2 only). Returns the split-info entries of the EMA
    weights (and of an aligned ``swap_cache``).

    Raises:
        ValueError: an EMA weight is shaped neither like its parameter nor like its shard (``check_ema``
            finds this before anything is sharded, except for a parameter the optimizer does not update).
    """
    network = list(ema.net_weight)
    caches = _aligned_swap_cache(ema, len(network))
    by_id = {id(p): i for i, p in enumerate(shards.params)}
    n, r = max(plan.op.size, 1), plan.op.rank
    policy = plan.policy
    sharded_here = policy.shards_params or (policy.uses_masters and shard_ema)
    sources, specs, split, gather, rows = [], [], [], [], []
    for k, (w, e) in enumerate(zip(network, ema.ema_weight)):
        i = by_id.get(id(w))
        spec = plan.specs[i] if i is not None else None
        full = tuple(spec.shape) if spec is not None else tuple(w.shape)
        if tuple(e.shape) not in (full, tuple(w.shape)):
            raise ValueError(
                f"For 'prepare_train_network', the argument 'ema' holds '{e.name}' of shape {tuple(e.shape)} "
                f"for parameter '{w.name}' of shape {full}."
            )
        is_split = sharded_here and spec is not None and spec.split
        for p in [e] + ([caches[k]] if caches is not None else []):
            if is_unmaterialized(p):  # a clone of ``w`` built without data takes ``w``'s value
                _copy_of(p, w, spec if is_split else None)
            elif is_split:
                _cut(p, spec)
            specs.append(ShardSpec(p.name, full, n, r, is_split))
        sources.append(shards.opt_params[i] if is_split else w)
        split.append(is_split)
        gather.append(is_split and not policy.shards_params)
        rows.append(full[0] if full else 0)
    ema.net_weight = ParameterTuple(sources)
    ema.__dict__["_zero_binding"] = _ZeroBinding(network, split, gather, rows, comm)
    if not isinstance(ema, _InPlaceSwap):
        cls = type(ema)
        ema.__class__ = type(cls.__name__, (_InPlaceSwap, cls), {"__module__": cls.__module__})
    return specs


def _host_copy(param) -> np.ndarray:
    """A host copy of ``param``'s value (bfloat16 read as float32, which holds it exactly)."""
    if param.dtype == ms.bfloat16:
        return param.astype(ms.float32).asnumpy()
    return param.asnumpy().copy()


def _write_in_place(param: Parameter, value) -> None:
    """``param``'s buffer <- ``value`` (numpy or Tensor), cast to its dtype ([Note: in-place swaps])."""
    value = value if isinstance(value, Tensor) else Tensor(value)
    if value.dtype != param.dtype:
        value = value.astype(param.dtype)
    ops.assign(param, value)


def _swap_in(ema, binding: _ZeroBinding) -> None:
    with eager_mode():
        binding.cache = [_host_copy(w) for w in binding.network_weight]
        for w, e, gather, rows in zip(binding.network_weight, ema.ema_weight, binding.gather, binding.rows):
            if gather:
                value = binding.comm.all_gather(e)
                value = value if value.shape[0] == rows else value[:rows]
            else:
                value = e.value()
            _write_in_place(w, value)


def _swap_out(binding: _ZeroBinding) -> None:
    with eager_mode():
        for w, cached in zip(binding.network_weight, binding.cache):
            _write_in_place(w, cached)
    binding.cache = []


class _InPlaceSwap:
    """The swaps of a bound EMA ([Note: in-place swaps]); one not bound uses its class's own."""

    def swap_before_eval(self):
        """Put the EMA weights into the network, keeping the trained ones aside; returns True.

        Call it before evaluating with the EMA weights, then ``swap_after_eval``. Calling it twice
        changes nothing the second time. Collective (every rank of the optimizer parallel group)
        only at stages 1-2 with ``shard_ema=True``; local otherwise.
        """
        binding = _binding(self)
        if binding is None:
            return super().swap_before_eval()
        if binding.cache:  # already swapped in: the cache holds the trained weights
            return True
        _swap_in(self, binding)
        return True

    def swap_after_eval(self):
        """Put the trained weights back into the network, bit for bit; returns True. Local (any
        subset of ranks may call it); without a ``swap_before_eval`` before it, nothing changes."""
        binding = _binding(self)
        if binding is None:
            return super().swap_after_eval()
        if binding.cache:
            _swap_out(binding)
        return True


class EMA(_InPlaceSwap, nn.Cell):
    """EMA of ``network``'s weights (MindOne's EMA, shardable with ZeRO: [Note: ZeRO EMA]).

    ``swap_before_eval()`` puts the EMA weights into the network and ``swap_after_eval()`` puts the
    trained weights back exactly, in place ([Note: in-place swaps]). Not collective, except at
    stages 1-2 with ``shard_ema=True``, where ``swap_before_eval`` all-gathers the EMA shards and
    must be called on every rank.

    Args:
        network (nn.Cell): the network whose weights are averaged.
        ema_decay (float): decay in (0, 1).
        updates (int): updates already done (restored on resume); drives the decay warm-up.
        trainable_only (bool): average only trainable parameters.
        offloading (bool): kept for MindOne's signature; swaps always go through the host.

    Raises:
        ValueError: ``ema_decay`` outside (0, 1) or ``updates`` < 0.

    Examples:
        >>> import numpy as np
        >>> from mindspore import nn
        >>> from mindone_zero import EMA
        >>> net = nn.Dense(4, 2)
        >>> ema = EMA(net, ema_decay=0.999)
        >>> trained = net.weight.asnumpy().copy()
        >>> _ = ema.ema_update()        # after a step (the train network calls it)
        >>> ema.swap_before_eval()      # evaluate with the EMA weights ...
        True
        >>> ema.swap_after_eval()       # ... then put the trained weights back
        True
        >>> bool(np.array_equal(net.weight.asnumpy(), trained))
        True

        With ZeRO, pass it to ``prepare_train_network(..., ema=ema)``, which updates it after each
        optimizer step (tests/dist/test_checkpoint_resume.py runs this at stages 0-3):

        >>> train_net = prepare_train_network(loss_net, optimizer, ema=ema,
        ...                                   zero_stage=3)
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
        self.__dict__["_zero_binding"] = _whole_binding(self)

    def ema_update(self):
        """One EMA step: ``ema = d * ema + (1 - d) * weight``, with the decay ``d`` warmed up
        from 0 to ``ema_decay`` over the first updates. Returns the update count. Not collective."""
        updates = ops.assign_add(self.updates, ops.ones((), ms.float32))
        decay = self.ema_decay * (1.0 - ops.exp(-updates / _WARMUP))
        return ops.depend(updates, hyper_map(ops.partial(_ema_assign, decay), self.ema_weight, self.net_weight))


_ema_assign = ops.MultitypeFuncGraph("ema_assign")  # [Note: per-tensor maps] in core/graph_tuples.py


@_ema_assign.register("Tensor", "Tensor", "Tensor")
def _ema_assign_tensor(decay, ema, weight):
    return ops.assign(ema, ema * ops.cast(decay, ema.dtype) + ops.cast(weight, ema.dtype) * ops.cast(1.0 - decay, ema.dtype))
