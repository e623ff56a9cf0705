"""[Note: comm plan]: the one interface (``record_comm(plan, ctx)``), the walk that finds recorders,
and the buckets' and the train step's plans, in one process (the ZeRO-3 recorders against executed
collectives: tests/dist/test_profile_collectives.py, test_gather_units.py, test_zeropp.py)."""
import numpy as np
import pytest
from mindspore import Tensor, nn

from mindone_zero.core import comm
from mindone_zero.core.comm_plan import CommPlan, CommRecorder, PlanContext, comm_recorders
from mindone_zero.train.fusion import BucketedComm
from mindone_zero.train.train_step import TrainOneStepWrapper


class _Comm:
    group, size = "g", 4


class _Recorder(nn.Cell):
    """Records one 8-byte all-reduce per micro-step, and owns a child recorder it does not call."""

    def __init__(self, child=None):
        super().__init__()
        if child is not None:
            self.child = child

    def record_comm(self, plan, ctx):
        plan.add("all_reduce", "g", 8, 2, times=ctx.micro_steps)


class _NamedRecord(nn.Cell):
    """A user's Cell with a method called ``record``: not a recorder."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def record(self, *args):
        raise AssertionError("called")


def test_comm_plan_is_the_same_class_from_comm():
    assert comm.CommPlan is CommPlan


def test_context_counts_reductions_and_regathers():
    assert PlanContext(micro_steps=3).reductions == 3
    assert PlanContext(micro_steps=3, reduce_each_micro_step=False).reductions == 1
    ctx = PlanContext(regathered=frozenset({"a", "b"}))
    assert ctx.regathers(("a", "b")) and not ctx.regathers(("a", "c"))


def test_walk_takes_outermost_recorders_once_and_skips_other_cells():
    inner = _Recorder()
    outer = _Recorder(child=_Recorder())
    shared = _Recorder()
    net = nn.SequentialCell([_NamedRecord(inner), outer, shared, nn.SequentialCell([shared])])
    found = comm_recorders([net])
    assert [id(c) for c in found] == [id(inner), id(outer), id(shared)]
    assert comm_recorders([outer]) == [outer]  # a root that records is its own recorder
    assert not isinstance(_NamedRecord(inner), CommRecorder)


@pytest.mark.parametrize("kind,times,nbytes", [("all_reduce", 3, 40), ("reduce_scatter", 3, 40), ("all_gather", 1, 160)])
def test_buckets_record_each_call_of_one_optimizer_step(kind, times, nbytes):
    shapes = [(2, 3), (4,)]  # 24 + 16 bytes of float32: one bucket
    tensors = [Tensor(np.zeros(s, np.float32)) for s in shapes]
    buckets = BucketedComm(_Comm(), shapes, tensors, bucket_size=1 << 20, kind=kind)
    plan = CommPlan()
    buckets.record_comm(plan, PlanContext(micro_steps=3))
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
