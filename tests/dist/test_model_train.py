"""MindOne's training loop runs unchanged (issue 20): ``ms.Model(train_net).train`` with callbacks that
follow MindOne's ``EvalSaveCallback`` (EMA swaps, per-rank resume files, online and offline
combine), N=2, stages 0-3, GRAPH and PYNATIVE, both split rules and EMA layouts, resume the MindOne
way. One msrun job runs every case (tests/dist/workers/model_train_worker.py).
"""
import json

import numpy as np
import pytest

from msrun_harness import run_msrun

WORLD = 2
RTOL, ATOL = 1e-5, 1e-6
MODES = ("graph", "pynative")
SAVED_STEPS = ("3", "6")
# the network's parameters whose dim 0 divides by 2 (MindOne's rule splits only these)
EVEN = {"net.hidden.weight", "net.hidden.bias"}
ALL = EVEN | {"net.conv.weight", "net.conv.bias", "net.norm.gamma", "net.norm.beta", "net.head.weight", "net.head.bias"}
# The Conv computes in float16: its gradients carry float16 rounding (2**-10 relative). Stage 0 and a
# ZeRO stage compile different graphs, and on some CPUs (not others) the two round the Conv's products
# differently: its final weights then differ from stage 0's by a few float16 ulps of the gradient
# (measured 3.2e-5 absolute, 3 of 135 elements, on the same code before and after the package move).
# Every float32 parameter keeps RTOL/ATOL.
FP16_COMPUTED = {"net.conv.weight", "net.conv.bias"}
FP16_RTOL, FP16_ATOL = 1e-3, 1e-4


def _case(name, mode, stage, **kw):
    return dict(name=name, mode=mode, stage=stage, **kw)


TRAINED = (
    [_case(f"s{s}_{m}", m, s, combine_online=(s == 3)) for s in range(4) for m in MODES]
    + [_case("s3files_graph", "graph", 3)]
    + [_case(f"p{s}_{m}", m, s, pad_uneven=True, shard_ema=True) for s in (1, 2, 3) for m in MODES]
    + [_case("r3_graph", "graph", 3, callback_ranks="rank0"), _case("o1_graph", "graph", 1, offload=True)]
)
RESUMED = (
    [_case(f"rs{s}_graph", "graph", s, combine_online=(s == 3), resume_from={"case": f"s{s}_graph", "step": 3})
     for s in range(4)]
    + [_case("rs3_pynative", "pynative", 3, combine_online=True, resume_from={"case": "s3_pynative", "step": 3})]
    + [_case(f"rp{s}_graph", "graph", s, pad_uneven=True, shard_ema=True, resume_from={"case": f"p{s}_graph", "step": 6})
       for s in (1, 3)]
)
CASES = {c["name"]: c for c in TRAINED + RESUMED}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("model_train")
    run_msrun("tests/dist/workers/model_train_worker.py", WORLD, out, ["--cases", json.dumps(TRAINED + RESUMED)],
              timeout=1500)

    def load(name, rank):
        with open(out / f"{name}_rank{rank}.json") as f:
            return json.load(f)

    return load


def _reference(name):
    case = CASES[name]
    return f"s0_{case['mode']}"


def _series(log, key):
    return [s[key] for s in log["steps"]]


@pytest.mark.parametrize("name", [c["name"] for c in TRAINED if c["name"] not in ("s0_graph", "s0_pynative")])
def test_losses_and_callback_values_equal_stage_0(job, name):
    for rank in range(WORLD):
        got, ref = job(name, rank), job(_reference(name), rank)
        assert len(got["steps"]) == 8, "request_stop() at step 8 of 9"
        np.testing.assert_allclose(_series(got, "loss"), _series(ref, "loss"), rtol=RTOL, atol=ATOL)
        for key in ("overflow", "scale", "global_step", "lr", "scale_sense"):
            assert _series(got, key) == _series(ref, key), key
        assert _series(got, "overflow")[:2] == [True, True], "the first two steps overflow the loss scale"


@pytest.mark.parametrize("name", [c["name"] for c in TRAINED])
def test_every_weight_moves_on_the_step_after_a_swap(job, name):
    """In PYNATIVE a swap that installed new tensors froze the jitted optimizer's buffers."""
    swapping = [0, 1] if CASES[name]["stage"] == 3 or CASES[name].get("shard_ema") else [0]
    if CASES[name].get("callback_ranks") == "rank0":
        swapping = [0]
    for rank in range(WORLD):
        log = job(name, rank)
        checks = log["frozen_after_swap"]
        assert len(checks) == (2 if rank in swapping else 0)
        assert checks == [[]] * len(checks)
        # the swap put the EMA in (other values) and the trained weights back exactly
        assert log["swap_checks"] == [{"ema_differs": True, "restored": True}] * len(checks)


@pytest.mark.parametrize("name", [c["name"] for c in TRAINED])
def test_final_weights_equal_stage_0_and_replicas_agree(job, name):
    ref = job(_reference(name), 0)["full"]
    ranks = [job(name, r)["full"] for r in range(WORLD)]
    assert sorted(ranks[0]) == sorted(ref)
    for key in ref:
        rtol, atol = (FP16_RTOL, FP16_ATOL) if key in FP16_COMPUTED else (RTOL, ATOL)
        np.testing.assert_allclose(ranks[0][key], ref[key], rtol=rtol, atol=atol, err_msg=key)
        assert ranks[1][key] == ranks[0][key], f"{key} differs between ranks"


@pytest.mark.parametrize("name", [c["name"] for c in TRAINED if c["name"] != "r3_graph"])
def test_saved_checkpoints_load_into_the_unsharded_network_and_equal_stage_0(job, name):
    """Online combine (AllGather of the flagged parameters) returns exact shapes under MindOne's
    split rule; the offline combine does under either rule; the EMA weights are what is saved."""
    got, ref = job(name, 0)["saved"], job(_reference(name), 0)["saved"]
    assert sorted(got) == list(SAVED_STEPS)
    for step in SAVED_STEPS:
        (report, values), (_, ref_values) = got[step], ref[step]
        assert report == {"not_loaded": [], "unused": []}, report
        for key in ref_values:
            np.testing.assert_allclose(values[key], ref_values[key], rtol=RTOL, atol=ATOL, err_msg=f"{step} {key}")


@pytest.mark.parametrize("name", [c["name"] for c in TRAINED])
def test_split_flags_follow_the_rule_in_force(job, name):
    case = CASES[name]
    flags = job(name, 0)["flags"]
    assert set(flags) == ALL
    split = {k for k, v in flags.items() if v}
    if case["stage"] < 3:
        assert split == set()  # the network holds whole weights; the shards are the optimizer's
    else:
        assert split == (ALL if case.get("pad_uneven") else EVEN)


@pytest.mark.parametrize("name", [c["name"] for c in TRAINED])
def test_one_warning_names_the_padded_parameters(job, name):
    # the padded-split warning; stage 3 under MindOne's rule also names the option, in another
    # warning (the parameters it leaves whole), checked by tests/dist/test_sharded_build.py
    warnings = [w for w in job(name, 0)["warnings"] if "split with zero padding" in w]
    if CASES[name].get("pad_uneven"):
        assert len(warnings) == 1
        assert "net.conv.weight" in warnings[0] and "net.hidden.weight" not in warnings[0]
        assert "gather_full_params" in warnings[0]
    else:
        assert warnings == []


@pytest.mark.parametrize("name", [c["name"] for c in RESUMED])
def test_resume_with_load_param_into_net_continues_the_run(job, name):
    case = CASES[name]
    source, step = case["resume_from"]["case"], case["resume_from"]["step"]
    for rank in range(WORLD):
        got, ref = job(name, rank), job(source, rank)
        assert got["resume"] == {"not_loaded": [], "unused": []}
        assert len(got["steps"]) == 8 - step
        assert _series(got, "loss") == _series(ref, "loss")[step:]
        for key in ("overflow", "scale", "global_step", "lr"):
            assert _series(got, key) == _series(ref, key)[step:], key
        assert got["full"] == ref["full"]
