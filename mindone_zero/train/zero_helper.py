"""ZeroHelper: which parameters are sharded, sharded optimizer states, gradient reduction per
stage and the post-step parameter all-gather.

One ``ZeroHelper`` serves one optimizer. It is an ``nn.Cell`` so that its master shards and
communication cells are part of the train graph; ``TrainOneStepWrapper`` calls its methods
from ``construct`` (GRAPH_MODE and PYNATIVE_MODE alike).

[Note: gradient reduction]
Gradients leave ``reduce_grads`` as the *mean* over every data-parallel rank, shaped like the
tensors the optimizer updates:

=====  ==================================================  ==========================
stage  sharded parameters                                  replicated parameters
=====  ==================================================  ==========================
0      all-reduce (full)                                   all-reduce
1, 2   pad, reduce-scatter over the optimizer group (shard) all-reduce
3      already reduce-scattered by the ZeRO-3 wrapper      all-reduce
=====  ==================================================  ==========================

then, with hybrid groups, an all-reduce over ``dp_group`` (replicas of the same shard).
Stage 1 and stage 2 differ only in *when* ``TrainOneStepWrapper`` calls this: once per
optimizer step on locally accumulated full gradients (stage 1), or every micro-step before
accumulating into shard-sized buffers (stage 2).
"""
import logging
from typing import List, Optional

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from ..core.comm import (GroupComm, cast_if_needed, check_hybrid_groups, group_size_and_rank, is_data_parallel,
                         pad_dim0, world_group)
from ..core.comm_plan import CommPlan, PlanContext
from ..core.comm_records import FLAG_DTYPE, TrainCommRecord
from ..core.group_alias import group_argument
from ..core.graph_tuples import hyper_map, take
from ..core.scaling import any_nonfinite, times
from .comm_accounting import step_plan
from .fusion import BucketedComm, FusionConfig
from ..offload import HostOffload
from ..offload.host_optimizer import offload_for
from .optimizer_states import check_optimizer, find_optimizer_states, optimizer_parameters, repoint_optimizer
from ..core.materialize import block_of, materialize, set_value
from ..core.partition import ShardSpec, check_split_rule_flag, splits_over, zero_spec_of
from ..core.split_info import write_split_info
from ..core.stage import StagePolicy
from ..core.slicing import narrow

__all__ = ["ZeroHelper"]

_logger = logging.getLogger(__name__)

_LOW_PRECISION = (ms.float16, ms.bfloat16)


# What reduce_grads runs per tensor ([Note: per-tensor maps] in core/graph_tuples.py).

_padded = ops.MultitypeFuncGraph("padded")


@_padded.register("Tensor", "Number")
def _padded_tensor(x, pad):
    return pad_dim0(x, pad)


_cast_like = ops.MultitypeFuncGraph("cast_like")


@_cast_like.register("Tensor", "Tensor")
def _cast_like_tensor(x, master):
    """``x`` in the master shard's dtype."""
    return cast_if_needed(x, master.dtype)


_squared_sum = ops.MultitypeFuncGraph("squared_sum")


@_squared_sum.register("Tensor")
def _squared_sum_tensor(g):
    return ops.reduce_sum(ops.square(cast_if_needed(g, ms.float32)))


_write_full = ops.MultitypeFuncGraph("write_full")
_RESHAPE = ops.Reshape()


@_write_full.register("Tensor", "Tensor", "Number")
def _write_full_tensor(param, full, rows):
    """Assign the gathered ``full`` (any shape with the padded tensor's elements in order:
    ``BucketedComm.all_gather_rows``) to ``param``, its padding rows cut off ([Note: slices] in
    slicing.py: only when there are some)."""
    full = _RESHAPE(full, (-1,) + param.shape[1:])
    if full.shape[0] != rows:
        full = narrow(full, 0, 0, rows)
    return ops.assign(param, cast_if_needed(full, param.dtype))


def _routes(n: int, rs_index: tuple, ar_index: tuple) -> tuple:
    """Where reduce_grads finds each of ``n`` parameters' reduced gradient, as an index into
    ``shards + replicated + grads``: the reduce-scattered shards, the all-reduced tensors, then the
    gradients as they came (stage 3's split parameters, reduce-scattered in their bprop)."""
    where = {i: len(rs_index) + len(ar_index) + i for i in range(n)}
    where.update({i: k for k, i in enumerate(rs_index)})
    where.update({i: len(rs_index) + k for k, i in enumerate(ar_index)})
    return tuple(where[i] for i in range(n))


def _master_dtype(dtype):
    return ms.float32 if dtype in _LOW_PRECISION else dtype


class ZeroHelper(nn.Cell):
    """Shards one optimizer's work over ``optimizer_parallel_group`` (ZeRO stages 0-3).

    MindOne's ``ZeroHelper``: ``prepare_train_network`` builds one and ``TrainOneStepWrapper``
    calls it from its ``construct``; ``cal_gradients``, ``run_optimizer`` and ``split_params`` keep
    MindOne's names. Building it is not collective; ``reduce_grads`` and ``run_optimizer`` are
    collective over the world (every rank must call them, in the same order).

    Args:
        optimizer (nn.Optimizer | mindspore.experimental.optim.Optimizer): built over the network's
            trainable parameters (at stage 3, the network must already be sharded by
            ``prepare_network``).
        zero_stage (int): 0, 1, 2 or 3. Outside ``ParallelMode.DATA_PARALLEL`` a stage > 0 warns
            and falls back to 0, as MindOne does.
        optimizer_parallel_group (str): group whose ranks share one copy of the model states;
            None means the world group.
        dp_group (str): group of the ranks holding the same shard (hybrid sharding); required
            when ``optimizer_parallel_group`` is not the world group.
        optimizer_offload (bool | dict): ``True`` or ``{"device": "cpu"}`` keeps the optimizer states
            in host memory and runs the update there; ``{"device": "nvme", "path": ...}`` keeps them
            in files ([Note: offload argument] in offload/config.py, [Note: host step] in
            offload/host_step.py). ``host_offload`` is then the host side, else None. An optimizer the
            host update does not cover warns and runs on the device without offload, as MindOne does.
        comm_fusion (dict): MindOne's communication-fusion dict; None (the default) buckets by
            ``fusion.DEFAULT_BUCKET_SIZE`` (25 MiB), ``{}`` sends one collective per tensor (see
            [Note: buckets] in fusion.py), or a ``FusionConfig`` already parsed by the caller.
            ``comm_plan()`` shows the resulting collectives.
        params_split_info (str): folder for ``params_split_info_{rank}.json``, written by
            ``dump_params_split_info`` (``prepare_train_network`` calls it at stages >= 1).
        pad_uneven_params (bool): stages 1-2: also split parameters whose dim 0 does not divide
            by the group size, zero-padded (default False: they stay whole and their gradients are
            all-reduced, as MindOne does; [Note: split rule] in partition.py). At stage 3 the
            network's own layout holds.
        op_group (str): MindOne 0.2.0's name for ``optimizer_parallel_group``; give one or the other.

    Attributes:
        zero_stage (int): the stage in force (0 outside ``ParallelMode.DATA_PARALLEL``).
        op_group (str): the optimizer parallel group's name (None in one process).
        op_size (int): ranks in that group; ``op_rank`` (int) is this rank's index in it.
        dp_group (str): the replica group, or None; ``dp_size`` (int) its size.
        is_parallel (bool): whether the job runs in ``ParallelMode.DATA_PARALLEL``.
        optimizer: the optimizer (re-pointed at the master shards at stages 1-2).
        params (ParameterTuple): the parameters the optimizer updates.
        opt_params (ParameterTuple): what it updates them through: the fp32 master shards at
            stages 1-2, the parameters themselves otherwise.
        host_offload: the host side of ``optimizer_offload``, else None.

    Raises:
        TypeError: ``optimizer`` is neither an ``nn.Optimizer`` nor an experimental ``Optimizer``, or both
            ``optimizer_parallel_group`` and ``op_group`` are given.
        ValueError: bad stage, groups, or optimizer states not shaped like their parameters.

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import ZeroHelper
        >>> net = nn.Dense(4, 2)
        >>> optimizer = nn.AdamWeightDecay(net.trainable_params())
        >>> helper = ZeroHelper(optimizer, zero_stage=2)
        >>> helper.zero_stage, helper.op_size   # one process: stage 0, nothing sharded
        (0, 1)

        On every rank, the train step around it, as ``prepare_train_network`` builds it
        (tests/dist/test_zero_parity.py runs ``prepare_train_network`` at stages 0-3):

        >>> helper = ZeroHelper(optimizer, zero_stage=2,
        ...                     optimizer_parallel_group=op_group, dp_group=dp_group)
        >>> train_net = TrainOneStepWrapper(loss_net, optimizer, zero_helper=helper)
    """

    def __init__(self, optimizer, zero_stage=0, optimizer_parallel_group=None, dp_group=None,
                 optimizer_offload=False, comm_fusion=None, params_split_info="params_info",
                 pad_uneven_params=False, *, op_group=None):
        super().__init__(auto_prefix=False)
        optimizer_parallel_group = group_argument("ZeroHelper", optimizer_parallel_group, op_group)
        check_optimizer(optimizer, "ZeroHelper")
        check_split_rule_flag("ZeroHelper", "pad_uneven_params", pad_uneven_params)
        self.pad_uneven_params = pad_uneven_params
        offload = offload_for(optimizer_offload, optimizer, "ZeroHelper")
        # An entry point that parsed comm_fusion already (prepare_train_network) hands its FusionConfig down.
        fusion = comm_fusion if isinstance(comm_fusion, FusionConfig) else FusionConfig.from_mindone(comm_fusion,
                                                                                                    "ZeroHelper")
        self.is_parallel = is_data_parallel()
        self.policy = StagePolicy.of(zero_stage, self.is_parallel)
        self.zero_stage = self.policy.stage
        self.optimizer = optimizer
        self.op_group = optimizer_parallel_group or (world_group() if self.is_parallel else None)
        self.dp_group = dp_group
        if self.is_parallel:
            check_hybrid_groups("ZeroHelper", self.op_group, dp_group)
        self.op_size, self.op_rank = group_size_and_rank(self.op_group) if self.is_parallel else (1, 0)
        self.dp_size, self.dp_rank = group_size_and_rank(dp_group) if (self.is_parallel and dp_group) else (1, 0)

        self.params = ParameterTuple(list(optimizer_parameters(optimizer)))
        self.specs = self._build_specs()
        self.split = tuple(s.split for s in self.specs)
        self.split_index = tuple(i for i, split in enumerate(self.split) if split)
        self.whole_index = tuple(i for i, split in enumerate(self.split) if not split)
        self.pads = tuple(s.pad for s in self.specs)
        self.full_d0 = tuple(s.shape[0] if s.shape else 0 for s in self.specs)
        self.use_masters = self.policy.uses_masters
        # Stage 0 follows MindSpore's gradients_mean as MindOne's does (its grad reducer);
        # sharded stages always average, as MindOne's ZeroHelper does.
        self.grads_mean = self.policy.is_zero or not self.is_parallel or bool(ms.get_auto_parallel_context("gradients_mean"))
        self.opt_params = self._shard_optimizer(offload.enabled)
        self.buckets_every_grad = False  # set by _build_comms
        if self.is_parallel:
            self._build_comms(fusion)
        self.optimizer_offload = offload.enabled
        self.host_offload = HostOffload(self, offload) if offload.enabled else None
        if self.host_offload is not None:
            self.opt_states = dict(self.opt_states, **self.host_offload.states)
        self.params_split_info = params_split_info
        self.extra_split_entries = []

    # ----------------------------------------------------------------- build
    def _build_specs(self) -> List[ShardSpec]:
        specs = []
        for p in self.params:
            spec = zero_spec_of(p)
            if self.policy.shards_params and spec is not None:
                # the name at sharding time may have gained a prefix since (a loss Cell around it)
                specs.append(ShardSpec(p.name, spec.shape, spec.group_size, spec.rank, spec.split))
                continue
            split = self.policy.uses_masters and self.op_size > 1 and \
                splits_over(p, self.op_size, self.pad_uneven_params)
            specs.append(ShardSpec(p.name, tuple(p.shape), self.op_size, self.op_rank, split))
        return specs

    def _shard_optimizer(self, offload: bool) -> ParameterTuple:
        """Create master shards (stages 1-2), shard the optimizer states, re-point the optimizer."""
        # Nothing is sharded at stage 0 (or on one rank), so any optimizer works there.
        find = any(self.split) or offload
        states = find_optimizer_states(self.optimizer, [s.shape for s in self.specs]) if find else {}
        opt_params = []
        for i, (p, spec) in enumerate(zip(self.params, self.specs)):
            if self.use_masters:
                materialize(p)  # stages 1-2 hold the full parameter ([Note: delayed initialisation])
            if self.use_masters and spec.split:
                dtype = _master_dtype(p.dtype)
                block = block_of(p, spec)
                opt_params.append(Parameter(Tensor(block, dtype), name=f"master.{p.name}", requires_grad=True))
            else:
                opt_params.append(p)
            for values in states.values():
                state = values[i]
                if spec.split and tuple(state.shape) != spec.shard_shape:
                    set_value(state, block_of(state, spec), _master_dtype(state.dtype))
        if self.use_masters:
            repoint_optimizer(self.optimizer, opt_params)
        self.opt_states = states
        return ParameterTuple(opt_params)

    def _build_comms(self, fusion: FusionConfig) -> None:
        """One bucketed communicator per (collective, group, tensor list); see [Note: buckets]."""
        self.op_comm = GroupComm(self.op_group)
        self.world_comm = GroupComm(world_group())
        n = len(self.params)
        reduce_here = self.policy.uses_masters
        self.rs_index = tuple(i for i in range(n) if self.split[i] and reduce_here)
        self.ar_index = self.whole_index
        # the all-gather's tensors by dtype and shape, so that its buckets hold runs of equal tensors, each
        # cut out at once ([Note: runs of pieces] in core/slicing.py); the order is the Python side's alone
        self.ag_index = tuple(sorted((i for i in range(n) if self.split[i] and self.use_masters),
                                     key=lambda i: (str(self.opt_params[i].dtype), self.specs[i].shard_shape, i)))
        self.ag_shards = ParameterTuple([self.opt_params[i] for i in self.ag_index])
        self.ag_params = ParameterTuple([self.params[i] for i in self.ag_index])
        self.rs_pads = tuple(self.pads[i] for i in self.rs_index)
        self.rs_padded = any(self.rs_pads)
        self.rs_casts = any(self.params[i].dtype != self.opt_params[i].dtype for i in self.rs_index)
        self.ag_rows = tuple(self.full_d0[i] for i in self.ag_index)
        self.routes = _routes(n, self.rs_index, self.ar_index)
        self.routes_replicated = self.ar_index == tuple(range(n))
        self.routes_sharded = self.rs_index == tuple(range(n))
        # every gradient goes through grad_rs or grad_ar (not at stage 3: [Note: unscale and check in the buckets])
        self.buckets_every_grad = len(self.rs_index) + len(self.ar_index) == n
        self.grad_rs = BucketedComm(self.op_comm, [self.specs[i].padded_shape for i in self.rs_index],
                                    [self.params[i] for i in self.rs_index], fusion.reduce_scatter, kind="reduce_scatter")
        self.grad_ar = BucketedComm(self.op_comm, [tuple(self.params[i].shape) for i in self.ar_index],
                                    [self.params[i] for i in self.ar_index], fusion.allreduce, kind="all_reduce")
        self.param_ag = BucketedComm(self.op_comm, [self.specs[i].shard_shape for i in self.ag_index],
                                     [self.opt_params[i] for i in self.ag_index], fusion.allgather, kind="all_gather")
        self.dp_ar = None
        if self.dp_size > 1:
            self.dp_ar = BucketedComm(GroupComm(self.dp_group), [tuple(p.shape) for p in self.opt_params],
                                      list(self.opt_params), fusion.allreduce, kind="all_reduce")

    def comm_plan(self, micro_steps: int = 1, reduce_each_micro_step: bool = True, clip_grad: bool = False) -> CommPlan:
        """This helper's collectives of one optimizer step on this rank (from ``comm_record``); the
        network's ZeRO-3 gathers are not in it (``TrainOneStepWrapper.comm_plan`` has both).

        Args:
            micro_steps (int): forward/backward passes per optimizer step (gradient accumulation).
            reduce_each_micro_step (bool): gradients are reduced every micro-step (else once per step).
            clip_grad (bool): a global-norm all-reduce is added (stages >= 1).

        Returns:
            CommPlan: one entry per collective.
        """
        return step_plan(self.comm_record, (), PlanContext(micro_steps, reduce_each_micro_step, clip_grad))

    @property
    def comm_record(self) -> Optional[TrainCommRecord]:
        """What this helper's collectives send ([Note: comm records] in core/comm_records.py): the
        overflow flags, the gradient reductions ([Note: gradient reduction]), the clipping norm
        (stages >= 1), the post-step all-gather (stages 1-2) and, with ``optimizer_offload``, the host
        step's agreement. None outside data parallelism. Not collective."""
        if not self.is_parallel:
            return None
        buckets = tuple(b.record for b in (self.grad_rs, self.grad_ar, self.dp_ar) if b is not None)
        return TrainCommRecord(self.world_comm.group, self.op_size * self.dp_size, self.op_comm.group, self.op_size,
                               self.policy.is_zero, buckets, self.param_ag.record, self.host_offload is not None)

    def split_info_entries(self) -> List[ShardSpec]:
        """One split-info entry per name: parameters, optimizer states, then registered extras."""
        entries = list(self.specs)
        for values in self.opt_states.values():
            entries += [ShardSpec(v.name, s.shape, s.group_size, s.rank, s.split) for v, s in zip(values, self.specs)]
        return entries + self.extra_split_entries

    def register_split_entries(self, specs: List[ShardSpec]) -> None:
        """Add entries (EMA weights, say) for ``dump_params_split_info``."""
        self.extra_split_entries = self.extra_split_entries + list(specs)

    def dump_params_split_info(self, folder: Optional[str] = None) -> None:
        """Write ``params_split_info_{op rank}.json`` into ``folder``, MindOne's name for it. Not
        collective; file I/O only.

        Args:
            folder (str): where to write it; None (default): the constructor's ``params_split_info``.
        """
        write_split_info(self.split_info_entries(), folder or self.params_split_info, self.op_rank)

    # ------------------------------------------------------------- construct-time
    def reduce_grads(self, grads):
        """Mean of ``grads`` over every data-parallel rank, per [Note: gradient reduction].

        Collective.

        Args:
            grads (tuple): this rank's gradients, one per ``params`` entry.

        Returns:
            tuple: the reduced gradients, shaped like ``opt_params`` (shards at stages 1-3).
        """
        if not self.is_parallel:
            return grads
        return self._reduce(grads, None)[0]

    def reduce_and_check(self, grads, factor):
        """(``reduce_grads`` of ``grads`` each times the 0-d ``factor``, whether any of the reduced
        gradients holds an inf or nan on this rank). Where this helper reduces every gradient in its
        buckets (stages 0-2 in data parallel), the factor multiplies the buckets' buffers and the
        check reads their results ([Note: unscale and check in the buckets] in core/scaling.py);
        else both run per tensor, the factor before the reduction. Collective.
        """
        if not self.is_parallel or not self.buckets_every_grad:
            reduced = self.reduce_grads(hyper_map(ops.partial(times, factor), grads))
            return reduced, any_nonfinite(reduced)
        reduced, buffers = self._reduce(grads, factor)
        return reduced, any_nonfinite(buffers)

    def _reduce(self, grads, factor):
        """(``reduce_grads``, the buffers of its last collectives): the gradients reduced, times the 0-d
        ``factor`` in the buckets if it is not None (then every gradient must be in a bucket)."""
        buffers = ()
        shards = ()
        if self.rs_index:
            fulls = take(grads, self.rs_index)
            if self.rs_padded:
                fulls = hyper_map(_padded, fulls, self.rs_pads)
            shards, buffers = self.grad_rs.reduce_scatter_buffers(fulls, True, factor)
            if self.rs_casts:  # low-precision gradients, float32 masters
                shards = hyper_map(_cast_like, shards, take(self.opt_params, self.rs_index))
        replicated = ()
        if self.ar_index:
            replicated, sent = self.grad_ar.all_reduce_buffers(take(grads, self.ar_index), self.grads_mean, factor)
            buffers = buffers + sent
        # stage 3's gradients of split parameters pass as they are: reduce-scattered by the ZeRO-3
        # wrapper's bprop
        if self.routes_replicated:  # every gradient all-reduced, in order (stage 0)
            out = replicated
        elif self.routes_sharded:  # every gradient reduce-scattered, in order (stages 1-2, every parameter split)
            out = shards
        else:
            out = take(shards + replicated + grads, self.routes)
        if self.dp_ar is not None:
            out, buffers = self.dp_ar.all_reduce_buffers(out, True)
        return out, buffers

    def global_norm(self, grads):
        """L2 norm of the full (unsharded) gradient, from the reduced ``grads``.

        Sharded gradients' squared norms are summed over the optimizer group (padding rows
        are zero); replicated ones are counted once. Every rank gets the same value. Collective.
        """
        squares = hyper_map(_squared_sum, grads)
        local_split = ops.zeros((), ms.float32)
        replicated = ops.zeros((), ms.float32)
        for i in self.split_index:  # each sum in parameter order: the sums keep their bits
            local_split = local_split + squares[i]
        for i in self.whole_index:
            replicated = replicated + squares[i]
        if self.is_parallel and self.policy.is_zero:
            local_split = self.op_comm.all_reduce(local_split)
        return ops.sqrt(local_split + replicated)

    def any_rank(self, flag):
        """True on every rank if ``flag`` (a bool Tensor) is True on any rank. Collective."""
        if not self.is_parallel:
            return flag
        return self.world_comm.all_reduce(ops.cast(flag, FLAG_DTYPE)) > 0

    def run_optimizer(self, grads):
        """Optimizer step on the shards, then (stages 1-2) all-gather the new shards into the
        network's parameters. Collective at stages 1-2.

        Args:
            grads (tuple): the reduced gradients (``reduce_grads``), shaped like ``opt_params``.
        """
        result = self.optimizer(grads)
        if self.use_masters:
            result = ops.depend(result, self.all_gather_params(result))
        return result

    def all_gather_params(self, after=None):
        """Copy the updated master shards into the full network parameters (stages 1-2). Collective."""
        if not self.ag_index:
            return ()
        shards = self.ag_shards
        if after is not None:
            shards = ops.depend(shards, after)
        fulls = self.param_ag.all_gather_rows(shards)
        return hyper_map(_write_full, self.ag_params, fulls, self.ag_rows)

    # ---------------------------------------------------------- MindOne names
    def cal_gradients(self, grads):
        """MindOne's name for ``reduce_grads``. Collective.

        Args:
            grads (tuple): this rank's gradients, one per ``params`` entry.
        """
        return self.reduce_grads(grads)

    def split_params(self):
        """MindOne compatibility: sharding already happened at construction."""
        return None
