"""GroupComm (mindone_zero/core/comm.py) across processes, against numpy references.

One msrun job per world size N in {2, 4} runs tests/dist/workers/comm_worker.py: in GRAPH_MODE
and PYNATIVE_MODE, on the world group and on a named sub-group (N=4: {0,1} and {2,3}; N=2:
both ranks, which takes the CPU emulation path), it calls every GroupComm method inside one
Cell on random float32 and float16 inputs that differ per rank. Here the same inputs are
rebuilt from their seed and every rank's result is checked.
"""
import functools
import sys
from pathlib import Path

import numpy as np
import pytest

from msrun_harness import run_msrun

WORKERS = Path(__file__).resolve().parent / "workers"
sys.path.insert(0, str(WORKERS))

import comm_cases as cases  # noqa: E402

# float16 sums of up to 4 values of magnitude ~3 in whatever order the backend adds them.
TOLERANCE = {"float32": dict(rtol=1e-6, atol=1e-6), "float16": dict(rtol=2e-3, atol=8e-3)}


@pytest.fixture(scope="module", params=[2, 4], ids=["N2", "N4"])
def job(request, tmp_path_factory):
    world_size = request.param
    out = tmp_path_factory.mktemp(f"comm_n{world_size}")
    run_msrun(str(WORKERS / "comm_worker.py"), world_size, out, timeout=400)
    return world_size, out


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> dict:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _result(out: Path, mode: str, world_rank: int, kind: str, dtype: str, op: str) -> np.ndarray:
    return _load(out / cases.result_file(mode, world_rank))[cases.result_key(kind, dtype, op)]


def reference(world_size: int, mode: str, kind: str, dtype: str, op: str, world_rank: int) -> np.ndarray:
    """What ``op`` must return on ``world_rank``, computed in float64 from every member's inputs."""
    group = cases.members(world_size, kind, world_rank)
    index, size = group.index(world_rank), len(group)
    per_rank = [cases.inputs(mode, kind, dtype, m, size) for m in group]
    x = [p[0].astype(np.float64) for p in per_rank]
    if op == "all_reduce":
        return np.sum(x, axis=0)
    if op == "all_reduce_mean":
        return np.sum(x, axis=0) / size
    if op == "reduce_scatter":
        total = np.sum([p[1].astype(np.float64) for p in per_rank], axis=0)
        rows = total.shape[0] // size
        return total[index * rows:(index + 1) * rows]
    if op == "all_gather":
        return np.concatenate([p[2] for p in per_rank], axis=0)
    root = {"broadcast_root0": 0, "broadcast_root1": 1}[op]
    return per_rank[root][0]


@pytest.mark.parametrize("op", cases.OPS)
@pytest.mark.parametrize("dtype", cases.DTYPES)
@pytest.mark.parametrize("kind", ["world", "sub"])
@pytest.mark.parametrize("mode", cases.MODES)
def test_collective_matches_numpy(job, mode, kind, dtype, op):
    world_size, out = job
    for world_rank in range(world_size):
        got = _result(out, mode, world_rank, kind, dtype, op)
        want = reference(world_size, mode, kind, dtype, op, world_rank)
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape, (world_rank, got.dtype, got.shape)
        msg = f"{op} on {kind} group, {mode}, {dtype}, world rank {world_rank} of {world_size}"
        if op in ("all_gather", "broadcast_root0", "broadcast_root1"):
            # Moving data, emulated or not, must not change a bit (the emulation adds exact zeros).
            np.testing.assert_array_equal(got, want, err_msg=msg)
        else:
            np.testing.assert_allclose(got.astype(np.float64), want, err_msg=msg, **TOLERANCE[dtype])


@pytest.mark.parametrize("op", ["all_reduce", "all_reduce_mean"])
@pytest.mark.parametrize("mode", cases.MODES)
def test_all_reduce_is_bit_identical_on_every_member(job, mode, op):
    world_size, out = job
    for kind, groups in cases.groups(world_size).items():
        for group in groups:
            for dtype in cases.DTYPES:
                first, *others = [_result(out, mode, r, kind, dtype, op) for r in group]
                for r, other in zip(group[1:], others):
                    np.testing.assert_array_equal(other, first, err_msg=f"{op} {kind} {dtype}: rank {r} vs {group[0]}")
