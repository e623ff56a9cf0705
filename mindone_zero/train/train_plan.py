"""The train step's layout, planned once from the checked ZeRO arguments: ``TrainPlan``.

[Note: train records]
``prepare_train_network`` (or a ``ZeroHelper`` built directly) checks its ZeRO arguments once
(``ZeroOptions.check``) and then builds, each from the ones before, and nothing twice:

* ``TrainPlan`` (here): what ZeRO makes of the optimizer's parameters: the stage policy, the groups,
  one ``ShardSpec`` per parameter, which gradients each collective carries ([Note: gradient
  reduction] in grad_sync.py) and its buckets. Pure data: planning modifies nothing.
* ``OptimizerShards`` (optimizer_states.py): what the optimizer updates: the parameters, the fp32
  master shards at stages 1-2, its states cut to shards, and with ``optimizer_offload`` the states
  moved to the host and their placeholders.
* ``GradSync`` (grad_sync.py): the Cell that reduces the gradients, checks them for overflow, takes
  the global norm, runs the optimizer and all-gathers the new shards.
* with ``optimizer_offload``, ``HostOffload`` (offload/host_step.py), which calls the ``GradSync``
  after each host step; nothing refers back to it.

The records are frozen. ``ZeroHelper`` is MindOne's face over them; the train step, the EMA binding,
the inventory, checkpoints and memory measurement read the records (``train_net.zero_plan``,
``train_net.optimizer_shards``, ``train_net.grad_sync``), not the helper.
"""
import logging
from dataclasses import dataclass
from typing import Optional, Tuple

import mindspore as ms
import numpy as np

from ..core.comm import check_hybrid_groups, group_size_and_rank, is_data_parallel, world_group
from ..core.comm_records import BucketRecord, TrainCommRecord
from ..core.partition import ShardSpec, splits_over, zero_spec_of
from ..core.stage import StagePolicy
from ..offload.config import OffloadConfig
from ..offload.host_optimizer import HostRule, offload_for
from .fusion import FusionConfig, bucket_record
from .optimizer_states import check_optimizer

__all__ = ["ZeroOptions", "GroupInfo", "TrainBuckets", "TrainPlan", "plan_train", "master_dtype"]

_logger = logging.getLogger(__name__)

_LOW_PRECISION = (ms.float16, ms.bfloat16)


def master_dtype(dtype):
    """The dtype the optimizer updates a split parameter of ``dtype`` in at stages 1-2: float32 for
    float16 and bfloat16, else the parameter's own."""
    return ms.float32 if dtype in _LOW_PRECISION else dtype


@dataclass(frozen=True)
class ZeroOptions:
    """The ZeRO arguments of ``prepare_train_network`` and ``ZeroHelper``, checked (``check``).

    Attributes:
        policy: the stage in force (stage 0 outside ``ParallelMode.DATA_PARALLEL``).
        is_parallel: the job runs in ``ParallelMode.DATA_PARALLEL``.
        op_group, dp_group: the groups as given (None: the world group; no replica group).
        fusion: the bucket sizes ([Note: buckets] in fusion.py).
        offload: where the optimizer states live; ``host_rule`` the host update when offloaded.
        pad_uneven_params: the padded split rule ([Note: split rule] in partition.py).
    """

    policy: StagePolicy
    is_parallel: bool
    op_group: Optional[str]
    dp_group: Optional[str]
    fusion: FusionConfig
    offload: OffloadConfig
    host_rule: Optional[HostRule]
    pad_uneven_params: bool

    @classmethod
    def check(cls, where: str, optimizer, zero_stage, op_group, dp_group, optimizer_offload, comm_fusion,
              pad_uneven_params: bool) -> "ZeroOptions":
        """Check the ZeRO arguments given to ``where`` (``pad_uneven_params`` excepted: the callers
        check it with their other split-rule flags) and return them parsed. Not collective; reads
        group membership; an nvme offload path is created (``OffloadConfig.parse``).

        Raises:
            TypeError / ValueError: naming ``where``, the argument and the value.
        """
        check_optimizer(optimizer, where)
        is_parallel = is_data_parallel()
        if is_parallel:
            check_hybrid_groups(where, op_group or world_group(), dp_group)
        # comm_fusion may come parsed already (a FusionConfig)
        fusion = comm_fusion if isinstance(comm_fusion, FusionConfig) else FusionConfig.from_mindone(comm_fusion, where)
        offload, rule = offload_for(optimizer_offload, optimizer, where)  # [Note: offload argument]
        policy = StagePolicy.of(zero_stage, is_parallel, where)
        return cls(policy, is_parallel, op_group, dp_group, fusion, offload, rule, pad_uneven_params)


@dataclass(frozen=True)
class GroupInfo:
    """A communication group: its name (None outside data parallelism), size, and this rank's index."""

    name: Optional[str]
    size: int = 1
    rank: int = 0


@dataclass(frozen=True)
class TrainBuckets:
    """The buckets ([Note: buckets] in fusion.py) of the train step's collectives: the gradients'
    reduce-scatter and all-reduce over the optimizer group, the post-step all-gather of the updated
    shards, and the all-reduce over the replica group (None without one)."""

    reduce_scatter: BucketRecord
    all_reduce: BucketRecord
    all_gather: BucketRecord
    replicas: Optional[BucketRecord]


@dataclass(frozen=True)
class TrainPlan:
    """How ZeRO lays out one optimizer's parameters ([Note: train records]). Pure data.

    Attributes:
        policy: what the stage shards; ``is_parallel``: in ``ParallelMode.DATA_PARALLEL``.
        world, op, dp: the world, the optimizer parallel group and the replica group.
        specs: one ``ShardSpec`` per parameter the optimizer updates, in its order.
        dtypes: each parameter's dtype; ``update_dtypes``: the dtype the optimizer updates it in (a
            float32 master shard's at stages 1-2, else the parameter's).
        split_index, whole_index: the parameters split, and those kept whole.
        rs_index, ar_index: the gradients reduce-scattered (stages 1-2) and all-reduced here.
        ag_index: the master shards all-gathered after the step (stages 1-2), by dtype and shape.
        routes: where each reduced gradient is found among ``shards + replicated + grads``.
        grads_mean: reduced gradients are averaged (stage 0 follows ``gradients_mean``).
        buckets: ``TrainBuckets`` (None outside data parallelism).
        offload: where the optimizer states live.
    """

    policy: StagePolicy
    is_parallel: bool
    world: GroupInfo
    op: GroupInfo
    dp: GroupInfo
    specs: Tuple[ShardSpec, ...]
    dtypes: tuple
    update_dtypes: tuple
    split_index: Tuple[int, ...]
    whole_index: Tuple[int, ...]
    rs_index: Tuple[int, ...]
    ar_index: Tuple[int, ...]
    ag_index: Tuple[int, ...]
    routes: Tuple[int, ...]
    grads_mean: bool
    buckets: Optional[TrainBuckets]
    offload: OffloadConfig

    @property
    def rs_pads(self) -> Tuple[int, ...]:
        """Zero rows appended to each reduce-scattered gradient."""
        return tuple(self.specs[i].pad for i in self.rs_index)

    @property
    def rs_casts(self) -> bool:
        """A reduce-scattered gradient is cast to its master shard's dtype (low-precision parameters)."""
        return any(self.dtypes[i] != self.update_dtypes[i] for i in self.rs_index)

    @property
    def ag_rows(self) -> Tuple[int, ...]:
        """The full dim 0 of each parameter all-gathered after the step."""
        return tuple(self.specs[i].shape[0] for i in self.ag_index)

    @property
    def buckets_every_grad(self) -> bool:
        """Every gradient goes through the reduce-scatter or all-reduce buckets (not at stage 3:
        [Note: unscale and check in the buckets] in core/scaling.py)."""
        return self.is_parallel and len(self.rs_index) + len(self.ar_index) == len(self.specs)

    @property
    def comm_record(self) -> Optional[TrainCommRecord]:
        """What the train step's own collectives send ([Note: comm records] in core/comm_records.py):
        the overflow flags, the gradient reductions ([Note: gradient reduction] in grad_sync.py), the
        clipping norm (stages >= 1), the post-step all-gather (stages 1-2) and, with
        ``optimizer_offload``, the host step's agreement. None outside data parallelism."""
        if self.buckets is None:
            return None
        grads = tuple(b for b in (self.buckets.reduce_scatter, self.buckets.all_reduce, self.buckets.replicas)
                      if b is not None)
        return TrainCommRecord(self.world.name, self.world.size, self.op.name, self.op.size, self.policy.is_zero,
                               grads, self.buckets.all_gather, self.offload.enabled)


def _specs(params, policy: StagePolicy, op: GroupInfo, pad_uneven: bool) -> Tuple[ShardSpec, ...]:
    specs = []
    for p in params:
        spec = zero_spec_of(p)
        if policy.shards_params and spec is not None:
            # the name at sharding time may have gained a prefix since (a loss Cell around it)
            specs.append(ShardSpec(p.name, spec.shape, spec.group_size, spec.rank, spec.split))
            continue
        split = policy.uses_masters and op.size > 1 and splits_over(p, op.size, pad_uneven)
        specs.append(ShardSpec(p.name, tuple(p.shape), op.size, op.rank, split))
    return tuple(specs)


def _routes(n: int, rs_index: tuple, ar_index: tuple) -> tuple:
    """Where the reduction finds each of ``n`` parameters' reduced gradient, as an index into
    ``shards + replicated + grads``: the reduce-scattered shards, the all-reduced tensors, then the
    gradients as they came (stage 3's split parameters, reduce-scattered in their bprop)."""
    where = {i: len(rs_index) + len(ar_index) + i for i in range(n)}
    where.update({i: k for k, i in enumerate(rs_index)})
    where.update({i: len(rs_index) + k for k, i in enumerate(ar_index)})
    return tuple(where[i] for i in range(n))


def _numel(shape) -> int:
    return int(np.prod(shape))


def _buckets(fusion: FusionConfig, op: GroupInfo, dp: GroupInfo, specs, dtypes, update_dtypes, rs, ar, ag):
    """The ``TrainBuckets`` of these index tuples ([Note: buckets] in fusion.py)."""
    replicas = None
    if dp.size > 1:
        replicas = bucket_record("all_reduce", dp.name, dp.size, [_numel(s.shard_shape) for s in specs],
                                 update_dtypes, fusion.allreduce)
    return TrainBuckets(
        bucket_record("reduce_scatter", op.name, op.size, [_numel(specs[i].padded_shape) for i in rs],
                      [dtypes[i] for i in rs], fusion.reduce_scatter),
        bucket_record("all_reduce", op.name, op.size, [_numel(specs[i].shape) for i in ar],
                      [dtypes[i] for i in ar], fusion.allreduce),
        bucket_record("all_gather", op.name, op.size, [_numel(specs[i].shard_shape) for i in ag],
                      [update_dtypes[i] for i in ag], fusion.allgather),
        replicas)


def _group(name: Optional[str], parallel: bool) -> GroupInfo:
    return GroupInfo(name, *group_size_and_rank(name)) if parallel and name else GroupInfo(name)


def plan_train(options: ZeroOptions, params) -> TrainPlan:
    """The ``TrainPlan`` of ``params`` (the optimizer's, in its order) under ``options``. Reads the
    groups' sizes and MindSpore's ``gradients_mean``; modifies nothing; not collective."""
    policy, parallel = options.policy, options.is_parallel
    op = _group(options.op_group or (world_group() if parallel else None), parallel)
    dp = _group(options.dp_group, parallel)
    world = GroupInfo(world_group(), op.size * dp.size) if parallel else GroupInfo(None)
    specs = _specs(params, policy, op, options.pad_uneven_params)
    dtypes = tuple(p.dtype for p in params)
    masters = policy.uses_masters
    update_dtypes = tuple(master_dtype(d) if masters and s.split else d for d, s in zip(dtypes, specs))
    split_index = tuple(i for i, s in enumerate(specs) if s.split)
    whole_index = tuple(i for i, s in enumerate(specs) if not s.split)
    rs_index = split_index if masters else ()  # stage 3's arrive reduce-scattered by the ZeRO-3 wrapper
    # the all-gather's tensors by dtype and shape, so that its buckets hold runs of equal tensors, each
    # cut out at once ([Note: runs of pieces] in core/slicing.py); the order is the Python side's alone
    ag_index = tuple(sorted(rs_index, key=lambda i: (str(update_dtypes[i]), specs[i].shard_shape, i)))
    # Stage 0 follows MindSpore's gradients_mean as MindOne's does (its grad reducer);
    # sharded stages always average, as MindOne's ZeroHelper does.
    grads_mean = policy.is_zero or not parallel or bool(ms.get_auto_parallel_context("gradients_mean"))
    buckets = (_buckets(options.fusion, op, dp, specs, dtypes, update_dtypes, rs_index, whole_index, ag_index)
               if parallel else None)
    return TrainPlan(policy, parallel, world, op, dp, specs, dtypes, update_dtypes, split_index, whole_index,
                     rs_index, whole_index, ag_index, _routes(len(specs), rs_index, whole_index), grads_mean,
                     buckets, options.offload)
