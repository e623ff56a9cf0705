"""measure_model_states against bytes computed by hand from TinyNet's shapes, stages 0-3 at N=2.

The N=2 parity job (tests/dist/conftest.py; its ``memory`` cases, tests/dist/workers/memory_cases.py)
builds TinyNet + Adam + EMA with 2 accumulation steps at every stage, in two layouts. Expected bytes
follow DESIGN §3 directly. "padded" (``pad_uneven_params=True, shard_ema=True``): a parameter with ndim >= 1 is cut into N
blocks of ceil(d0 / N) rows (zero padding included), the EMA too from stage 1; the 0-d
``temperature`` stays whole. "mindone" (the defaults): only a parameter whose dim 0 divides by N is
cut (TinyNet's LayerNorm, 6 rows), and the EMA is whole below stage 3.
"""
import json
import math

import numpy as np
import pytest

from models import CLASSES, EMB, SEQ, VOCAB
from parity_cases import MEMORY_CASES

pytestmark = pytest.mark.parity_world(2)  # [Note: test scheduling]
WORLD = 2
STAGES = (0, 1, 2, 3)
F32 = 4
# TinyNet's parameters (tests/models.py), full shapes.
SHAPES = {
    "temperature": (),
    "embedding.embedding_table": (VOCAB, EMB),
    "norm.gamma": (EMB,),
    "norm.beta": (EMB,),
    "conv.weight": (3, 1, 3, 3),
    "conv.bias": (3,),
    "head.weight": (CLASSES, 3 * SEQ * EMB),
    "head.bias": (CLASSES,),
}


def _full(shape):
    return int(np.prod(shape, dtype=np.int64)) * F32


def _shard(shape):
    if not shape:
        return _full(shape)  # 0-d: replicated
    return math.ceil(shape[0] / WORLD) * int(np.prod(shape[1:], dtype=np.int64)) * F32


FULL = sum(_full(s) for s in SHAPES.values())
SHARD = sum(_shard(s) for s in SHAPES.values())
MASTER = sum(_shard(s) for s in SHAPES.values() if s)  # 0-d parameters need no master copy

# Adam keeps moment1 and moment2; accumulation buffers are full at stages 0-1 (local sums reduced
# once per step) and shards at stages 2-3; stage 3 holds the network itself as shards.
EXPECTED = {
    0: dict(params=FULL, master_shards=0, optimizer_states=2 * FULL, accumulation=FULL, ema=FULL),
    1: dict(params=FULL, master_shards=MASTER, optimizer_states=2 * SHARD, accumulation=FULL, ema=SHARD),
    2: dict(params=FULL, master_shards=MASTER, optimizer_states=2 * SHARD, accumulation=SHARD, ema=SHARD),
    3: dict(params=SHARD, master_shards=0, optimizer_states=2 * SHARD, accumulation=SHARD, ema=SHARD),
}


SPLIT_MINDONE = {k for k, s in SHAPES.items() if s and s[0] % WORLD == 0}
SHARD_M = sum(_shard(s) if k in SPLIT_MINDONE else _full(s) for k, s in SHAPES.items())
MASTER_M = sum(_shard(s) for k, s in SHAPES.items() if k in SPLIT_MINDONE)
EXPECTED_MINDONE = {
    0: EXPECTED[0],
    1: dict(params=FULL, master_shards=MASTER_M, optimizer_states=2 * SHARD_M, accumulation=FULL, ema=FULL),
    2: dict(params=FULL, master_shards=MASTER_M, optimizer_states=2 * SHARD_M, accumulation=SHARD_M, ema=FULL),
    3: dict(params=SHARD_M, master_shards=0, optimizer_states=2 * SHARD_M, accumulation=SHARD_M, ema=SHARD_M),
}
LAYOUTS = {"padded": EXPECTED, "mindone": EXPECTED_MINDONE}


@pytest.fixture(scope="module")
def measured(parity_jobs):
    _, out = parity_jobs(WORLD)
    results = {}
    for case in MEMORY_CASES[WORLD]:
        for rank in range(WORLD):
            with open(out / f"{case['name']}_rank{rank}.json") as f:
                results[case["stage"], case["layout"], rank] = json.load(f)
    assert sorted(results) == sorted((s, layout, r) for s in STAGES for layout in LAYOUTS for r in range(WORLD))
    return results


def test_hand_computed_sizes_differ_between_stages():
    # Guards the test itself: padding must make the shard sizes uneven (3 and 7 and 11 rows on 2 ranks).
    assert 2 * SHARD > FULL and MASTER < SHARD
    assert SPLIT_MINDONE == {"norm.gamma", "norm.beta"} and SHARD < SHARD_M < FULL


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_measured_bytes_match_hand_computed(measured, layout, stage, rank):
    result = measured[stage, layout, rank]
    assert result["stage"] == stage
    memory = result["memory"]
    for kind, expected in LAYOUTS[layout][stage].items():
        assert memory[kind] == expected, (kind, memory)
    # Scalars only: loss scale, accumulation counters, Adam's step, learning rate, beta powers, EMA count.
    assert 0 < memory["other"] <= 16 * F32
    assert memory["total"] == sum(v for k, v in memory.items() if k != "total")
