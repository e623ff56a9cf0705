"""create_hybrid_groups under msrun at N=4 (tests/dist/workers/groups_worker.py), on the real backend:
bad sizes raise before any group exists, the groups hold the ranks their names say (as the
backend reports them and as an all-gather over them runs), a second call creates nothing, and no
name stands for two rank sets across the job. tests/unit/test_groups.py covers the same logic
over many world sizes in one process."""
import json

import pytest

from group_names import job_groups
from msrun_harness import run_msrun
from mindone_zero.core.groups import hybrid_group_names

WORLD = 4


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("groups")
    run_msrun("tests/dist/workers/groups_worker.py", WORLD, out, ["--cases", json.dumps(["run"])], timeout=600)
    return out, [json.loads((out / f"report_rank{r}.json").read_text()) for r in range(WORLD)]


def test_bad_sizes_raise_naming_the_argument_before_any_group_is_created(job):
    _, reports = job
    for report in reports:
        for value, message in report["bad"].items():
            assert message is not None and message.startswith("ValueError: For 'create_hybrid_groups', the argument "
                                                              f"'shard_size' must "), (value, message)
            assert message.endswith(f"but got {value}."), message
        assert report["created_after_bad"] == {}


def test_groups_hold_the_ranks_their_names_say(job):
    out, reports = job
    world = reports[0]["pairs"]["world"][0]
    for rank, report in enumerate(reports):
        pairs = report["pairs"]
        assert pairs["two"] == list(hybrid_group_names(2, WORLD, rank))
        assert pairs["one"] == [f"zero_shard_{rank}", world]
        assert pairs["world"] == [world, None]
        shard, replica = pairs["two"]
        expected = {shard: [rank - rank % 2, rank - rank % 2 + 1], replica: [rank % 2, rank % 2 + 2],
                    f"zero_shard_{rank}": [rank], world: list(range(WORLD))}
        assert report["gathered"] == expected  # the all-gather over each group, in group-rank order
        assert report["check"] == {"two": None, "two_again": None, "one": None, "world": None}
    groups = job_groups(out, WORLD)  # the backend's members; one rank set per name across the job
    assert len(groups) == 1 + 2 + 2 + WORLD  # world, shards of 2, replicas of 2, shards of 1


def test_second_call_returns_the_same_names_and_creates_nothing(job):
    _, reports = job
    for report in reports:
        assert report["pairs"]["two_again"] == report["pairs"]["two"]
        assert report["created_after_two_again"] == report["created_after_two"]
        assert sorted(report["created_after_two"]) == sorted(report["pairs"]["two"])
        assert len(report["created"]) == 3  # plus the one-rank shard group; the world group is never created
