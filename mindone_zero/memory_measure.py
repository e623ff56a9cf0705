"""Measured model-state bytes per rank: the counterpart of ``estimate_model_states_memory``.

``measure_model_states`` counts the bytes of every Parameter a ``TrainOneStepWrapper`` holds on
this rank, at the size it is actually held (a ZeRO shard counts as its padded block), grouped by
what it is for. Each Parameter object is counted once, under the first kind that claims it, in
the order of ``KINDS``: an optimizer whose states alias a master shard, or an EMA bound to the
network's own Parameters, is never counted twice.

Only Parameters are counted. Gradients that live only during a step (always at
``gradient_accumulation_steps == 1``), the full tensors a ZeRO-3 network gathers during forward
and backward, activations and communication buffers are transient and not model states held
between steps; the ZeRO paper's formulas (``memory.py``) count gradients whether or not they
are kept, so compare with accumulation buffers in place (``gradient_accumulation_steps > 1``).
"""
from typing import Dict, List

from mindspore import Parameter

from .optimizer_states import find_optimizer_states

__all__ = ["measure_model_states", "KINDS"]

# Order matters: a Parameter is counted under the first kind that holds it.
KINDS = ("params", "master_shards", "optimizer_states", "accumulation", "ema", "other")


def _nbytes(param: Parameter) -> int:
    return int(param.size) * int(param.itemsize)


def _optimizer_states(train_net, claimed: set) -> List[Parameter]:
    """The optimizer's per-parameter states; at stage 0 the helper did not look for them."""
    helper = train_net.zero_helper
    if helper.opt_states:
        return [v for values in helper.opt_states.values() for v in values]
    optimizer = train_net.optimizer
    try:
        states = find_optimizer_states(optimizer, [s.shape for s in helper.specs])
        return [v for values in states.values() for v in values]
    except ValueError:
        # States not shaped like the parameters (nothing is sharded at stage 0, so the
        # optimizer is allowed): count every non-scalar Parameter the optimizer owns.
        return [p for _, p in optimizer.parameters_and_names() if id(p) not in claimed and p.size > 1]


def measure_model_states(train_net) -> Dict[str, int]:
    """Bytes of model states this rank holds in ``train_net``, by kind. Not collective.

    Kinds (each Parameter object counted once, in this order):

    * ``params``: the network's Parameters at their held size (shards at stage 3);
    * ``master_shards``: ``zero_helper.opt_params`` entries that are not network Parameters
      (the 1/N fp32 master copies of stages 1-2);
    * ``optimizer_states``: the optimizer's per-parameter states (``zero_helper.opt_states``,
      or found with ``find_optimizer_states`` when the helper sharded nothing);
    * ``accumulation``: gradient accumulation buffers (``train_net.accum_grads``), if any;
    * ``ema``: EMA weights (``train_net.ema.ema_weight``), if an EMA is attached;
    * ``other``: every remaining Parameter of ``train_net`` (loss scale, step counters, Adam's
      beta powers, learning rate): a few scalars;
    * ``total``: the sum of the kinds above.

    Args:
        train_net: a ``TrainOneStepWrapper`` (as returned by ``prepare_train_network``).

    Returns:
        dict: ``{kind: bytes}`` with the keys of ``KINDS`` plus ``"total"``, all ints.

    Raises:
        TypeError: if ``train_net`` has no ``zero_helper``/``network``/``optimizer`` (is not a
            ``TrainOneStepWrapper``).
    """
    missing = [a for a in ("zero_helper", "network", "optimizer") if not hasattr(train_net, a)]
    if missing:
        raise TypeError(
            f"For 'measure_model_states', the argument 'train_net' must be a TrainOneStepWrapper, but got "
            f"{type(train_net).__name__} (no attribute {missing[0]!r})."
        )
    helper = train_net.zero_helper
    network_params = list(train_net.network.get_parameters())
    sources = {
        "params": lambda claimed: network_params,
        "master_shards": lambda claimed: [p for p, q in zip(helper.opt_params, helper.params) if p is not q],
        "optimizer_states": lambda claimed: _optimizer_states(train_net, claimed),
        "accumulation": lambda claimed: list(getattr(train_net, "accum_grads", None) or ()),
        "ema": lambda claimed: list(train_net.ema.ema_weight) if getattr(train_net, "ema", None) is not None else [],
        "other": lambda claimed: [p for _, p in train_net.parameters_and_names()],
    }
    claimed, result = set(), {}
    for kind in KINDS:
        total = 0
        for param in sources[kind](claimed):
            if id(param) not in claimed:
                claimed.add(id(param))
                total += _nbytes(param)
        result[kind] = total
    result["total"] = sum(result[k] for k in KINDS)
    return result
