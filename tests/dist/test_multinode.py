"""Two msrun "machines" on loopback (``--node_rank`` 0 and 1, two workers each) train with
hybrid groups: shards within a node ({0,1}, {2,3}), replicas across nodes ({0,2}, {1,3}).
This is the multi-node launch of docs/guides/hybrid-groups.md, with 127.0.0.1 as the master address; the groups come from
``create_hybrid_groups(2)``, whose names must each stand for one rank set across both "machines"."""
import json

import numpy as np
import pytest

from group_names import job_groups
from msrun_harness import run_msrun_nodes
from parity_cases import _case, reference_spec_of
from zero_results import compute_references, gathered_params, load_case, mean_losses, reference
from mindone_zero.core.groups import hybrid_group_names

CASES = [_case(f"s{stage}_nodes_hybrid", stage, accum=2, clip=True, optimizer="momentum", hybrid=True, steps=5)
         for stage in (1, 2, 3)]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_nodes")
    run_msrun_nodes("tests/dist/workers/parity_worker.py", 2, 2, out, ["--cases", json.dumps(CASES)], timeout=900)
    compute_references(out, [reference_spec_of(c) for c in CASES])
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_two_node_hybrid_training_matches_one_process(two_nodes, case):
    ranks = load_case(two_nodes, case["name"], 4)
    spec = reference_spec_of(case)
    ref = reference(two_nodes, spec["steps"], spec["clip"], spec["optimizer"], spec["skipped"], spec["net"])
    np.testing.assert_allclose(mean_losses(ranks, case["accum"]), ref["losses"], rtol=1e-5, atol=1e-6)
    params = gathered_params(ranks)  # also checks that replicas of each stage-3 block are identical
    for name, value in ref["params"].items():
        np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    for name, value in ranks[0].params.items():
        if not (ranks[0].meta["specs"].get(name) or {}).get("split"):
            assert all(np.array_equal(r.params[name], value) for r in ranks[1:]), name


def test_group_names_stand_for_one_rank_set_across_the_nodes(two_nodes):
    groups = job_groups(two_nodes, 4)
    for r in range(4):
        shard, replica = hybrid_group_names(2, 4, r)
        assert groups[shard] == [2 * (r // 2), 2 * (r // 2) + 1]  # within this rank's "machine"
        assert groups[replica] == [r % 2, r % 2 + 2]  # across the two
    for case in CASES:  # the training really communicates over this rank's own groups
        for r, result in enumerate(load_case(two_nodes, case["name"], 4)):
            used = {group for _, group, _, _ in result.meta["plan"]}
            assert set(hybrid_group_names(2, 4, r)) <= used, (case["name"], r, used)
