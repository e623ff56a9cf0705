"""One inventory of the state a ZeRO train network holds on this rank, by kind.

Memory measurement (``memory_measure``) sums it and checkpoints (``checkpoint.layout``) save it;
both read this list instead of reaching into the train network themselves. Building it does
not communicate.

Every Parameter of the train network appears once, under the first kind that holds it:

* ``params``: the network's Parameters (shards at stage 3);
* ``master_shards``: the fp32 master shards the optimizer updates at stages 1-2;
* ``optimizer_states``: the optimizer's per-parameter states (shards at stages >= 1); with
  ``optimizer_offload`` an ``OffloadedState`` each, whose ``location`` is ``host`` or ``file``;
* ``optimizer_other``: the optimizer's other Parameters (learning rate, step, beta powers);
* ``ema``: the EMA's weights and an aligned swap cache ([Note: ZeRO EMA] in ema.py);
* ``accumulation``: gradient accumulation buffers (shards at stages 2-3);
* ``other``: everything else (loss scale, micro-step counter, EMA update count).
"""
from dataclasses import dataclass, replace
from typing import List

from mindspore import Parameter

from .ema import ema_entries
from .optimizer_states import find_optimizer_states
from ..core.partition import ShardSpec, zero_spec_of

__all__ = ["KINDS", "Held", "inventory"]

KINDS = ("params", "master_shards", "optimizer_states", "optimizer_other", "ema", "accumulation", "other")


@dataclass(frozen=True)
class Held:
    """One Parameter: its kind, how this rank holds it (``held.split``: a padded block of the full
    ``held.shape``), and its split-info entry (the layout of the parameter it stands for)."""

    kind: str
    param: Parameter
    held: ShardSpec
    entry: ShardSpec


def _optimizer_states(shards, specs) -> List[Parameter]:
    """The optimizer's per-parameter states; at stage 0 they were not looked for."""
    if shards.opt_states:
        return [v for values in shards.opt_states.values() for v in values]
    optimizer = shards.optimizer
    try:
        states = find_optimizer_states(optimizer, [s.shape for s in specs])
        return [v for values in states.values() for v in values]
    except ValueError:
        # Not shaped like the parameters (allowed at stage 0, where nothing is sharded): every
        # non-scalar Parameter the optimizer owns counts as a state.
        params = {id(p) for p in shards.params}
        return [p for _, p in optimizer.parameters_and_names() if id(p) not in params and p.size > 1]


def inventory(train_net) -> List[Held]:
    """Every Parameter ``train_net`` (a ``TrainOneStepWrapper``) holds, classified (see the module
    docstring), in a fixed order: network, optimizer, EMA, then the train step's own. Reads the
    train records ([Note: train records] in train_plan.py)."""
    plan, shards = train_net.zero_plan, train_net.optimizer_shards
    n, r, specs = plan.op.size, plan.op.rank, plan.specs
    index = {id(p): i for i, p in enumerate(shards.params)}
    out, seen = [], set()
    seen.update(id(p) for p in shards.placeholders)  # cut to one element by offload; OffloadedState stands for each

    def whole(p):
        return ShardSpec(p.name, tuple(p.shape), n, r, False)

    def like(p, i, split):
        """Held like parameter ``i``: a block of its full shape when ``split`` and it is split."""
        return ShardSpec(p.name, specs[i].shape, n, r, bool(split and specs[i].split))

    def add(kind, p, held, entry=None):
        if id(p) not in seen:
            seen.add(id(p))
            out.append(Held(kind, p, held, entry or held))

    for p in train_net.network.get_parameters():
        # At stage 3 shard_network's own record says how the network holds it (also for a
        # parameter the optimizer does not update); at stages 0-2 the network holds it whole.
        spec = zero_spec_of(p) if plan.policy.shards_params else None
        held = replace(spec, name=p.name) if spec is not None else whole(p)
        i = index.get(id(p))
        add("params", p, held, replace(specs[i], name=p.name) if i is not None else held)
    for i, (q, p) in enumerate(zip(shards.opt_params, shards.params)):
        if q is not p:
            add("master_shards", q, like(q, i, True))
    aligned = {id(v): i for values in shards.opt_states.values() for i, v in enumerate(values)}
    for v in _optimizer_states(shards, specs):
        add("optimizer_states", v, like(v, aligned[id(v)], True) if id(v) in aligned else whole(v))
    for _, p in shards.optimizer.parameters_and_names():
        add("optimizer_other", p, whole(p))
    if train_net.ema is not None:
        for w, e, split in ema_entries(train_net.ema):
            i = index.get(id(w))
            add("ema", e, like(e, i, split) if i is not None else whole(e))
    if train_net.accum_steps > 1:
        sharded = train_net.reduce_each_micro_step and plan.policy.is_zero
        for i, a in enumerate(train_net.accum_grads):
            add("accumulation", a, like(a, i, sharded))
    for _, p in train_net.parameters_and_names():
        add("other", p, whole(p))
    return out
