"""[Note: comm plan] and [Note: comm records] in one process: the accounting's entries from the records,
the one dtype rule the gathers cast by and the plan counts by ([Note: wire dtype]), the walk that finds
the network's gathers, and which re-gathers backward runs ([Note: dropped re-gathers]). The plan
against the compiled graph's collectives: tests/dist/test_comm_graph.py."""
from dataclasses import replace

import numpy as np
import mindspore as ms
import pytest
from mindspore import Tensor, nn, ops

from mindone_zero.core import comm
from mindone_zero.core.comm import NATIVE_OP, GroupComm
from mindone_zero.core.comm_plan import CommPlan, PlanContext
from mindone_zero.core.comm_records import GatherRecord, gather_wire_dtype
from mindone_zero.core.partition import ShardSpec
from mindone_zero.train.comm_accounting import add_buckets, network_gathers, step_plan
from mindone_zero.train.fusion import BucketedComm
from mindone_zero.train.train_step import TrainOneStepWrapper
from mindone_zero.zero3 import param_wrapper
from mindone_zero.zero3.backward_reads import backward_reads
from mindone_zero.zero3.coalesce import ZeroGatherGroup
from mindone_zero.zero3.param_wrapper import ParamGather
from parallel_modules import Dense, Embedding, shard_network

KEEP_ALIVE = []


class _Comm:
    group, size = "g", 4


def test_comm_plan_is_the_same_class_from_comm():
    assert comm.CommPlan is CommPlan


def test_every_collective_primitive_says_what_the_native_path_sends():
    """[Note: native tags]: what tests/dist/test_comm_graph.py reads back from the compiled graph."""
    found = [p for value in vars(GroupComm()).values() for p in (value if isinstance(value, tuple) else (value,))
             if isinstance(p, ops.Primitive) and p.name in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast")]
    assert len(found) >= 9 and all(p.attrs[NATIVE_OP] in ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                           "all_to_all") for p in found)


def test_group_primitives_are_shared_and_do_not_outlive_their_users():
    """Issue 58: no module-global state that outlives a network. The primitives of a group are
    built once and shared by its GroupComms while one lives, then dropped."""
    import gc
    import weakref

    group = "test_primitives_lifetime"  # no other test's GroupComm holds this group's entry
    first, second = GroupComm(group), GroupComm(group)
    assert first._sum_ops is second._sum_ops  # shared, not built twice
    held = weakref.ref(first._held_primitives)
    assert any(key[0] == group for key in comm._PRIMITIVES.keys())
    del first, second
    gc.collect()
    assert held() is None
    assert not any(key[0] == group for key in comm._PRIMITIVES.keys())
    assert GroupComm(group)._sum_ops[0].attrs[NATIVE_OP] == "all_reduce"  # built again when needed


def test_context_counts_reductions():
    assert PlanContext(micro_steps=3).reductions == 3
    assert PlanContext(micro_steps=3, reduce_each_micro_step=False).reductions == 1


@pytest.mark.parametrize("kind,times,nbytes", [("all_reduce", 3, 40), ("reduce_scatter", 3, 40), ("all_gather", 1, 160)])
def test_buckets_record_each_call_of_one_optimizer_step(kind, times, nbytes):
    shapes = [(2, 3), (4,)]  # 24 + 16 bytes of float32: one bucket
    tensors = [Tensor(np.zeros(s, np.float32)) for s in shapes]
    buckets = BucketedComm(_Comm(), shapes, tensors, bucket_size=1 << 20, kind=kind)
    assert buckets.record.buckets == buckets.buckets == ((0, 1),) and buckets.record.dtypes == ("Float32",)
    plan = CommPlan()
    add_buckets(plan, buckets.record, PlanContext(micro_steps=3))
    # gradients are reduced every micro-step; the updated shards are gathered once, whole (4 ranks)
    assert plan.entries == [(kind, "g", nbytes, 4)] * times


def test_buckets_reject_another_kind():
    with pytest.raises(ValueError, match="the argument 'kind' must be one of .*, but got 'broadcast'"):
        BucketedComm(_Comm(), [(2,)], [Tensor(np.zeros(2, np.float32))], None, kind="broadcast")


class _Loss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3, 2)

    def construct(self, x):
        return self.dense(x).sum()


def test_train_step_plan_without_data_parallelism_is_empty_and_checks_micro_steps():
    net = _Loss()
    train = TrainOneStepWrapper(net, nn.SGD(net.trainable_params()), gradient_accumulation_steps=2)
    assert train.comm_plan.entries == [] and train.plan_comm(1).entries == []
    assert train.param_gathers() == [{"name": p.name, "regathered": False, "coalesced": None}
                                     for p in net.trainable_params()]
    with pytest.raises(ValueError, match="For 'plan_comm', the argument 'micro_steps' must be an integer >= 1, "
                                         "but got 0"):
        train.plan_comm(0)


# ------------------------------------------------------------------ [Note: wire dtype]
def _gather(name, shape, compute=None, param=ms.float32):
    return ParamGather(ShardSpec(name, shape, 2, 0, True), param, None, compute).build()


@pytest.mark.parametrize("param,compute,wire", [(ms.float32, ms.float16, ms.float16), (ms.float32, ms.bfloat16, ms.bfloat16),
                                                (ms.float16, ms.float32, ms.float16), (ms.float32, ms.float32, ms.float32)])
def test_one_wire_dtype_for_the_cell_and_the_plan(param, compute, wire):
    """Drift 1: a float16 ``to_float`` gather of float32 weights sends 2 bytes per element, per
    parameter (a weight over 1 MiB in float16) as coalesced; the Cells cast by the record's rule."""
    big, w, b = (_gather("big", (1024, 768), compute, param), _gather("w", (8, 4), compute, param),
                 _gather("b", (8,), compute, param))
    group = ZeroGatherGroup([w, b])
    assert gather_wire_dtype(param, compute) == big.record.wire_dtype == group.gather_record.wire_dtype == wire
    assert big.cast_before_gather == group.gather.cast_before_gather == (wire != param)
    assert big.wire_dtype == group.gather.wire_dtype == wire
    item = 2 if wire != ms.float32 else 4
    plan = step_plan(None, [big.record, group.gather_record], PlanContext(micro_steps=2))
    grad = 4 if param == ms.float32 else 2
    assert plan.entries == ([("all_gather", big.record.group, 1024 * 768 * item, 2)] * 2
                            + [("reduce_scatter", big.record.group, 1024 * 768 * grad, 2)] * 2
                            + [("all_gather", big.record.group, 40 * item, 2)] * 2
                            + [("reduce_scatter", big.record.group, 40 * grad, 2)] * 2)


def test_qwz_travels_as_int8_blocks_and_a_regather_counts_twice():
    record = GatherRecord("layer", "g", 2, ("w",), ((8, 4),), ((4, 4),), ms.float32, ms.float16, True, True, True,
                          block=8, blocks=2, regather=True)
    assert record.wire_dtype == ms.int8 and not record.cast_before_gather and record.cast_after_gather
    plan = step_plan(None, [record], PlanContext())
    values, scales = ("all_gather", "g", 2 * 8 * 2, 2), ("all_gather", "g", 2 * 2 * 4, 2)
    assert plan.entries == [values, scales, values, scales, ("all_to_all", "g", 32, 2), ("all_to_all", "g", 16, 2)]
    hpz = replace(record, quantize_weights=False, quantize_grads=False, hpz_group="h", hpz_size=2)
    entries = step_plan(None, [hpz], PlanContext(micro_steps=3)).entries
    # hpZ: the shard group's gather once, the secondary group's twice (forward and backward)
    assert entries == ([("all_gather", "g", 64, 2)] * 3 + [("all_gather", "h", 64, 2)] * 6
                       + [("reduce_scatter", "g", 128, 2)] * 3)


# ------------------------------------------------------------------ the walk and [Note: dropped re-gathers]
@pytest.fixture
def two_ranks(monkeypatch):
    """Parameters cut for 2 ranks in one process (nothing runs: the records only)."""
    monkeypatch.setattr(param_wrapper, "group_size_and_rank", lambda group: (2, 0))


class _Readers(nn.Cell):
    def __init__(self):
        super().__init__()
        self.small = Dense(nn.Dense(4, 6), zero_stage=3)  # weight and bias coalesced
        self.big = Dense(nn.Dense(768, 1024), zero_stage=3)  # 3 MiB weight: per parameter
        self.table = Embedding(nn.Embedding(10, 4), zero_stage=3)


def test_the_walk_finds_each_called_gather_once_and_which_backward_reads(two_ranks):
    net = _Readers()
    KEEP_ALIVE.append(net)
    assert net.small.zero_coalesce and not net.big.zero_coalesce
    kinds = [(r.kind, r.members, r.regather) for r in network_gathers(net)]
    names = [p.zero_spec.name for p in net.trainable_params()]  # as sharded
    assert kinds == [("layer", tuple(names[:2]), False), ("layer", (names[2],), False),
                     ("layer", (names[3],), False), ("layer", (names[4],), False)]  # the idle wrappers are not
    for cell in (net.small.zero_gather_group, net.big.weight_zero_gather, net.big.bias_zero_gather,
                 net.table.embedding_table_zero_gather):
        cell.gather.recompute(output_recompute=True)  # as reshard_after_forward marks them
    # a MatMul reads its weight in backward; BiasAdd's bias and a Gather's table are not read
    assert [r.regather for r in network_gathers(net)] == [True, True, False, False]
    net.table.recompute()  # a reader recomputed whole needs its tensor again
    assert [r.regather for r in network_gathers(net)] == [True, True, False, True]


class _Uses(nn.Cell):
    """Gathered tensors used in every way the rule knows, and in ways it does not."""

    def __init__(self):
        super().__init__()
        self.norm = ops.LayerNorm(1, 1)
        self.matmul = ops.MatMul(transpose_b=True)
        self.g = nn.Dense(2, 2)  # a child Cell: not a primitive
        self.use_table = False
        for name in ("gamma", "beta", "w", "pos", "plain", "other", "folded", "child"):
            setattr(self, name + "_gather", nn.Identity())

    def construct(self, x):
        y, _, _ = self.norm(x, self.gamma_gather(x).astype(x.dtype), ops.cast(self.beta_gather(x), x.dtype))
        y = self.matmul(y, self.w_gather(x))
        y = y + self.pos_gather(x)[:2]
        y = y + self.plain_gather(x)
        other = self.other_gather(x)
        y = self.norm(y, y, other)[0] + other[0]
        if self.use_table:
            y = self.matmul(y, self.folded_gather(x))
        else:
            y = self.norm(y, y, self.folded_gather(x))[0]
        return self.g(self.child_gather(x)) + y


@pytest.mark.parametrize("attr,reads", [("gamma_gather", True), ("beta_gather", False), ("w_gather", True),
                                        ("pos_gather", False), ("plain_gather", True), ("other_gather", True),
                                        ("folded_gather", False), ("child_gather", True), ("absent", True)])
def test_backward_reads_only_what_no_known_bprop_leaves_out(attr, reads):
    assert backward_reads(_Uses(), attr) is reads


def test_generic_rewrite_readers_are_analysed_in_their_rewritten_code():
    norm = shard_network(nn.LayerNorm((6,)))
    KEEP_ALIVE.append(norm)
    assert backward_reads(norm, "gamma_zero_gather") and not backward_reads(norm, "beta_zero_gather")

