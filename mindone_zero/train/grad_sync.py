"""GradSync: the train step's gradient synchronization, built from the train records.

One ``GradSync`` serves one optimizer ([Note: train records] in train_plan.py). It is an ``nn.Cell``
so that its communication cells and the master shards are part of the train graph;
``TrainOneStepWrapper`` calls its methods from ``construct`` (GRAPH_MODE and PYNATIVE_MODE alike).

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

(at stage 3 the wrapper's reduce-scatter leaves the group's sum where the train step divides it by
the group size in its unscale: [Note: the group mean in the step] in zero3/gather_group.py)

then, with hybrid groups, an all-reduce over ``dp_group`` (replicas of the same shard).
Stage 1 and stage 2 differ only in *when* ``TrainOneStepWrapper`` calls this: once per
optimizer step on locally accumulated full gradients (stage 1), or every micro-step before
accumulating into shard-sized buffers (stage 2).
"""
from mindspore import ParameterTuple, nn, ops

from ..core.comm import GroupComm, cast_if_needed, pad_dim0
from ..core.comm_records import FLAG_DTYPE
from ..core.graph_tuples import hyper_map, take
from ..core.scaling import any_nonfinite, squared_sum, unscaled
from ..core.slicing import narrow
from .fusion import BucketedComm, packed_buffers

__all__ = ["GradSync"]


# What reduce_grads runs per tensor ([Note: per-tensor maps] in core/graph_tuples.py).

_padded = ops.MultitypeFuncGraph("padded")


@_padded.register("Tensor", "Number")
def _padded_tensor(x, pad):
    return pad_dim0(x, pad)


_cast_like = ops.MultitypeFuncGraph("cast_like")


@_cast_like.register("Tensor", "Tensor")
def _cast_like_tensor(x, master):
    return cast_if_needed(x, master.dtype)


_write_full = ops.MultitypeFuncGraph("write_full")
_RESHAPE = ops.Reshape()


@_write_full.register("Tensor", "Tensor", "Number")
def _write_full_tensor(param, full, rows):
    """Assign the gathered ``full`` (the padded tensor's elements in order, any shape) to ``param``,
    its padding rows cut off ([Note: slices] in slicing.py: only when there are some)."""
    full = _RESHAPE(full, (-1,) + param.shape[1:])
    if full.shape[0] != rows:
        full = narrow(full, 0, 0, rows)
    return ops.assign(param, cast_if_needed(full, param.dtype))


class GradSync(nn.Cell):
    """Gradient reduction per stage ([Note: gradient reduction]), the overflow agreement, the global
    norm, the optimizer step and the post-step all-gather of one optimizer's shards.

    Built from the records ([Note: train records] in train_plan.py); building it is not collective.
    Its methods are collective over the world (every rank must call them, in the same order) in
    ``ParallelMode.DATA_PARALLEL``, and communicate nothing outside it.

    Args:
        plan (TrainPlan): the layout.
        shards (OptimizerShards): what the optimizer updates.
    """

    def __init__(self, plan, shards):
        super().__init__(auto_prefix=False)
        self.optimizer = shards.optimizer
        self.opt_params = shards.opt_params
        self.is_parallel = plan.is_parallel
        self.is_zero = plan.policy.is_zero
        self.use_masters = plan.policy.uses_masters
        self.grads_mean = plan.grads_mean
        self.split_index, self.whole_index = plan.split_index, plan.whole_index
        # ``unscaled``: which gradients are split (1), where some are not
        self.factor_index = tuple(int(s.split) for s in plan.specs) if plan.whole_index else None
        self.buckets_every_grad = plan.buckets_every_grad
        self.op_comm = self.world_comm = self.dp_ar = None
        self.ag_index = ()
        # [Note: unscale and check in the buckets] in core/scaling.py: the check's buffers where the
        # gradients have no buckets of their own (stage 3, reduction after accumulation, no data
        # parallelism: gradients shaped and typed like the parameters), and the norm's (the reduced
        # gradients, shaped and typed like what the optimizer updates), split and whole apart
        self.check_buffers = packed_buffers(shards.params)
        self.split_buffers = packed_buffers([shards.opt_params[i] for i in self.split_index])
        self.whole_buffers = packed_buffers([shards.opt_params[i] for i in self.whole_index])
        if plan.is_parallel:
            self._build_comms(plan, shards)

    def _build_comms(self, plan, shards) -> None:
        """One bucketed communicator per (collective, group, tensor list), from ``plan.buckets``."""
        specs, buckets = plan.specs, plan.buckets
        self.op_comm = GroupComm(plan.op.name)
        self.world_comm = GroupComm(plan.world.name)
        self.rs_index, self.ar_index, self.ag_index, self.routes = plan.rs_index, plan.ar_index, plan.ag_index, plan.routes
        self.ag_shards = ParameterTuple([shards.opt_params[i] for i in self.ag_index])
        self.ag_params = ParameterTuple([shards.params[i] for i in self.ag_index])
        self.rs_pads, self.rs_casts, self.ag_rows = plan.rs_pads, plan.rs_casts, plan.ag_rows
        self.rs_padded = any(self.rs_pads)
        n = len(specs)
        self.routes_replicated = self.ar_index == tuple(range(n))
        self.routes_sharded = self.rs_index == tuple(range(n))
        self.grad_rs = BucketedComm(self.op_comm, [specs[i].padded_shape for i in self.rs_index],
                                    record=buckets.reduce_scatter)
        self.grad_ar = BucketedComm(self.op_comm, [specs[i].shape for i in self.ar_index], record=buckets.all_reduce)
        self.param_ag = BucketedComm(self.op_comm, [specs[i].shard_shape for i in self.ag_index],
                                     record=buckets.all_gather)
        if buckets.replicas is not None:
            self.dp_ar = BucketedComm(GroupComm(plan.dp.name), [s.shard_shape for s in specs], record=buckets.replicas)

    def reduce_grads(self, grads):
        """Mean of ``grads`` (one per parameter the optimizer updates) over every data-parallel rank,
        shaped like ``opt_params`` ([Note: gradient reduction]). Collective."""
        if not self.is_parallel:
            return grads
        return self._reduce(grads, None)[0]

    def reduce_and_check(self, grads, factor, summed_by=None):
        """(``reduce_grads`` of ``grads`` each times the 0-d ``factor``, whether any reduced gradient
        holds an inf or nan on this rank). Where every gradient is in a bucket (stages 0-2), both
        happen in the buckets ([Note: unscale and check in the buckets] in core/scaling.py); else the
        factor multiplies each tensor and ``check`` reads them. ``summed_by``: None, or the group size
        N when the split parameters' gradients arrive as the group's sums (stage 3: [Note: the group
        mean in the step] in zero3/gather_group.py), which ``factor / N`` multiplies instead.
        Collective."""
        if not self.is_parallel or not self.buckets_every_grad or summed_by is not None:
            reduced = self.reduce_grads(unscaled(grads, factor, summed_by, self.factor_index))
            return reduced, self.check(reduced)
        reduced, buffers = self._reduce(grads, factor)
        return reduced, any_nonfinite(buffers)

    def check(self, grads):
        """Whether any of ``grads`` (shaped and typed like the parameters: the gradients of stage 3,
        or local ones before a reduction) holds an inf or nan on this rank, read in packed buffers
        ([Note: unscale and check in the buckets] in core/scaling.py). Not collective."""
        return any_nonfinite(self.check_buffers(grads))

    def _reduce(self, grads, factor):
        """(``reduce_grads``, the buffers of its last collectives), times the 0-d ``factor`` in the
        buckets if it is not None (then every gradient must be in a bucket)."""
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
        # stage 3's gradients of split parameters pass as they are: its bprop reduce-scattered them
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
        are zero); replicated ones are counted once. Every rank gets the same value. Each sum reads
        packed buffers ([Note: unscale and check in the buckets] in core/scaling.py). Collective.
        """
        local_split = squared_sum(self.split_buffers(take(grads, self.split_index)))
        replicated = squared_sum(self.whole_buffers(take(grads, self.whole_index)))
        if self.is_parallel and self.is_zero:
            local_split = self.op_comm.all_reduce(local_split)
        return ops.sqrt(local_split + replicated)

    def any_rank(self, flag):
        """True on every rank if ``flag`` (a bool Tensor) is True on any rank. Collective."""
        if not self.is_parallel:
            return flag
        return self.world_comm.all_reduce(ops.cast(flag, FLAG_DTYPE)) > 0

    def run_optimizer(self, grads):
        """Optimizer step on the reduced ``grads``, then (stages 1-2, collective) all-gather the new
        shards into the network's parameters."""
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
