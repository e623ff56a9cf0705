"""create_hybrid_groups in one process: every rank of a job simulated in turn, with MindSpore's
create_group, get_rank and get_group_size replaced by fakes that record what would be created.

tests/dist/test_groups.py runs the real function under msrun; test_multinode.py checks the names
the parity worker's training uses, across the job.
"""
import numpy as np
import pytest

import mindone_zero
from mindone_zero.core import groups
from mindone_zero.core.comm import world_group

SIZES = [(w, s) for w in (1, 2, 4, 6, 8, 12, 16, 64) for s in range(1, w + 1) if w % s == 0]


class FakeJob:
    """One rank's view of a job of ``world`` ranks: records each create_group call."""

    def __init__(self, monkeypatch, world, rank):
        self.calls = []
        monkeypatch.setattr(groups, "_CREATED", {})
        monkeypatch.setattr(groups, "get_group_size", lambda group=None: self._world_only(group, world))
        monkeypatch.setattr(groups, "get_rank", lambda group=None: self._world_only(group, rank))
        monkeypatch.setattr(groups, "create_group", lambda name, members: self.calls.append((name, list(members))))

    @staticmethod
    def _world_only(group, value):
        # the names and members come from the world rank and size alone, before any group exists
        assert group is None, f"queried group {group!r}"
        return value


def _run_job(monkeypatch, world, shard_size):
    """{rank: (returned names, create_group calls)} for every rank of the job."""
    out = {}
    for rank in range(world):
        job = FakeJob(monkeypatch, world, rank)
        out[rank] = (mindone_zero.create_hybrid_groups(shard_size), job.calls)
    return out


@pytest.mark.parametrize("world,shard_size", SIZES)
def test_names_are_unique_across_the_job_and_groups_tile_it(monkeypatch, world, shard_size):
    job = _run_job(monkeypatch, world, shard_size)
    members_of = {world_group(): list(range(world))}
    for rank, ((op, dp), calls) in job.items():
        for name, members in calls:
            assert members_of.setdefault(name, members) == members, f"{name!r} names {members_of[name]} and {members}"
            assert rank in members and members == sorted(members) and len(set(members)) == len(members)
            assert len(name) < 64, name
        op_members = members_of[op]
        assert op_members == list(range(rank - rank % shard_size, rank - rank % shard_size + shard_size))
        if dp is None:
            assert shard_size == world and op == world_group() and calls == []
            continue
        dp_members = members_of[dp]
        assert dp_members == [r for r in range(world) if r % shard_size == rank % shard_size]
        assert len(op_members) * len(dp_members) == world and set(op_members) & set(dp_members) == {rank}
        assert (dp == world_group()) == (shard_size == 1)
        assert len(calls) == (1 if shard_size == 1 else 2) and calls[0][0] == op  # shard group first everywhere
    # one name per distinct rank set, and every group of the grid exists
    assert len(set(map(tuple, members_of.values()))) == len(members_of)
    expected = 0 if shard_size == world else world // shard_size + (shard_size if shard_size > 1 else 0)
    assert len(members_of) - 1 == expected


def test_names_encode_the_members():
    assert groups.hybrid_group_names(2, 4, 3) == ("zero_shard_2_3", "zero_replica_1_3")
    assert groups.hybrid_group_names(8, 16, 9) == ("zero_shard_8_9_10_11_12_13_14_15", "zero_replica_1_9")
    assert groups.hybrid_group_names(16, 64, 35) == ("zero_shard_32_to_47_by_1", "zero_replica_3_19_35_51")
    assert groups.hybrid_group_names(2, 64, 5) == ("zero_shard_4_5", "zero_replica_1_to_63_by_2")
    assert groups.hybrid_group_names(4, 4, 1) == (world_group(), None)
    assert groups.hybrid_group_names(1, 4, 1) == ("zero_shard_1", world_group())
    assert groups.hybrid_group_members(np.int64(2), 4, np.int64(1)) == ([0, 1], [1, 3])


def test_second_call_returns_the_same_names_and_creates_nothing(monkeypatch):
    job = FakeJob(monkeypatch, 8, 5)
    first = groups.create_hybrid_groups(4)
    assert first == ("zero_shard_4_5_6_7", "zero_replica_1_5")
    assert groups.create_hybrid_groups(4) == first
    assert job.calls == [("zero_shard_4_5_6_7", [4, 5, 6, 7]), ("zero_replica_1_5", [1, 5])]
    assert groups.created_groups() == {"zero_shard_4_5_6_7": [4, 5, 6, 7], "zero_replica_1_5": [1, 5]}
    assert groups.create_hybrid_groups(2) == ("zero_shard_4_5", "zero_replica_1_3_5_7")  # another size: new groups
    assert len(job.calls) == 4
    assert groups.create_hybrid_groups(8) == (world_group(), None) and len(job.calls) == 4


@pytest.mark.parametrize("bad,text", [
    (0, "must be an integer >= 1, but got 0."),
    (-2, "must be an integer >= 1, but got -2."),
    (True, "must be an integer >= 1, but got True."),
    (2.0, "must be an integer >= 1, but got 2.0."),
    ("2", "must be an integer >= 1, but got '2'."),
    (None, "must be an integer >= 1, but got None."),
    (3, "must divide the world size 8, but got 3."),
    (16, "must divide the world size 8, but got 16."),
])
def test_bad_size_raises_naming_it_before_any_group_is_created(monkeypatch, bad, text):
    job = FakeJob(monkeypatch, 8, 3)
    with pytest.raises(ValueError) as err:
        groups.create_hybrid_groups(bad)
    assert str(err.value) == f"For 'create_hybrid_groups', the argument 'shard_size' {text}"
    assert job.calls == [] and groups.created_groups() == {}


def test_bad_rank_of_the_pure_functions():
    with pytest.raises(ValueError, match=r"'rank' must be an integer in \[0, 4\), but got 4\."):
        groups.hybrid_group_members(2, 4, 4)
    with pytest.raises(ValueError, match=r"For 'hybrid_group_names', the argument 'shard_size' must divide"):
        groups.hybrid_group_names(3, 4, 0)


def test_exported():
    assert "create_hybrid_groups" in mindone_zero.__all__
    assert mindone_zero.create_hybrid_groups is groups.create_hybrid_groups
