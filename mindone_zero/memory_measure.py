"""Measured model-state bytes per rank: the counterpart of ``estimate_model_states_memory``.

``measure_model_states`` counts the bytes of every Parameter a ``TrainOneStepWrapper`` holds on
this rank, at the size it is actually held (a ZeRO shard counts as its padded block), grouped by
what it is for, from the train network's one inventory (``inventory.py``, which checkpoints
save too): each Parameter object is counted once, so an optimizer whose states alias a master
shard, or an EMA bound to the network's own Parameters, is never counted twice.

Only Parameters are counted. Gradients that live only during a step (always at
``gradient_accumulation_steps == 1``), the full tensors a ZeRO-3 network gathers during forward
and backward, activations and communication buffers are transient and not model states held
between steps; the ZeRO paper's formulas (``memory.py``) count gradients whether or not they
are kept, so compare with accumulation buffers in place (``gradient_accumulation_steps > 1``).
"""
from typing import Dict

from .inventory import inventory

__all__ = ["measure_model_states", "KINDS"]

KINDS = ("params", "master_shards", "optimizer_states", "accumulation", "ema", "other")
# the inventory's kinds folded into the coarser ones reported here
_KIND_OF = {"optimizer_other": "other"}


def measure_model_states(train_net) -> Dict[str, int]:
    """Bytes of model states this rank holds in ``train_net``, by kind. Not collective.

    Kinds (each Parameter object counted once):

    * ``params``: the network's Parameters at their held size (shards at stage 3);
    * ``master_shards``: ``zero_helper.opt_params`` entries that are not network Parameters
      (the 1/N fp32 master copies of stages 1-2);
    * ``optimizer_states``: the optimizer's per-parameter states (``zero_helper.opt_states``,
      or found with ``find_optimizer_states`` when the helper sharded nothing);
    * ``accumulation``: gradient accumulation buffers (``train_net.accum_grads``), if any;
    * ``ema``: EMA weights (and an EMA's aligned swap cache), if an EMA is attached;
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
    result = dict.fromkeys(KINDS, 0)
    for held in inventory(train_net):
        result[_KIND_OF.get(held.kind, held.kind)] += int(held.param.size) * int(held.param.itemsize)
    result["total"] = sum(result[k] for k in KINDS)
    return result
