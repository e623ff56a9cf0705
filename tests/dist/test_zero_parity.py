"""ZeRO stages 0-3 against one process on the whole global batch, at N=2 and N=4.

One msrun job per world size runs every case (stage x mode x accumulation/clipping, plus an
injected overflow); each check below reads that job's per-rank files. The reference shares
no code with mindone_zero (tests/dist/workers/reference.py).
"""
import json

import numpy as np
import pytest

from msrun_harness import run_msrun
from zero_results import gathered_params, load_case, mean_losses, reference

STEPS = 10
STAGES = (0, 1, 2)
MODES = ("graph", "pynative")
# (accumulation, clip, optimizer): clipping is checked with Momentum because Adam's update is
# nearly invariant to a gradient scale, so a wrong clip factor would go unseen.
CONFIGS = {"a1": (1, False, "adam"), "a2clip": (2, True, "momentum")}
EXTRA = {"a1clip": (1, True, "momentum")}  # GRAPH_MODE only, to keep the job short
OVERFLOW_STEP = 3
# Optimizer states are found generically; these are the optimizers the issue names (Adam runs
# in every case above).
OPTIMIZERS = ("adamw", "sgd", "momentum")
RTOL, ATOL = 1e-5, 1e-6


def _cases(world):
    cases = []
    for stage in STAGES:
        for mode in MODES:
            configs = dict(CONFIGS, **(EXTRA if mode == "graph" else {}))
            for key, (accum, clip, opt) in configs.items():
                cases.append(dict(name=f"s{stage}_{mode}_{key}", mode=mode, stage=stage, accum=accum, clip=clip,
                                  optimizer=opt, steps=STEPS))
        if stage > 0 and world == 2:  # optimizer coverage does not depend on the world size
            for opt in OPTIMIZERS:
                cases.append(dict(name=f"s{stage}_graph_opt_{opt}", mode="graph", stage=stage, accum=1, clip=False,
                                  optimizer=opt, steps=5, net="noscalar" if opt == "adamw" else "full"))
        cases.append(dict(name=f"s{stage}_graph_overflow", mode="graph", stage=stage, accum=1, clip=False,
                          optimizer="adam", steps=6, overflow_step=OVERFLOW_STEP, dynamic_scale=True))
    return cases


CASES = {world: _cases(world) for world in (2, 4)}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """world size -> output folder of that world size's msrun job (run once, on first use)."""
    done = {}

    def get(world):
        if world not in done:
            out = tmp_path_factory.mktemp(f"parity_N{world}")
            try:
                run_msrun("tests/dist/workers/parity_worker.py", world, out, ["--cases", json.dumps(CASES[world])],
                          timeout=1200)
                done[world] = out
            except AssertionError as e:  # a failed job fails every test that reads it, without rerunning
                done[world] = e
        if isinstance(done[world], AssertionError):
            raise done[world]
        return world, done[world]

    return get


def _world_cases(select):
    return [pytest.param(w, c, id=f"N{w}-{c['name']}") for w in (2, 4) for c in CASES[w] if select(c)]


TRAINING = _world_cases(lambda c: "overflow_step" not in c)


def _ref_for(case, out):
    return reference(out, case["steps"], case["clip"], case["optimizer"], net=case.get("net", "full"))


@pytest.mark.parametrize("world,case", TRAINING)
def test_parity_with_single_process(jobs, world, case):
    world, out = jobs(world)
    ranks = load_case(out, case["name"], world)
    ref = _ref_for(case, out)
    if case["clip"]:
        assert (ref["norms"] > 2.0).any(), "the reference never clipped, so clipping is untested"
    np.testing.assert_allclose(mean_losses(ranks, case["accum"]), ref["losses"], rtol=RTOL, atol=ATOL)
    params = gathered_params(ranks)
    assert sorted(params) == sorted(ref["params"])
    for name, value in ref["params"].items():
        np.testing.assert_allclose(params[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("world,case", TRAINING)
def test_replicas_bit_identical(jobs, world, case):
    world, out = jobs(world)
    ranks = load_case(out, case["name"], world)
    for name, value in ranks[0].params.items():
        spec = ranks[0].meta["specs"].get(name)
        if spec and spec["split"]:
            continue  # a ZeRO-3 shard differs per rank by design; its parity is checked gathered
        for r in ranks[1:]:
            assert np.array_equal(r.params[name], value), f"{name} differs between rank 0 and rank {ranks.index(r)}"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stage", [s for s in STAGES if s > 0])
def test_optimizer_state_bytes_are_padded_one_nth(jobs, world, stage):
    world, out = jobs(world)
    full = load_case(out, "s0_graph_a1", world)[0]
    params = full.params
    per_param_states = full.meta["state_bytes"] / sum(v.nbytes for v in params.values())
    assert per_param_states == 2  # Adam: moment1 and moment2
    expected = 0
    for name, value in params.items():
        if value.ndim >= 1:
            rows = -(-value.shape[0] // world)
            expected += 2 * rows * int(np.prod(value.shape[1:])) * value.itemsize
        else:
            expected += 2 * value.nbytes
    for r in load_case(out, f"s{stage}_graph_a1", world):
        assert r.meta["state_bytes"] == expected


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stage", STAGES)
def test_overflow_skips_step_on_every_rank(jobs, world, stage):
    world, out = jobs(world)
    case = next(c for c in CASES[world] if c["name"] == f"s{stage}_graph_overflow")
    ranks = load_case(out, case["name"], world)
    for r in ranks:
        expected_flags = np.arange(case["steps"]) == OVERFLOW_STEP
        assert np.array_equal(r.overflows, expected_flags), r.overflows
        assert r.scales[OVERFLOW_STEP] == 2.0 ** 10 and r.scales[OVERFLOW_STEP + 1] == 2.0 ** 9
        assert r.final_scale == ranks[0].final_scale == 2.0 ** 9
    ref = reference(out, case["steps"], False, "adam", skipped=(OVERFLOW_STEP,))
    params = gathered_params(ranks)
    for name, value in ref["params"].items():
        np.testing.assert_allclose(params[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("world", [2, 4])
def test_split_info_json_describes_every_shard(jobs, world):
    world, out = jobs(world)
    for r in range(world):
        with open(out / "s1_graph_a1_info" / f"params_split_info_{r}.json") as f:
            info = json.load(f)
        ranks = load_case(out, "s0_graph_a1", world)
        for name, value in ranks[0].params.items():
            entry = info[name]
            assert entry["rank_id"] == r and entry["group_size"] == world
            assert entry["shape"] == list(value.shape)
            assert entry["split"] == (value.ndim >= 1)
            assert entry["pad"] == ((-(-value.shape[0] // world)) * world - value.shape[0] if value.ndim else 0)
            for state in ("moment1", "moment2"):
                assert info[f"{state}.{name}"]["split"] == entry["split"]


@pytest.mark.parametrize("world", [2, 4])
def test_build_errors_name_argument_and_value(jobs, world):
    world, out = jobs(world)
    for r in range(world):
        with open(out / f"errors_rank{r}.json") as f:
            errors = json.load(f)
        assert errors["no_dp_group"].startswith("ValueError") and "'dp_group'" in errors["no_dp_group"]
        assert "zero_sub" in errors["no_dp_group"]
        assert errors["factored_stage1"].startswith("ValueError") and "row.net.embedding.embedding_table" in errors["factored_stage1"]
        assert errors["factored_stage0"] is None  # nothing is sharded at stage 0, so any optimizer works
