"""``gathered_parameters``: the full values of some ZeRO-3 parameters for a block of eager code,
DeepSpeed's ``zero.GatheredParameters``. Collective over the parameters' group.

Inside the block each listed split parameter holds its full, unpadded value on every rank (its data is
replaced, the Parameter object and its name stay); on exit it holds this rank's block again. Without
``modifier_rank`` the block's changes are dropped: each parameter gets back the shard it had. With
``modifier_rank=r`` the values rank ``r`` leaves are broadcast, one tensor at a time, and each rank
keeps its block of them: a resized embedding's new rows, a re-initialisation. Memory on a rank: the
listed parameters' full values plus their shards, and one tensor in flight.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
from mindspore import Parameter, Tensor

from ..core.comm import GroupComm, eager_mode, group_size_and_rank, world_group
from ..core.materialize import set_value
from ..core.ms_internals import in_compiled_graph
from ..core.partition import is_int, split_array
from .param_wrapper import zero_param_of

__all__ = ["gathered_parameters"]

_WHERE = "gathered_parameters"
_IN_GRAPH = (f"For '{_WHERE}', it must be called in eager code (outside any construct or jit function), but it was "
             f"called while a graph is compiled.")


@dataclass(frozen=True)
class _Gathered:
    """What the block changes: the split parameters, their group and the modifier's index in it."""

    params: Tuple[Parameter, ...]
    group: Optional[str]
    modifier_rank: Optional[int]


def _as_list(params) -> List:
    if isinstance(params, Parameter):
        return [params]
    try:
        return list(params)
    except TypeError:
        raise TypeError(f"For '{_WHERE}', the argument 'params' must be a Parameter or an iterable of Parameters, "
                        f"but got {type(params).__name__}.") from None


def _plan(params, modifier_rank) -> _Gathered:
    """Every check before anything changes ([Note: split rule] in core/partition.py: what is split)."""
    if in_compiled_graph():
        raise RuntimeError(_IN_GRAPH)
    items = _as_list(params)
    for p in items:
        if not isinstance(p, Parameter):
            raise TypeError(f"For '{_WHERE}', the argument 'params' must hold only Parameters, but got "
                            f"{type(p).__name__}.")
    split, seen = [], set()
    for p in items:
        record = zero_param_of(p)
        if record is not None and record.spec.split and record.spec.group_size > 1 and id(p) not in seen:
            seen.add(id(p))
            split.append((p, record))
    owners = {id(r.owner): r for _, r in split}
    if len(owners) > 1:
        names = sorted({p.name for p, r in split if r is split[0][1] or r.owner is not split[0][1].owner})
        raise ValueError(f"For '{_WHERE}', the argument 'params' must hold parameters of one network, but it holds "
                         f"parameters sharded by {len(owners)} different networks (e.g. {names[:4]}).")
    group = split[0][1].group if split else None
    size = split[0][1].spec.group_size if split else group_size_and_rank(None)[0]
    if modifier_rank is not None and not (is_int(modifier_rank) and 0 <= modifier_rank < size):
        raise ValueError(f"For '{_WHERE}', the argument 'modifier_rank' must be None or an integer in [0, {size}), "
                         f"but got {modifier_rank!r}.")
    return _Gathered(tuple(p for p, _ in split), group, modifier_rank)


class gathered_parameters:  # noqa: N801 - used as a function: ``with gathered_parameters(params):``
    """Give the listed ZeRO-3 parameters their full values for the block, then shard them again.

    DeepSpeed's ``zero.GatheredParameters``. A collective: every rank of the parameters' group must
    enter the block with the same parameters, in the same order. Inside it, each listed parameter that
    ZeRO-3 split holds its full, unpadded value on every rank (the same Parameter, the same name); on
    exit it holds this rank's block again. Parameters that are not split (below stage 3, kept whole, a
    group of one rank) pass through untouched. Extra memory on a rank: the listed parameters' full
    values (and their shards, kept for the exit) plus one tensor in flight, never the model. It runs
    eagerly, in GRAPH_MODE (the block is Python between compiled steps) and PYNATIVE_MODE alike; a
    compiled graph called inside the block would have been compiled for the shards: use the block for
    eager code (saving, inspecting, initialising).

    Args:
        params (Parameter | Iterable[Parameter]): the parameters, of one network
            (``network.trainable_params()``, an adapter's ``peft_model.trainable_params()``).
        modifier_rank (int): None (default): changes made inside the block are dropped, every
            parameter gets its shard back. An index in the group: the values that rank leaves are
            broadcast on exit and become every rank's shards (a resized embedding's new rows, a
            custom re-initialisation).

    Raises:
        TypeError: ``params`` is not a Parameter or an iterable of Parameters.
        ValueError: ``params`` holds parameters sharded by two different networks, or
            ``modifier_rank`` is not None or an integer in [0, group size).
        RuntimeError: called while a graph is compiled (inside a ``construct`` or a ``jit``
            function). Each of these is raised before anything changes.

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import gathered_parameters, prepare_network
        >>> net = prepare_network(nn.Dense(4, 2), zero_stage=3)  # one process
        >>> with gathered_parameters(net.trainable_params()):
        ...     net.weight.shape
        (2, 4)

        Export a LoRA adapter from a stage-3 job, on every rank (tests/dist/test_gathered.py runs
        these calls); rank 0 then holds the adapter, not the model:

        >>> with gathered_parameters(peft_model.trainable_params()):
        ...     peft_model.save_pretrained("adapter", is_main_process=rank == 0)

        Re-initialise a sharded parameter on rank 0 and hand it to every rank
        (tests/dist/test_gathered.py runs these calls too):

        >>> with gathered_parameters([model.lm_head.weight], modifier_rank=0):
        ...     if rank == 0:
        ...         model.lm_head.weight.set_data(new_value)
    """

    def __init__(self, params, modifier_rank: Optional[int] = None):
        self._plan = _plan(params, modifier_rank)
        self._shards = None

    def __enter__(self):
        plan = self._plan
        if in_compiled_graph():  # a graph compiles the block: refused before anything changes
            raise RuntimeError(_IN_GRAPH)
        if plan.params:
            self._comm = GroupComm(plan.group or world_group())
            self._shards = []
            with eager_mode():
                for p in plan.params:  # one tensor in flight: each gathered, unpadded, set, before the next
                    self._shards.append(p.asnumpy().copy())
                    set_value(p, self._comm.all_gather(p).asnumpy()[:zero_param_of(p).spec.shape[0]].copy())
        return None

    def __exit__(self, *exc):
        plan, shards = self._plan, self._shards
        if not plan.params:
            return False
        with eager_mode():
            kept = plan.modifier_rank is None or _agree_shapes(self._comm, plan)
            for p, shard in zip(plan.params, shards):
                modified = plan.modifier_rank is not None and kept
                set_value(p, _block_of_modifier(self._comm, p, plan.modifier_rank) if modified else shard)
        self._shards = None
        if not kept:
            raise ValueError(f"For '{_WHERE}', the parameters must keep their full shapes inside the block on the "
                             f"rank 'modifier_rank' ({plan.modifier_rank}), but one did not; every rank dropped the "
                             f"changes.")
        return False


def _agree_shapes(comm: GroupComm, plan: _Gathered) -> bool:
    """Whether the modifier kept every full shape (one all-reduce, so that every rank decides alike)."""
    bad = comm.rank == plan.modifier_rank and any(tuple(p.shape) != zero_param_of(p).spec.shape for p in plan.params)
    return float(comm.all_reduce(Tensor(np.array([float(bad)], np.float32))).asnumpy()[0]) == 0.0


def _block_of_modifier(comm: GroupComm, param: Parameter, root: int) -> np.ndarray:
    """This rank's block of ``param``'s full value on group rank ``root``; collective over the group."""
    spec = zero_param_of(param).spec
    mine = param.asnumpy() if tuple(param.shape) == spec.shape else np.zeros(spec.shape, param.asnumpy().dtype)
    value = comm.broadcast(Tensor(mine, param.dtype), root).asnumpy()
    return split_array(value, spec.group_size, spec.rank)
