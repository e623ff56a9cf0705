"""Issue 57: a LoRA fine-tune at stages 0-3, its frozen base sharded at stage 3.

The parity jobs (tests/dist/conftest.py) train ``parity_cases.LORA_CASES``: the suite's own LoRA layer
with PEFT's structure (``tests/lora_models.py``: a ``base_layer``, ``CellDict``s of adapters, reads
through local variables and of ``lora_A.weight.dtype``) at every stage, N=2 and N=4, with accumulation
and clipping, and the same model wrapped by ``mindone.peft`` where it imports. Each stage gives stage
0's losses at every micro-step and its final trainable parameters; at stage 3 every frozen parameter is
split and a rank holds its block (padding rows included), at stages 0-2 every frozen parameter whole.
"""
import json

import numpy as np
import pytest

from parity_cases import LORA_CASES, STAGES
from mindone_zero.core.partition import shard_rows
from zero_results import gathered_params, load_case, mean_losses

RTOL, ATOL = 1e-5, 1e-6
OWN = [pytest.param(w, c, id=f"N{w}-{c['name']}") for w, cases in LORA_CASES.items() for c in cases
       if c["net"] == "lora" and c["stage"] > 0]
PEFT = [pytest.param(w, c, id=f"N{w}-{c['name']}") for w, cases in LORA_CASES.items() for c in cases
        if c["net"] == "lora_peft" and c["stage"] > 0]


def _load(out, case, world):
    """The case's rank results; skips (saying why) a mindone.peft case whose job could not import it."""
    meta = json.loads((out / f"{case['name']}_rank0.json").read_text())
    if "skipped" in meta:
        pytest.skip(meta["skipped"])
    return load_case(out, case["name"], world)


def _matches_stage0(out, case, world):
    ranks = _load(out, case, world)
    base = _load(out, dict(case, name=case["name"].replace(f"_s{case['stage']}_", "_s0_").replace("pynative", "graph")),
                 world)
    np.testing.assert_allclose(mean_losses(ranks, case["accum"]), mean_losses(base, case["accum"]), rtol=RTOL,
                               atol=ATOL)
    for r, b in zip(ranks, base):  # every micro-step on every rank, not only the means
        np.testing.assert_allclose(r.losses, b.losses, rtol=RTOL, atol=ATOL)
    base_params, params = gathered_params(base), gathered_params(ranks)
    assert sorted(params) == sorted(base_params) and any("lora_A" in n for n in params)
    for name, value in base_params.items():
        np.testing.assert_allclose(params[name], value, rtol=RTOL, atol=ATOL, err_msg=name)
    assert not any("base_layer" in n or "embed" in n or "head" in n for n in params)  # only the adapters and norm train
    return ranks


def _check_frozen_layout(ranks, case, world):
    for rank in ranks:
        frozen = rank.meta["frozen"]
        assert len(frozen) == 7, sorted(frozen)  # the embedding, two base layers' weight and bias, the head's pair
        for name, entry in frozen.items():
            if case["stage"] < 3:
                assert not entry["split"] and entry["held"] == entry["full"], name
            else:
                assert entry["split"], name
                shape = entry["shape"]
                block = shard_rows(shape[0], world) * int(np.prod(shape[1:])) * entry["itemsize"]
                assert entry["held"] == block, name


@pytest.mark.parametrize("world,case", OWN)
def test_own_lora_layer_matches_stage0_every_step(parity_jobs, world, case):
    world, out = parity_jobs(world)
    _check_frozen_layout(_matches_stage0(out, case, world), case, world)


@pytest.mark.parametrize("world,case", PEFT)
def test_mindone_peft_lora_matches_stage0_every_step(parity_jobs, world, case):
    world, out = parity_jobs(world)
    _check_frozen_layout(_matches_stage0(out, case, world), case, world)


@pytest.mark.parametrize("world", sorted(LORA_CASES))
def test_frozen_parameters_hold_one_block_at_stage3_only(parity_jobs, world):
    """Frozen bytes a rank holds: the full model's at stage 0, about 1/N of it at stage 3."""
    world, out = parity_jobs(world)
    held = {}
    for stage in STAGES:
        ranks = load_case(out, f"lora_s{stage}_graph", world)
        held[stage] = [sum(e["held"] for e in r.meta["frozen"].values()) for r in ranks]
    full = sum(e["full"] for e in load_case(out, "lora_s0_graph", world)[0].meta["frozen"].values())
    assert held[0] == held[1] == held[2] == [full] * world
    assert all(full / world <= h < full / world * 1.35 for h in held[3]), (held[3], full)
