"""ZeRO-3 network side (``parallel_modules.shard_network``) under msrun, N = 2 and N = 4.

One msrun job per N runs every case (GRAPH and PYNATIVE, float32 and ``to_float(float16)``) of
``workers/zero3_network_worker.py`` on ``Zero3TestNet`` (Dense with 7 outputs, Conv2d,
Embedding with 11 rows read twice, LayerNorm, a bare Parameter, a Dense subclass with its own
construct, nesting in SequentialCell/CellList, a 0-d, an opted-out and a frozen parameter, a
user override), and on ``RecomputeNet`` (Cells marked with ``recompute()`` of every kind: replaced
layers, generic Cells, a parent of a replaced layer, ``use_reentrant=False``). Each rank compares
its sharded network with an unsharded copy (with the same marks) it also runs on every rank's batch.
The shapes do not divide by N on purpose, so the networks are sharded with the padded rule
(``pad_uneven_params=True``); MindOne's rule (the default) at stage 3 runs in test_model_train.py,
test_mindone_dropin.py, test_gather_units.py and test_zeropp.py.
"""
from pathlib import Path

import pytest

from msrun_harness import load_json, run_msrun

WORKER = Path(__file__).parent / "workers" / "zero3_network_worker.py"
CASES = ["graph_fp32", "graph_fp16", "pynative_fp32", "pynative_fp16"]
RECOMPUTE_CASES = ["graph_recompute", "pynative_recompute"]
SIZES = [2, 4]
# 0-d and parallel_optimizer=False (the last one inside a ZeRO-3 Dense of RecomputeNet)
REPLICATED = {"net.temperature", "net.keep", "net.head.out.bias"}
FROZEN = {"net.frozen"}  # requires_grad=False: split by the same rule ([Note: split rule]), no gradient


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """size -> output folder of that world size's job, run once on first use. A failed job fails
    every test that reads it, without being rerun (a rerun would hide a flaky failure)."""
    outs = {}

    def get(size):
        if size not in outs:
            out = tmp_path_factory.mktemp(f"zero3_net_n{size}")
            try:
                run_msrun(str(WORKER), size, out, timeout=600)
                outs[size] = out
            except AssertionError as err:
                outs[size] = err
        if isinstance(outs[size], AssertionError):
            raise outs[size]
        return outs[size]

    return get


def _reports(out: Path, case: str, size: int):
    reports = [load_json(out / f"{case}_rank{r}.json") for r in range(size)]
    assert [r["rank"] for r in reports] == list(range(size))
    return reports


def _tolerances(case):
    # float16 compute: products rounded to 11 bits; float32: sums in another order only.
    return (5e-3, 2e-3) if case.endswith("fp16") else (1e-5, 1e-5)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", CASES + RECOMPUTE_CASES)
def test_forward_and_loss_match_unsharded(job, case, size):
    fwd_tol, _ = _tolerances(case)
    for rep in _reports(job(size), case, size):
        assert rep["forward_max_abs"] <= fwd_tol, (rep["rank"], rep["forward_max_abs"])
        assert rep["train_forward_max_abs"] <= fwd_tol, (rep["rank"], rep["train_forward_max_abs"])
        assert abs(rep["loss"] - rep["ref_loss"]) <= fwd_tol * max(1.0, abs(rep["ref_loss"]))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", CASES + RECOMPUTE_CASES)
def test_grads_are_reduce_scattered_means(job, case, size):
    """Split params: this rank's block of the mean over ranks; replicated: local gradient."""
    _, grad_tol = _tolerances(case)
    for rep in _reports(job(size), case, size):
        assert set(rep["grads"]) == set(rep["params"]) - FROZEN
        for name, g in rep["grads"].items():
            assert g["shape"] == g["expected_shape"] == rep["params"][name]["shape"], (rep["rank"], name, g)
            assert g["max_abs"] <= grad_tol * max(1.0, g["scale"]), (rep["rank"], name, g)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", CASES + RECOMPUTE_CASES)
def test_params_hold_padded_one_over_n(job, case, size):
    for rep in _reports(job(size), case, size):
        for name, p in rep["params"].items():
            assert p["split"] is (name not in REPLICATED), name  # the frozen one too
            assert p["shape"] == p["expected_shape"], (name, p)
            assert p["nbytes"] == p["expected_nbytes"], (name, p)
        table = rep["params"]["net.embed.embedding_table"]
        # 11 rows over 2 or 4 ranks: the last block carries zero padding rows.
        assert table["shape"][0] == -(-11 // size) and table["shape"][0] * size > 11


@pytest.mark.parametrize("size", SIZES)
def test_names_kept_and_user_override_used(job, size):
    for case in CASES + RECOMPUTE_CASES:
        for rep in _reports(job(size), case, size):
            assert rep["names_equal"], (case, rep["rank"])
            if case in CASES:  # MindOne-style ShiftZero3 on a 6-row parameter (no double cut)
                assert rep["override_type"] == "ShiftZero3", (case, rep["override_type"])
                # Wrapping renames by attribute path; only the MindOne-style class adds a segment.
                assert rep["names_differing_wrapped"] == [["net.blocks.2.offset", "net.blocks.2.net.offset"]]
            else:
                assert rep["names_differing_wrapped"] == [], (case, rep["names_differing_wrapped"])


@pytest.mark.parametrize("size", SIZES)
def test_recompute_gathers_again_in_backward(job, size):
    """PYNATIVE: a recomputed Cell's gathers run twice per step (forward, then backward's
    recomputation of the new construct); the top Cell's own parameter, not recomputed, once."""
    for rep in _reports(job(size), "pynative_recompute", size):
        calls = rep["gather_calls"]
        assert calls.pop("out_scale") == 1, (rep["rank"], rep["gather_calls"])
        assert len(calls) == 13 and set(calls.values()) == {2}, (rep["rank"], calls)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", CASES + RECOMPUTE_CASES)
def test_layers_with_weight_and_bias_gather_them_coalesced(job, case, size):
    for report in _reports(job(size), case, size):
        assert report["coalesced_groups"] >= 1, (case, report["rank"])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", ["graph_recompute", "pynative_fp16"])
def test_coalesced_gathers_equal_per_parameter_bitwise(job, case, size):
    """[Note: coalesced gathers]: one all-gather and one reduce-scatter per layer give the loss and
    every gradient of one collective per parameter, bit for bit (GRAPH: with the re-gather of
    reshard_after_forward; PYNATIVE: float16 compute, cast before the gather)."""
    for report in _reports(job(size), case, size):
        assert report["uncoalesced_equal"], (case, report["rank"])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", CASES)
def test_only_the_collective_is_marked_for_the_regather(job, case, size):
    """[Note: the collective alone is recomputed]: in GRAPH_MODE a gathering wrapper or coalesced
    group is re-gathered by marking its collective Cell, not itself, unless its reader is recomputed
    whole ([Note: direct reads]); the CommPlan counts the parameters of both as re-gathered. PYNATIVE
    recomputes the readers whole: no collective is marked alone."""
    for report in _reports(job(size), case, size):
        marks = report["regather_marks"]  # [path, names, itself marked, its collective marked]
        assert marks, case
        alone = [m for m in marks if m[3] and not m[2]]
        if case.startswith("pynative"):
            assert not alone, (case, alone)
            continue
        whole = [m for m in marks if m[2] and not m[3]]
        # the rest are the top Cell's own gathers: its reads stay gathered ([Note: reshard after forward])
        assert all("." not in m[0] for m in marks if m not in alone + whole), (case, marks)
        # most of the other Cells' gathers (the top Cell's reads, the frozen one's among them, stay gathered)
        assert len(alone) > len([m for m in marks if "." in m[0]]) / 2, (case, marks)
        assert set(report["regathered"]) == {name for m in alone + whole for name in m[1]}, (case, marks)
