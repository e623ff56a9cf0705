"""Issue 57: ``gathered_parameters`` (DeepSpeed's ``zero.GatheredParameters``) and ``gather_full_params``
of some parameters, at stage 3 over 2 ranks, in GRAPH_MODE and PYNATIVE_MODE.

The N=2 parity job (tests/dist/conftest.py) trains the LoRA model of tests/lora_models.py two steps at
stage 3, its frozen base sharded, then runs tests/dist/workers/gathered_cases.py on every rank.
"""
import json

import mindspore as ms
import numpy as np
import pytest

from parity_cases import GATHERED_CASES
from zero_results import rank_json

WORLD = 2
CASES = [pytest.param(c["name"], id=c["name"]) for c in GATHERED_CASES[WORLD]]


def _results(out, name):
    return rank_json(out, name, WORLD)


@pytest.mark.parity_world(WORLD)
@pytest.mark.parametrize("name", CASES)
def test_inside_the_block_the_listed_parameters_are_full_on_every_rank(parity_jobs, name):
    """Full, unpadded values, the same on every rank (the trained adapter, the frozen embedding); the
    rest stays sharded, so the network holds its shards plus the listed parameters' full values."""
    _, out = parity_jobs(WORLD)
    ranks = _results(out, name)
    listed = set(ranks[0]["listed"])
    for r in ranks:
        for param, shape in r["shapes_inside"].items():
            full, shard = r["full_bytes"][param], r["shard_bytes"][param]
            assert np.prod(shape) * 4 == (full if param in listed else shard), param
        assert r["held_inside"] == r["held_outside"] + sum(r["full_bytes"][p] - r["shard_bytes"][p] for p in listed)
    for param in listed:
        assert ranks[0]["inside"][param] == ranks[1]["inside"][param], param
    # the trained values: what gather_full_params gives for the trainable ones
    for param, value in ranks[0]["full_trainable"].items():
        assert ranks[0]["inside"][param] == value, param


@pytest.mark.parity_world(WORLD)
@pytest.mark.parametrize("name", CASES)
def test_on_exit_the_shards_are_back_and_a_modifier_rank_hands_its_values_to_all(parity_jobs, name):
    _, out = parity_jobs(WORLD)
    for r in _results(out, name):
        assert r["resharded"]  # changes made inside without modifier_rank are dropped
        assert r["same_loss_after"]  # the compiled network runs on the shards given back
        assert r["modifier"]  # modifier_rank=1: every rank's block is of rank 1's value


@pytest.mark.parity_world(WORLD)
@pytest.mark.parametrize("name", CASES)
def test_bad_input_raises_before_anything_changes(parity_jobs, name):
    _, out = parity_jobs(WORLD)
    for r in _results(out, name):
        errors = r["errors"]
        assert "must hold parameters of one network" in errors["two_networks"]
        assert "'modifier_rank' must be None or an integer in [0, 2)" in errors["rank_out_of_range"]
        assert "must hold only Parameters" in errors["not_parameters"]
        assert r["unchanged_after_errors"]
        assert r["whole"] == [[2, 4], [2]]  # parameters that are not sharded pass through


@pytest.mark.parity_world(WORLD)
@pytest.mark.parametrize("name", CASES)
def test_an_adapter_is_exported_inside_the_block_and_by_name(parity_jobs, name):
    """Rank 0 saves the adapter inside the block: the trained values; gather_full_params gives the
    trainable parameters only (rank 0; {} elsewhere) or the ones named."""
    _, out = parity_jobs(WORLD)
    ranks = _results(out, name)
    saved = ms.load_checkpoint(str(out / f"adapter_{name.split('_')[-1]}.ckpt"))
    trainable = ranks[0]["full_trainable"]
    assert sorted(trainable) == sorted(p for p in ranks[0]["listed"] if "embed" not in p)
    assert ranks[1]["full_trainable"] == {}
    for param, value in trainable.items():
        np.testing.assert_array_equal(saved[param].asnumpy(), np.array(value, np.float32), err_msg=param)
    for r in ranks:
        assert list(r["named"]) == ["net.head.weight"] and np.shape(r["named"]["net.head.weight"]) == (7, 8)


@pytest.mark.parity_world(WORLD)
@pytest.mark.parametrize("name", CASES)
def test_frozen_parameters_are_saved_resumed_combined_and_exported_like_sharded_ones(parity_jobs, name, tmp_path):
    """The per-rank save holds each frozen parameter's block (split in the split-info files) and no
    optimizer state of it; a fresh stage-3 network resumes it (every block equal); the offline combine
    and the export give the frozen base's initial values, and the adapter's trained ones."""
    from lora_models import build_own_lora
    from mindone_zero import convert_checkpoints

    _, out = parity_jobs(WORLD)
    ranks = _results(out, name)
    assert all(r["resumed_equal"] for r in ranks)
    mode = name.split("_")[-1]
    step = out / f"ckpt_{mode}" / "step_00000002"
    initial = {f"net.{p.name}": p.asnumpy() for p in build_own_lora().get_parameters()}
    frozen = [n for n in initial if "lora_" not in n and "norm" not in n]
    for r in range(WORLD):
        info = json.loads((step / "params_info" / f"params_split_info_{r}.json").read_text())
        assert all(info[n]["split"] for n in frozen)
        states = ms.load_checkpoint(str(step / f"optimizer_rank{r}.ckpt"))
        assert not [k for k in states if any(k.endswith(n) for n in frozen)], sorted(states)
    for f in ("network_rank0.ckpt", "network_rank1.ckpt"):  # the combine writes beside its input
        (tmp_path / f).write_bytes((step / f).read_bytes())
    combined = ms.load_checkpoint(convert_checkpoints(str(tmp_path / "network_rank{}.ckpt"),
                                                      str(step / "params_info" / "params_split_info_{}.json"), 2))
    exported = ms.load_checkpoint(str(out / f"export_{mode}.ckpt"))
    assert sorted(combined) == sorted(exported) == sorted(initial)
    for n, value in initial.items():
        np.testing.assert_array_equal(combined[n].asnumpy(), exported[n].asnumpy(), err_msg=n)
        if n in frozen:
            np.testing.assert_array_equal(exported[n].asnumpy(), value, err_msg=n)
        elif n in ranks[0]["full_trainable"]:
            np.testing.assert_array_equal(exported[n].asnumpy(), np.array(ranks[0]["full_trainable"][n], np.float32))
