"""The ``CommPlan`` of a train step, derived from the records its collectives are built from.

``step_plan`` counts one optimizer step ([Note: comm plan] in core/comm_plan.py) from a
``ZeroHelper``'s ``TrainCommRecord`` and the network's ``GatherRecord``s ([Note: comm records] in
core/comm_records.py), one function per kind of entry. ``network_gathers`` reads the gather
records, with whether backward gathers each again ([Note: dropped re-gathers] in
zero3/backward_reads.py), from the build's state ([Note: zero3 state] in zero3/state.py). Nothing
here communicates.
"""
from typing import Iterable, Optional, Tuple

from mindspore import nn

from ..core.comm_plan import CommPlan, PlanContext
from ..core.comm_records import BucketRecord, GatherRecord, TrainCommRecord
from ..core.partition import zero_spec_of
from ..zero3.state import gather_calls

__all__ = ["StepCommAccounting", "step_plan", "network_gathers", "param_gathers", "add_gather", "add_hpz_secondary", "add_reduce_scatter", "add_buckets",
           "add_overflow_flags", "add_clip_norm", "add_offload_agreement"]


def network_gathers(network: nn.Cell) -> Tuple[GatherRecord, ...]:
    """The records of the gathers that ``network``'s code calls (per parameter, coalesced or a gather
    unit's parts), ``regather`` set as each sharded network's ``ZeroState`` says. Not collective."""
    return tuple(r for call in gather_calls(network) for r in call.records)


def param_gathers(gathers: Iterable[GatherRecord], params, specs) -> list:
    """``TrainOneStepWrapper.param_gathers`` of ``params`` laid out as ``specs``, from the network's
    ``gathers`` (``network_gathers``). Not collective."""
    regathered = {name for r in gathers if r.regather for name in r.members}
    coalesced = [r for r in gathers if len(r.members) > 1]  # one collective for several
    groups = {name: i for i, r in enumerate(coalesced) for name in r.members}
    out = []
    for p, spec in zip(params, specs):
        name = getattr(zero_spec_of(p), "name", None)
        out.append({"name": p.name, "regathered": bool(spec.split and name in regathered),
                    "coalesced": groups.get(name)})
    return out


def _gathers_once(plan: CommPlan, record: GatherRecord, times: int) -> None:
    n = record.group_size
    if record.quantize_weights:  # qwZ: int8 blocks and their scales
        plan.add_quantized("all_gather", record.group, n, n * record.block * record.blocks, n * record.blocks, times)
    else:
        plan.add("all_gather", record.group, record.gathered_nbytes, n, times=times)


def add_gather(plan: CommPlan, record: GatherRecord, ctx: PlanContext) -> None:
    """A gather's all-gathers in its shard group: every micro-step in forward and, unless hpZ moves
    it into the secondary group, again in backward when ``record.regather``."""
    _gathers_once(plan, record, ctx.micro_steps)
    if record.regather and record.hpz_group is None:
        _gathers_once(plan, record, ctx.micro_steps)


def add_hpz_secondary(plan: CommPlan, record: GatherRecord, ctx: PlanContext) -> None:
    """hpZ's all-gathers of the secondary shards in the secondary group ([Note: hpZ] in
    zero3/param_wrapper.py): in forward, and again in backward when ``record.regather``."""
    if record.hpz_group is None:
        return
    times = ctx.micro_steps * (2 if record.regather else 1)
    plan.add("all_gather", record.hpz_group, record.hpz_gathered_nbytes, record.hpz_size, times=times)


def add_reduce_scatter(plan: CommPlan, record: GatherRecord, ctx: PlanContext) -> None:
    """A gather's gradient reduce-scatter every micro-step (qgZ: an all-to-all of int8 blocks); none
    for frozen parameters."""
    if not record.reduces:
        return
    n = record.group_size
    if record.quantize_grads:
        plan.add_quantized("all_to_all", record.group, n, n * record.block * record.blocks, n * record.blocks,
                           ctx.micro_steps)
    else:
        plan.add("reduce_scatter", record.group, record.grad_nbytes, n, times=ctx.micro_steps)


def add_buckets(plan: CommPlan, record: BucketRecord, ctx: PlanContext) -> None:
    """One entry per bucket and call: gradients at every gradient reduction, the updated shards'
    all-gather once per optimizer step (its full, gathered bytes)."""
    times = 1 if record.kind == "all_gather" else ctx.reductions
    for _ in range(times):
        for nbytes in record.full_bytes:
            plan.add(record.kind, record.group, nbytes, record.group_size)


def add_overflow_flags(plan: CommPlan, step: TrainCommRecord, ctx: PlanContext) -> None:
    """The overflow flag's all-reduce over the world, every micro-step."""
    plan.add("all_reduce", step.world_group, step.flag_nbytes, step.world_size, times=ctx.micro_steps)


def add_clip_norm(plan: CommPlan, step: TrainCommRecord, ctx: PlanContext) -> None:
    """The clipping norm's all-reduce over the shard group (stages >= 1), once per optimizer step."""
    if ctx.clip_grad and step.norm_reduced:
        plan.add("all_reduce", step.op_group, step.flag_nbytes, step.op_size)


def add_offload_agreement(plan: CommPlan, step: TrainCommRecord, ctx: PlanContext) -> None:
    """The ranks' agreement after a host step ([Note: host step] in offload/host_step.py): one flag per
    rank, all-reduced over the world once per optimizer step."""
    if step.offload_agreement:
        plan.add("all_reduce", step.world_group, step.flag_nbytes * step.world_size, step.world_size)


def step_plan(step: Optional[TrainCommRecord], gathers: Iterable[GatherRecord], ctx: PlanContext) -> CommPlan:
    """The collectives of one optimizer step described by ``ctx`` ([Note: comm plan]): the train
    step's (``step``, None without data parallelism), then each gather's. Not collective."""
    plan = CommPlan()
    if step is not None:
        add_overflow_flags(plan, step, ctx)
        for buckets in step.grad_buckets:
            add_buckets(plan, buckets, ctx)
        add_clip_norm(plan, step, ctx)
        add_buckets(plan, step.param_gather, ctx)
        add_offload_agreement(plan, step, ctx)
    for record in gathers:
        add_gather(plan, record, ctx)
        add_hpz_secondary(plan, record, ctx)
        add_reduce_scatter(plan, record, ctx)
    return plan


class StepCommAccounting:
    """The communication plan of a train step (a base of ``TrainOneStepWrapper``): ``comm_plan``,
    ``plan_comm``, ``param_gathers``. Reads the step's ``zero_plan``, ``optimizer_shards``,
    ``clip_grad`` and the network's gather records (``_gathers``, from ``network_gathers``)."""

    @property
    def comm_plan(self) -> CommPlan:
        """The collectives of one optimizer step on this rank, as the native path runs them
        (``CommPlan``, built with the wrapper; [Note: comm plan] in core/comm_plan.py)."""
        return self._comm_plan

    def plan_comm(self, micro_steps: int) -> CommPlan:
        """The collectives of one optimizer step of ``micro_steps`` micro-steps on this rank, counted
        from the train records and the network's gathers (train/comm_accounting.py), with gradients
        reduced as this stage reduces them at that accumulation. ``comm_plan`` is this at
        ``gradient_accumulation_steps``. Not collective.

        Args:
            micro_steps (int): forward/backward passes per optimizer step, >= 1.

        Returns:
            CommPlan: one entry per collective.

        Raises:
            ValueError: ``micro_steps`` is not an integer >= 1.
        """
        if isinstance(micro_steps, bool) or not isinstance(micro_steps, int) or micro_steps < 1:
            raise ValueError(f"For 'plan_comm', the argument 'micro_steps' must be an integer >= 1, but got "
                             f"{micro_steps!r}.")
        ctx = PlanContext(micro_steps, self.zero_plan.policy.reduce_each_micro_step(micro_steps), self.clip_grad)
        return step_plan(self.zero_plan.comm_record, self._gathers, ctx)

    def param_gathers(self) -> list:
        """How ZeRO-3 gathers each parameter the optimizer updates, in ``optimizer_shards.params`` order:
        ``{"name", "regathered", "coalesced"}``, ``regathered`` whether backward gathers it again
        ([Note: reshard after forward] in zero3/reshard.py, [Note: dropped re-gathers] in
        zero3/backward_reads.py) and ``coalesced`` the index of the coalesced gather it shares a
        collective with ([Note: coalesced gathers] in zero3/coalesce.py), or None. Parameters the
        network does not shard have False and None. Not collective."""
        return param_gathers(self._gathers, self.optimizer_shards.params, self.zero_plan.specs)
