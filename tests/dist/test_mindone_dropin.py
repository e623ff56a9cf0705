"""A MindOne-style training script (tests/dist/workers/mindone_style_worker.py) runs unchanged on
mindone_zero and gives at stages 1-3 the losses, EMA evaluation and weights of stage 0 (issue 9).

One msrun job at N=2 runs every case: stages 0-3 x GRAPH/PYNATIVE x without/with a comm-fusion
dict, plus an experimental optimizer, stage 0 following ``gradients_mean``, bad inputs, and MindOne
0.2.0's ``op_group=`` naming a group of the script's own at stages 1 and 3 (issue 48).
"""
import json

import numpy as np
import pytest

from msrun_harness import run_msrun

WORLD = 2
STEPS = 4
RTOL, ATOL = 1e-5, 1e-6
MODES = ("graph", "pynative")


def _name(stage, mode, fusion):
    return f"s{stage}_{mode}_{'fused' if fusion else 'plain'}"


MAIN = [dict(name=_name(s, m, f), mode=m, stage=s, fusion=f, optimizer="adam", steps=STEPS)
        for s in range(4) for m in MODES for f in (False, True)]
EXTRA = [
    dict(name="exp_adamw_s0", mode="graph", stage=0, fusion=False, optimizer="exp_adamw", steps=3),
    dict(name="exp_adamw_s2", mode="graph", stage=2, fusion=False, optimizer="exp_adamw", steps=3),
    dict(name="exp_adamw_s3", mode="graph", stage=3, fusion=False, optimizer="exp_adamw", steps=3),
    # SGD: summed gradients with lr equal mean gradients with lr * N
    dict(name="sgd_mean", mode="graph", stage=0, fusion=False, optimizer="sgd", steps=3, lr=0.04),
    dict(name="sgd_sum", mode="graph", stage=0, fusion=False, optimizer="sgd", steps=3, lr=0.02,
         gradients_mean=False),
    *[dict(name=f"op_group_s{s}", mode="graph", stage=s, fusion=False, optimizer="adam", steps=STEPS, op_group=True)
      for s in (1, 3)],
]
COMPARED = [pytest.param(s, m, f, id=_name(s, m, f)) for s in (1, 2, 3) for m in MODES for f in (False, True)]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("mindone_dropin")
    run_msrun("tests/dist/workers/mindone_style_worker.py", WORLD, out, ["--cases", json.dumps(MAIN + EXTRA)],
              timeout=1500)
    return out


class Result:
    def __init__(self, out, name, rank):
        data = np.load(out / f"{name}_rank{rank}.npz")
        self.losses, self.evals = data["losses"], data["evals"]
        self.full = {k[len("full/"):]: data[k] for k in data.files if k.startswith("full/")}
        with open(out / f"{name}_rank{rank}.json") as f:
            self.meta = json.load(f)


def _ranks(out, name):
    return [Result(out, name, r) for r in range(WORLD)]


def _assert_same_training(got, ref):
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g.losses, r.losses, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(g.evals, r.evals, rtol=RTOL, atol=ATOL)
        assert sorted(g.full) == sorted(r.full)
        for name, value in r.full.items():
            np.testing.assert_allclose(g.full[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("stage,mode,fusion", COMPARED)
def test_stage_matches_stage0_losses_ema_eval_and_weights(job, stage, mode, fusion):
    got, ref = _ranks(job, _name(stage, mode, fusion)), _ranks(job, _name(0, mode, fusion))
    _assert_same_training(got, ref)
    assert any(k.startswith("ema.") for k in ref[0].full), "the EMA weights must be compared too"
    # the EMA changes the evaluation (else the swap is untested), and the swap back is exact
    for r in got + ref:
        trained, with_ema, back = r.evals
        assert abs(with_ema - trained) > 1e-4
        assert back == trained and r.meta["restored"]


@pytest.mark.parametrize("mode", MODES)
def test_stage0_is_the_same_in_both_fusion_settings(job, mode):
    _assert_same_training(_ranks(job, _name(0, mode, True)), _ranks(job, _name(0, mode, False)))


@pytest.mark.parametrize("mode", MODES)
def test_mindone_signature_parallel_module_used_at_stage3(job, mode):
    for r in _ranks(job, _name(3, mode, False)):
        assert r.meta["used_parallel_module"]
        assert r.meta["split"]["net.scale.weight"]  # sharded, gathered by the user's class
    for r in _ranks(job, _name(2, mode, False)):
        assert not r.meta["used_parallel_module"]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_parallel_optimizer_says_which_parameters_are_shards(job, stage):
    ref = _ranks(job, _name(0, "graph", False))
    for rank, r in enumerate(_ranks(job, _name(stage, "graph", False))):
        flags, shapes = r.meta["flags"], r.meta["shapes"]
        assert r.meta["zero_stage"] == stage
        full = ref[rank].full
        checked = 0
        for name, flag in flags.items():
            if ".bias" in name:
                assert not flag, name  # opted out by the script: whole everywhere
            if name in full:  # network parameters and EMA weights: a shard is smaller than the full tensor
                assert flag == (tuple(shapes[name]) != full[name].shape), (name, flag, shapes[name])
                checked += 1
            if name.startswith(("master.", "moment1.", "moment2.")):
                # MindOne's split rule: a shard exists when dim 0 divides by the group size
                shape = full[name.split(".", 1)[1]].shape
                assert flag == (stage > 0 and ".bias" not in name and len(shape) > 0 and shape[0] % WORLD == 0), name
        assert checked == len(full)
        assert any(flags.values()) == (stage > 0)


@pytest.mark.parametrize("mode", MODES)
def test_mindone_online_combine_recipe_gives_the_full_parameters(job, mode):
    for r in _ranks(job, _name(3, mode, False)):
        combined = r.meta["online_combine"]
        assert any(r.meta["split"].values())
        for name, value in combined.items():
            np.testing.assert_array_equal(np.array(value, np.float32), r.full[name], err_msg=name)


@pytest.mark.parametrize("stage", [2, 3])
def test_experimental_optimizer_is_sharded_and_matches_stage0(job, stage):
    _assert_same_training(_ranks(job, f"exp_adamw_s{stage}"), _ranks(job, "exp_adamw_s0"))


def test_stage0_follows_gradients_mean(job):
    summed, mean = _ranks(job, "sgd_sum"), _ranks(job, "sgd_mean")
    _assert_same_training(summed, mean)
    assert not np.allclose(summed[0].losses, _ranks(job, "exp_adamw_s0")[0].losses)


@pytest.mark.parametrize("stage", [1, 3])
def test_op_group_of_mindone_020_shards_over_the_named_group(job, stage):
    got = _ranks(job, f"op_group_s{stage}")
    _assert_same_training(got, _ranks(job, _name(0, "graph", False)))
    for r in got:
        assert r.meta["zero_stage"] == stage and r.meta["op_group"] == "script_op_group"
        assert r.meta["cell_groups"] == (["script_op_group"] if stage == 3 else [])
        assert any(r.meta["flags"].values())  # something is sharded over it
    for r in _ranks(job, _name(stage, "graph", False)):
        assert r.meta["op_group"] != "script_op_group"  # the default is the world group


def test_incompatible_inputs_raise_before_anything_is_modified(job):
    for rank in range(WORLD):
        with open(job / f"errors_rank{rank}.json") as f:
            errors = json.load(f)
        ema = errors["ema_without_update"]
        assert ema["message"].startswith("TypeError") and "ema_update()" in ema["message"]
        assert "EMAWithoutUpdate" in ema["message"]
        opt = errors["factored_optimizer"]
        assert opt["message"].startswith("ValueError") and "row." in opt["message"]
        for result in errors.values():
            assert result["unchanged"] and result["no_file"], result
