"""Where a float16 model's fp32 copies live, at N=2 (docs/guides/mixed-precision.md).

The N=2 parity job (tests/dist/conftest.py; its ``mixed_precision`` cases,
tests/dist/workers/mixed_precision_cases.py) trains a network with float16 parameters two steps at
stages 1, 2 and 3, and at stage 3 with optimizer offload:

* stages 1-2: the optimizer updates a float32 master shard (``master.<name>``, 1/N of the rows) of
  each split parameter; the network keeps its float16 parameters whole, and after the step each
  holds the gathered masters rounded to float16; the masters are counted as ``master_shards``;
* stage 3: there is no master copy: the optimizer updates the network's float16 shards in place;
* stage 3 with offload: the same float16 shards, updated on the host (which computes in float32 and
  rounds back: mindone_zero/offload/host_step.py), its states float32 in host memory;
* the optimizer's own states (AdamWeightDecay's moments) keep the dtype the optimizer created them in,
  the parameters' float16, at every stage on the device.
"""
import json

import numpy as np
import pytest

from parity_cases import MIXED_PRECISION_CASES

pytestmark = pytest.mark.parity_world(2)  # [Note: test scheduling]
WORLD = 2
NAMES = ["stage1", "stage2", "stage3", "stage3_offload"]
# HalfNet's parameters: full shapes, float16
SHAPES = {"fc1.weight": (6, 8), "fc1.bias": (6,), "fc2.weight": (4, 6), "fc2.bias": (4,)}


@pytest.fixture(scope="module")
def results(parity_jobs):
    _, out = parity_jobs(WORLD)
    assert [c["name"] for c in MIXED_PRECISION_CASES[WORLD]] == [f"mixed_{name}" for name in NAMES]
    return {(name, r): dict(np.load(out / f"mixed_{name}_rank{r}.npz")) for name in NAMES for r in range(WORLD)}


def _dtypes(result, prefix):
    return {k[len(prefix) + 6:]: str(v) for k, v in result.items() if k.startswith(prefix + "dtype:")}


def _rows(shape):
    return (shape[0] // WORLD,) + shape[1:]


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("stage", [1, 2])
def test_stages_1_2_update_fp32_master_shards_of_the_fp16_parameters(results, stage, rank):
    result = results[f"stage{stage}", rank]
    assert _dtypes(result, "after:") == {f"master.{n}": "Float32" for n in SHAPES}
    assert _dtypes(result, "net:") == {n: "Float16" for n in SHAPES}
    for name, shape in SHAPES.items():
        master = result[f"after:master.{name}"]
        assert master.shape == _rows(shape) and result[f"net:{name}"].shape == shape
        assert not np.array_equal(master, result[f"before:master.{name}"])  # trained
        block = result[f"net:{name}"][rank * master.shape[0]:(rank + 1) * master.shape[0]]
        np.testing.assert_array_equal(block, master.astype(np.float16).astype(np.float32))
    assert json.loads(str(result["states"])) == {"moments1": ["Float16"], "moments2": ["Float16"]}
    memory = json.loads(str(result["memory"]))
    assert memory["master_shards"] == sum(4 * int(np.prod(_rows(s))) for s in SHAPES.values())
    assert memory["params"] == sum(2 * int(np.prod(s)) for s in SHAPES.values())


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("name", ["stage3", "stage3_offload"])
def test_stage_3_updates_the_fp16_shards_in_place(results, name, rank):
    result = results[name, rank]
    assert _dtypes(result, "after:") == {n: "Float16" for n in SHAPES}  # the network's own shards
    for param, shape in SHAPES.items():
        after = result[f"after:{param}"]
        assert after.shape == _rows(shape)
        np.testing.assert_array_equal(after, result[f"net:{param}"])
        assert not np.array_equal(after, result[f"before:{param}"])  # trained
    states = "Float32" if name.endswith("offload") else "Float16"
    assert json.loads(str(result["states"])) == {"moments1": [states], "moments2": [states]}
    memory = json.loads(str(result["memory"]))
    assert memory["master_shards"] == 0
    assert memory["params"] == sum(2 * int(np.prod(_rows(s))) for s in SHAPES.values())
