"""The collectives a ZeRO-3 step executes are the ones its CommPlan records: tools/profile_step.py
counts the AllGather and AllReduce kernels MindSpore's profiler saw run in 2 optimizer steps of the
demo LM (N=2, 2 micro-steps each, clipping), per-Cell coalesced gathers and gather units."""
import json

from tools.profile_step import COLLECTIVES, main


def test_executed_collectives_match_the_comm_plan(tmp_path):
    assert main(["--model", "lm", "--settings", "3", "3:units,keep", "--steps", "2", "--world_size", "2",
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "profile.json").read_text())
    executed = {label: sum(n for kind, (_, n) in r["ops"].items() if kind in COLLECTIVES)
                for label, r in results.items()}
    planned = {label: r["planned_collectives"] for label, r in results.items()}
    # [Note: coalesced gathers]: 93 per optimizer step; [Note: gather units]: 11
    assert planned == {"3": 93, "3 (units, keep)": 11}
    assert executed == planned
    assert (tmp_path / "profile.md").read_text().count("| collectives in the CommPlan | 93 | 11 |") == 1
