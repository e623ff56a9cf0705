"""Issue 24: optimizer offload gives the device run's bits, and an offloaded run resumes bitwise.

The N=2 parity job (tests/dist/conftest.py; its ``offload`` cases, named ``offload_<case>``:
tests/dist/workers/offload_cases.py): GeluNet (GELU, a hidden width of 38 and an output width of 5,
a bare parameter), AdamWeightDecay with weight decay on the weights, clipping, different data on
every rank, 12 steps, at stages 1 and 3: on the device, with the states in host memory and in files
(40-byte chunks); and offloaded runs saved after 6 steps, loaded into a fresh train network and
trained to 12. The host update calls MindSpore's CPU kernel
function ([Note: host kernel parity] in mindone_zero/offload/nnacl.py), so every comparison is
``array_equal``.
"""
import numpy as np
import pytest

from parity_cases import OFFLOAD_CASES, OFFLOAD_STAGES

pytestmark = pytest.mark.parity_world(2)  # [Note: test scheduling]
WORLD = 2
STAGES = OFFLOAD_STAGES
NAMES = {c["name"][len("offload_"):] for c in OFFLOAD_CASES[WORLD]}


@pytest.fixture(scope="module")
def job(parity_jobs):
    return parity_jobs(WORLD)[1]


def _load(out, name):
    assert name in NAMES, name
    runs = [dict(np.load(out / f"offload_{name}_rank{r}.npz")) for r in range(WORLD)]
    return [(r["losses"], {k: v for k, v in r.items() if k.startswith("param/")}) for r in runs]


def _assert_bitwise(got, want, what):
    for rank, ((losses, params), (ref_losses, ref_params)) in enumerate(zip(got, want)):
        assert np.array_equal(losses, ref_losses), (what, rank, losses - ref_losses)
        assert sorted(params) == sorted(ref_params)
        for key, value in ref_params.items():
            assert np.array_equal(params[key], value), (what, rank, key, np.abs(params[key] - value).max())


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("where", ["host", "file"])
def test_offloaded_run_equals_the_device_run_bit_for_bit(job, stage, where):
    device = _load(job, f"s{stage}_device")
    assert not np.array_equal(device[0][0], device[1][0])  # different data on every rank
    assert np.load(job / f"offload_s{stage}_{where}_rank0.npz")["split"].any()  # some shards, not all replicated
    _assert_bitwise(_load(job, f"s{stage}_{where}"), device, f"s{stage} {where}")


@pytest.mark.parametrize("name,straight", [("s3_file_resumed", "s3_file"), ("s1_host_resumed", "s1_host")])
def test_resumed_offloaded_run_equals_the_uninterrupted_one_bit_for_bit(job, name, straight):
    _assert_bitwise(_load(job, name), _load(job, straight), name)
