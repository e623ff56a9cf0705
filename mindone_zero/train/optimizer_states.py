"""Find an optimizer's per-parameter states, cut them to shards, re-point the optimizer at the
master shards: ``OptimizerShards``, one of the train records ([Note: train records] in
train_plan.py).

No collectives here. MindSpore optimizers keep their per-parameter states as ParameterTuple
attributes aligned with ``optimizer._parameters`` (Adam: ``moment1``/``moment2``/``vhat``,
AdamWeightDecay: ``moments1``/``moments2``, Momentum: ``moments``, SGD: ``accum``/``stat``), and
some keep aliases of the parameters themselves (Momentum: ``params``). Rather than a table of
known optimizers, every ParameterTuple attribute is classified by what it holds:

* the parameters themselves (same objects): an alias, re-pointed with the parameters;
* one tensor per parameter, shaped like it: a state, sharded like its parameter;
* one scalar per parameter (per-group learning rates, say): replicated, left alone;
* anything else: the optimizer's states are not shaped like its parameters, and sharding them
  along dim 0 would be wrong, so ``find_optimizer_states`` raises.
"""
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from mindspore import Parameter, ParameterTuple, Tensor, nn

from ..core import ms_internals
from ..core.materialize import block_of, materialize, set_value

__all__ = ["find_optimizer_states", "repoint_optimizer", "check_no_unknown_states", "check_optimizer",
           "optimizer_parameters", "OptimizerShards", "shard_optimizer"]

_PARAM_ATTRS = (ms_internals.OPTIMIZER_PARAMETERS, "parameters")


def check_optimizer(optimizer, where: str) -> None:
    """Raise TypeError unless ``optimizer`` is a ``mindspore.nn.Optimizer`` or follows
    ``mindspore.experimental.optim.Optimizer`` (as ``mint.optim``'s do), as MindOne accepts."""
    from mindspore.experimental.optim import Optimizer  # also the base of mint.optim's optimizers

    if not isinstance(optimizer, (nn.Optimizer, Optimizer)):
        raise TypeError(
            f"For '{where}', the argument 'optimizer' must be a mindspore.nn.Optimizer or a "
            f"mindspore.experimental.optim.Optimizer, but got {type(optimizer).__name__}."
        )


def optimizer_parameters(optimizer) -> ParameterTuple:
    """The Parameters ``optimizer`` updates, in its order (``nn.Optimizer._parameters``, or
    ``parameters`` of a ``mindspore.experimental.optim.Optimizer``)."""
    if isinstance(optimizer, nn.Optimizer):
        return ms_internals.optimizer_parameters(optimizer)
    return optimizer.parameters


def _aligned_tuples(optimizer) -> Dict[str, ParameterTuple]:
    n = len(optimizer_parameters(optimizer))
    return {
        attr: value
        for attr, value in vars(optimizer).items()
        if isinstance(value, ParameterTuple) and attr not in _PARAM_ATTRS and len(value) == n
    }


def find_optimizer_states(optimizer: nn.Optimizer, full_shapes: Sequence[tuple]) -> Dict[str, List[Parameter]]:
    """``{attr: [state of each parameter]}`` of ``optimizer`` (aliases of the parameters excluded).
    ``full_shapes``: each parameter's full shape; a state may have it or, at ZeRO-3, the shard's.

    Raises:
        ValueError: a per-parameter tuple holds tensors shaped neither like the parameters nor as
            scalars, or the optimizer holds other non-scalar Parameters (``check_no_unknown_states``).
    """
    params = list(optimizer_parameters(optimizer))
    states = {}
    for attr, values in _aligned_tuples(optimizer).items():
        if all(v is p for v, p in zip(values, params)):
            continue  # an alias of the parameters, e.g. Momentum.params
        if all(v.size <= 1 for v in values) and not all(p.size <= 1 for p in params):
            continue  # per-parameter scalars such as group learning rates
        for v, p, full in zip(values, params, full_shapes):
            if tuple(v.shape) not in (tuple(full), tuple(p.shape)):
                raise ValueError(
                    f"For 'ZeroHelper', the optimizer {type(optimizer).__name__} keeps the state "
                    f"'{v.name}' of shape {tuple(v.shape)} for parameter '{p.name}' of shape {tuple(full)}; "
                    f"ZeRO shards states along dim 0 and needs them shaped like their parameters."
                )
        states[attr] = list(values)
    check_no_unknown_states(optimizer, states)
    return states


def check_no_unknown_states(optimizer: nn.Optimizer, states: Dict[str, List[Parameter]]) -> None:
    """Raise if ``optimizer`` holds a non-scalar Parameter that is neither a parameter, a known
    per-parameter state nor a learning-rate schedule (such states could not be sharded)."""
    known = {id(p) for p in optimizer_parameters(optimizer)}
    known.update(id(v) for values in states.values() for v in values)
    for name, value in optimizer.parameters_and_names():
        if id(value) in known or value.size <= 1 or "learning_rate" in name:
            continue
        raise ValueError(
            f"For 'ZeroHelper', the optimizer {type(optimizer).__name__} holds the Parameter '{name}' of shape "
            f"{tuple(value.shape)} that is not one state per parameter shaped like it; ZeRO cannot shard it."
        )


def repoint_optimizer(optimizer: nn.Optimizer, new_params: Sequence[Parameter]) -> None:
    """Make ``optimizer`` update ``new_params`` (same order) instead of its parameters.

    Every attribute that aliases the old parameters (``_parameters``, ``parameters`` and
    optimizer-specific ones like Momentum's ``params``) is re-pointed. Weight-decay flags and
    per-group settings were derived from the old parameters at construction and are kept,
    which is right because ``new_params[i]`` stands for ``optimizer._parameters[i]``.
    """
    old = list(optimizer_parameters(optimizer))
    if len(new_params) != len(old):
        raise ValueError(
            f"For 'repoint_optimizer', the argument 'new_params' must have {len(old)} entries, "
            f"but got {len(new_params)}."
        )
    aliases = [a for a, v in _aligned_tuples(optimizer).items() if all(x is p for x, p in zip(v, old))]
    new_tuple = ParameterTuple(list(new_params))
    for attr in [a for a in _PARAM_ATTRS if a in vars(optimizer)] + aliases:
        setattr(optimizer, attr, new_tuple)


@dataclass(frozen=True, eq=False)
class OptimizerShards:
    """What one optimizer updates under ZeRO ([Note: train records] in train_plan.py).

    Attributes:
        optimizer: the optimizer (re-pointed at the master shards at stages 1-2).
        params: the parameters it updates, in its order.
        opt_params: what it updates them through: the fp32 master shards of the split parameters at
            stages 1-2, the parameters themselves otherwise.
        opt_states: its per-parameter states by attribute (``moments1``: one per parameter), cut to
            shards where the parameter is split; with ``optimizer_offload`` the offloaded ones are
            ``OffloadedState``s (offload/host_step.py).
        placeholders: the state Parameters cut to one element by ``optimizer_offload``.
    """

    optimizer: object
    params: ParameterTuple
    opt_params: ParameterTuple
    opt_states: Mapping[str, Tuple]
    placeholders: Tuple[Parameter, ...] = ()

    def with_host_states(self, states: Mapping[str, Sequence], placeholders: Sequence[Parameter]) -> "OptimizerShards":
        """These shards with ``states`` (by attribute) moved to the host, standing in for the device's."""
        merged = dict(self.opt_states, **{attr: tuple(values) for attr, values in states.items()})
        return replace(self, opt_states=MappingProxyType(merged), placeholders=tuple(placeholders))


def shard_optimizer(plan, optimizer, states: Optional[Dict[str, List[Parameter]]] = None) -> OptimizerShards:
    """Create the master shards (stages 1-2), cut the optimizer's states of split parameters to this
    rank's block, and re-point the optimizer at the master shards (stages 1-2), as ``plan`` says.
    ``states``: ``find_optimizer_states``'s result if the caller has it. Not collective.

    Raises:
        ValueError: the optimizer's states are not shaped like its parameters (``find_optimizer_states``).
    """
    params = ParameterTuple(list(optimizer_parameters(optimizer)))
    # Nothing is sharded at stage 0 (or on one rank), so any optimizer works there.
    if not (plan.split_index or plan.offload.enabled):
        states = {}
    elif states is None:
        states = find_optimizer_states(optimizer, [s.shape for s in plan.specs])
    masters = plan.policy.uses_masters
    opt_params = []
    for i, (p, spec) in enumerate(zip(params, plan.specs)):
        if masters:
            materialize(p)  # stages 1-2 hold the full parameter ([Note: delayed initialisation])
        if masters and spec.split:
            opt_params.append(Parameter(Tensor(block_of(p, spec), plan.update_dtypes[i]), name=f"master.{p.name}",
                                        requires_grad=True))
        else:
            opt_params.append(p)
        for values in states.values():
            state = values[i]
            if spec.split and tuple(state.shape) != spec.shard_shape:
                set_value(state, block_of(state, spec))
    if masters:
        repoint_optimizer(optimizer, opt_params)
    return OptimizerShards(optimizer, params, ParameterTuple(opt_params),
                           MappingProxyType({attr: tuple(values) for attr, values in states.items()}))
