"""Checkpoints: resume parity (stages 0-3), resharding 2 <-> 4, combine round trips, bad inputs.

Three msrun jobs, each run once per module, in this order (later jobs read earlier checkpoints):

* A (N=2): 10 straight steps per stage (EMA, dynamic loss scale, clipping; GRAPH_MODE except
  stage 2 in PYNATIVE_MODE), saving at steps 5 and 10; stage 2 also saves at step
  7 with rank 1 failing half-way through; a stage-2 run with accumulation saved between micro-steps; a stage-3 run of a
  network whose dims divide by 2 and 4 (what MindOne's JSON can describe); a stage-3 run with a
  frozen base (``FROZEN``: sharded, padded, no optimizer state).
* C (N=4): resumes of A's stage-2 and stage-3 step-5 checkpoints (2 -> 4) to step 10, saving, the
  frozen-base one among them;
  5 straight stage-1 steps; 3 straight steps of a hybrid stage-2 run (optimizer groups of 2,
  replicated over dp groups); loading A's mid-accumulation checkpoint (must fail).
* B (N=2): resumes of A's checkpoints (same world: bitwise), of C's (4 -> 2, and 2 -> 4 -> 2 at
  stage 3), of the hybrid one, of a MindOne-style JSON copy; every bad input.

The straight run and the resumed one are separate processes that share nothing but the files.
TinyNet's shapes do not divide by 2 or 4, so its runs shard with the padded rule
(``pad_uneven_params=True``, the worker's default), except the "_mr" runs: MindOne's rule (the
library's default), under which the LayerNorm is split over 2 ranks and nothing over 4, so
resharding 2 -> 4 -> 2 at stage 2 drops the master shards and builds them again.
"""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from msrun_harness import run_msrun
from mindone_zero.checkpoint import latest_checkpoint, step_dir_name
from mindone_zero.checkpoint import atomic_save_checkpoint, convert_checkpoints, open_checkpoint
from mindone_zero.core.partition import padding_rows

WORKER = "tests/dist/workers/checkpoint_worker.py"
EVAL_SEED = 99  # checkpoint_worker.EVAL_SEED
RTOL, ATOL = 1e-5, 1e-6
# a LoRA fine-tune's shape: a frozen base (padded at N=2 and N=4: 11 and 7 rows) beside trainable tensors
FROZEN = ["embedding.embedding_table", "head.weight"]


def _a_cases():
    return [
        dict(name="s0", stage=0, ckpt="s0", saves=[5, 10]),
        dict(name="s1", stage=1, ckpt="s1", saves=[5, 10]),
        dict(name="s2", stage=2, mode="pynative", ckpt="s2", saves=[5, 7, 10],
             inject={"kind": "raise", "save": 7, "rank": 1}),
        dict(name="s3", stage=3, ckpt="s3", saves=[5, 10], fmt="safetensors", full=True),
        dict(name="s2_accum", stage=2, accum=2, ckpt="s2_accum", save_mid=[2, 0], end=4),
        dict(name="even_s3", stage=3, net="even", ckpt="even_s3", saves=[1], end=1),
        # issue 13: optimizer states in files; a full disk during step 7 of the stage-1 run
        dict(name="s3_off", stage=3, offload="file", ckpt="s3_off", saves=[5, 10]),
        dict(name="s1_off_fault", stage=1, offload="file", ckpt="s1_off_fault", saves=[5, 10],
             step_fault={"step": 7, "rank": 1}),
        dict(name="s2_mr", stage=2, pad=False, ckpt="s2_mr", saves=[5, 10]),
        dict(name="s3_frz", stage=3, frozen=FROZEN, ckpt="s3_frz", saves=[5, 10]),
    ]


def _c_cases(a):
    return [
        dict(name="s1_n4", stage=1, ckpt="s1_n4", saves=[5], end=5),
        dict(name="r2to4_s2", stage=2, load=f"{a}/s2", load_step=5, ckpt="r2to4_s2", saves=[10]),
        dict(name="r2to4_s3", stage=3, load=f"{a}/s3", load_step=5, ckpt="r2to4_s3", saves=[7, 10]),
        dict(name="hyb_s2", stage=2, hybrid=True, ckpt="hyb_s2", saves=[3], end=3),
        dict(name="r2to4_s3_off", stage=3, offload="host", load=f"{a}/s3_off", load_step=5),
        dict(name="r2to4_s2_mr", stage=2, pad=False, load=f"{a}/s2_mr", load_step=5, ckpt="r2to4_s2_mr", saves=[7, 10]),
        dict(name="r2to4_s3_frz", stage=3, frozen=FROZEN, load=f"{a}/s3_frz", load_step=5),
        dict(name="errors_n4", checks={"mid_accum_reshard": f"{a}/s2_accum"}),
    ]


def _b_cases(a, c, bad):
    cases = [dict(name=f"r_s{s}", stage=s, load=f"{a}/s{s}", load_step=5, mode="pynative" if s == 2 else "graph")
             for s in range(4)]
    checks = {check: f"{bad}/{check}" for check in (
        "missing_file", "json_group_size", "names_differ", "shapes_differ", "truncated", "truncated_meta_updated",
        "corrupted", "save_bad_format", "save_bad_step")}
    checks.update(no_checkpoint=f"{bad}/empty", wrong_stage=f"{a}/s1", other_names=f"{a}/s1",
                  other_shapes=f"{a}/s1", save_exists=f"{a}/s1", mid_accum_other_accum=f"{a}/s2_accum")
    return cases + [
        dict(name="r_s2_accum", stage=2, accum=2, load=f"{a}/s2_accum", load_step=2, end=4),
        dict(name="r_s3_off", stage=3, offload="file", load=f"{a}/s3_off", load_step=5),
        dict(name="r4to2_s1", stage=1, load=f"{c}/s1_n4", load_step=5),
        dict(name="r4to2_s3", stage=3, load=f"{c}/r2to4_s3", load_step=7),  # 2 -> 4 -> 2
        dict(name="r4to2_s2_mr", stage=2, pad=False, load=f"{c}/r2to4_s2_mr", load_step=7),  # masters rebuilt
        dict(name="r_hyb", stage=2, load=f"{c}/hyb_s2", load_step=3, end=6),
        dict(name="r_even_mindone", stage=3, net="even", load=f"{bad}/even_mindone", load_step=1, end=1),
        dict(name="errors", checks=checks),
    ]


# ----------------------------------------------------------------------------- jobs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Job name -> its output folder; runs A, C, B in order on first use, each once."""
    root = tmp_path_factory.mktemp("ckpt")
    a, c, b = root / "A", root / "C", root / "B"
    def job_b():
        make_bad_inputs(a, b / "bad")
        run_msrun(WORKER, 2, b, ["--cases", json.dumps(_b_cases(a, c, b / "bad"))], timeout=600)

    plan = {
        "A": lambda: run_msrun(WORKER, 2, a, ["--cases", json.dumps(_a_cases())], timeout=600),
        "C": lambda: run_msrun(WORKER, 4, c, ["--cases", json.dumps(_c_cases(a))], timeout=600),
        "B": job_b,
    }
    done = {}

    def get(job):
        for name in ("A", "C", "B")[:"ACB".index(job) + 1]:
            if name not in done:
                try:
                    plan[name]()
                    done[name] = root / name
                except AssertionError as err:  # a failed job fails every test that needs it, once
                    done[name] = err
            if isinstance(done[name], AssertionError):
                raise done[name]
        return done[job]

    return get


class Run:
    """Per-rank results of one case: events JSON and npz (losses, gathered params, logits)."""

    def __init__(self, out: Path, name: str, world: int):
        self.events = [json.loads((out / f"{name}_rank{r}.json").read_text()) for r in range(world)]
        self.npz = ([dict(np.load(out / f"{name}_rank{r}.npz")) for r in range(world)]
                    if (out / f"{name}_rank0.npz").exists() else [])

    def losses(self, rank, after=(-1, -1)):
        return [tuple(x) for x in self.events[rank]["losses"] if tuple(x[:2]) > tuple(after)]

    def step_means(self, first_step):
        """Per optimizer step from ``first_step``: mean loss over ranks and micro-steps (global batch)."""
        per_step = {}
        for ev in self.events:
            for step, _, loss in ev["losses"]:
                if step >= first_step:
                    per_step.setdefault(step, []).append(loss)
        return np.array([np.mean(per_step[s]) for s in sorted(per_step)])

    def params(self, rank=0):
        return {k[len("param/"):]: v for k, v in self.npz[rank].items() if k.startswith("param/")}


# ----------------------------------------------------------------------------- bad inputs


def _writable(path):
    os.chmod(path, 0o644)  # MindSpore saves checkpoints read-only
    return path


def _refresh_sizes(step_dir: Path):
    """Make meta.json agree with deliberately edited files, so that a deeper check must catch them."""
    meta = json.loads((step_dir / "meta.json").read_text())
    meta["sizes"] = {name: os.path.getsize(step_dir / name) for name in meta["sizes"]}
    (step_dir / "meta.json").write_text(json.dumps(meta))


def _rewrite(path: Path, edit):
    tensors = {}
    reader = open_checkpoint(str(path))
    for name in reader.infos:
        tensors[name] = reader.read(name)
    edit(tensors)
    os.remove(path)
    atomic_save_checkpoint(tensors, str(path))


def _copy(src_root: Path, dst_root: Path, step: int) -> Path:
    shutil.copytree(src_root / step_dir_name(step), dst_root / step_dir_name(step))
    return dst_root / step_dir_name(step)


def make_bad_inputs(a: Path, bad: Path):
    """Damaged copies of A's stage-1 step-5 checkpoint, and a MindOne-style JSON copy of even_s3."""
    edits = {
        "missing_file": lambda d: os.remove(d / "optimizer_rank1.ckpt"),
        "json_group_size": lambda d: _set_group_size(d / "params_info" / "params_split_info_1.json", 4),
        "names_differ": lambda d: _rewrite(d / "optimizer_rank1.ckpt", lambda t: t.pop("beta1_power")),
        "shapes_differ": lambda d: _rewrite(d / "optimizer_rank1.ckpt",
                                            lambda t: t.update({"moment1.net.head.weight": t["moment1.net.head.weight"][:3]})),
        "truncated": lambda d: os.truncate(_writable(d / "optimizer_rank0.ckpt"), 3000),
        "truncated_meta_updated": lambda d: os.truncate(_writable(d / "optimizer_rank0.ckpt"), 3000),
        "corrupted": lambda d: _overwrite(_writable(d / "optimizer_rank0.ckpt"), 0, b"\xff" * 16),
    }
    for check, edit in edits.items():
        step_dir = _copy(a / "s1", bad / check, 5)
        edit(step_dir)
        if check not in ("missing_file", "truncated"):
            _refresh_sizes(step_dir)
    (bad / "empty").mkdir(parents=True)
    step_dir = _copy(a / "even_s3", bad / "even_mindone", 1)
    for path in (step_dir / "params_info").glob("*.json"):
        info = json.loads(path.read_text())
        path.write_text(json.dumps({k: {f: v[f] for f in ("split", "group_size", "rank_id")} for k, v in info.items()}))
    _refresh_sizes(step_dir)


def _set_group_size(path: Path, size: int):
    """A well-formed JSON (pads recomputed) for a group of ``size``, disagreeing with meta.json."""
    info = json.loads(path.read_text())
    for entry in info.values():
        entry["group_size"] = size
        entry["pad"] = padding_rows(entry["shape"][0], size) if entry["split"] else 0
    path.write_text(json.dumps(info))


def _overwrite(path: Path, offset: int, data: bytes):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# ----------------------------------------------------------------------------- single process


def _read_all(path) -> dict:
    reader = open_checkpoint(str(path))
    return {name: reader.read(name) for name in reader.infos}


def _single_process_logits(params: dict) -> np.ndarray:
    """TinyNet in this process, weights from ``params`` (every name must be there)."""
    import mindspore as ms
    from models import LossNet, TinyNet, global_batch

    ms.set_device("CPU")
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:  # the mode is put back ([Note: leak guard] in tests/leak_guard.py)
        loss_net = LossNet(TinyNet())
        for p in loss_net.get_parameters():
            p.set_data(ms.Tensor(params[p.name], p.dtype))
        return loss_net.net(ms.Tensor(global_batch(EVAL_SEED)[0])).asnumpy()
    finally:
        ms.set_context(mode=mode)


def _combine(step_dir: Path, kind: str, n: int, fmt: str = "ckpt", json_pattern: str = None) -> dict:
    json_pattern = json_pattern or str(step_dir / "params_info" / "params_split_info_{}.json")
    return _read_all(convert_checkpoints(str(step_dir / f"{kind}_rank{{}}.{fmt}"), json_pattern, n))


# ----------------------------------------------------------------------------- resume


RESUMES = [(f"s{s}", f"r_s{s}") for s in range(4)] + [("s2_accum", "r_s2_accum"), ("s3_off", "r_s3_off")]


@pytest.mark.parametrize("straight,resumed", RESUMES, ids=[r for _, r in RESUMES])
def test_resume_same_world_is_bitwise(jobs, straight, resumed):
    a, b = Run(jobs("A"), straight, 2), Run(jobs("B"), resumed, 2)
    start = tuple(b.events[0]["start"])
    assert start == ((2, 1) if straight == "s2_accum" else (5, 0))
    for r in range(2):
        after = (start[0], start[1] - 1)
        assert b.losses(r) == a.losses(r, after) and len(b.losses(r)) > 0, f"rank {r}"
        ref, got = a.params(r), b.params(r)
        assert sorted(got) == sorted(ref) and any(k.startswith("ema.") for k in ref)
        for name in ref:
            assert np.array_equal(got[name], ref[name]), name
        assert np.array_equal(b.npz[r]["logits"], a.npz[r]["logits"])


# (straight run at N=2, resumed run, its job, its world size, loaded step); all but r_hyb end at step 10
RESHARDS = [("s2", "r2to4_s2", "C", 4, 5), ("s3", "r2to4_s3", "C", 4, 5), ("s1", "r4to2_s1", "B", 2, 5),
            ("s3", "r4to2_s3", "B", 2, 7), ("s2", "r_hyb", "B", 2, 3), ("s3", "r2to4_s3_off", "C", 4, 5),
            ("s2_mr", "r2to4_s2_mr", "C", 4, 5), ("s2_mr", "r4to2_s2_mr", "B", 2, 7),
            ("s3_frz", "r2to4_s3_frz", "C", 4, 5)]


@pytest.mark.parametrize("ref,name,job,world,step", RESHARDS, ids=[r[1] for r in RESHARDS])
def test_reshard_continues_the_loss_curve(jobs, ref, name, job, world, step):
    straight, resumed = Run(jobs("A"), ref, 2), Run(jobs(job), name, world)
    assert resumed.events[0]["loaded_step"] == step
    got_losses = resumed.step_means(step)
    assert len(got_losses) == (3 if name == "r_hyb" else 10 - step)
    np.testing.assert_allclose(got_losses, straight.step_means(step)[:len(got_losses)], rtol=RTOL, atol=ATOL)
    if name == "r_hyb":
        return  # stops at step 6, where the straight run kept no parameters
    ref_params, got = straight.params(), resumed.params()
    assert sorted(got) == sorted(ref_params)
    for k, v in ref_params.items():
        np.testing.assert_allclose(got[k], v, rtol=RTOL, atol=ATOL, err_msg=k)
    for r in range(1, world):  # every rank gathered the same full tensors
        assert all(np.array_equal(resumed.params(r)[k], got[k]) for k in got)


def test_hybrid_straight_run_matches_plain_and_replicas_do_not_overwrite(jobs):
    c = jobs("C")
    np.testing.assert_allclose(Run(c, "hyb_s2", 4).step_means(0), Run(jobs("A"), "s2", 2).step_means(0)[:3],
                               rtol=RTOL, atol=ATOL)
    step_dir = c / "hyb_s2" / step_dir_name(3)
    meta = json.loads((step_dir / "meta.json").read_text())
    assert (meta["world_size"], meta["op_group_size"], meta["dp_size"]) == (4, 2, 2)
    assert meta["files"]["optimizer"] == ["optimizer_rank0.ckpt", "optimizer_rank1.ckpt"]
    assert len(meta["files"]["train_state"]) == 4
    found = sorted(p.name for p in step_dir.iterdir() if p.is_file())
    assert found == sorted(["meta.json", "network.ckpt", "optimizer_rank0.ckpt", "optimizer_rank1.ckpt",
                            "ema_rank0.ckpt", "ema_rank1.ckpt"] + [f"train_state_rank{g}.ckpt" for g in range(4)])
    assert sorted(p.name for p in (step_dir / "params_info").iterdir()) == [
        "params_split_info_0.json", "params_split_info_1.json"]


# ----------------------------------------------------------------------------- layout and saves


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_layout_and_split_info_cover_every_saved_name(jobs, stage):
    fmt = "safetensors" if stage == 3 else "ckpt"
    root = jobs("A") / f"s{stage}"
    assert latest_checkpoint(root) == str(root / step_dir_name(10))
    step_dir = root / step_dir_name(5)
    meta = json.loads((step_dir / "meta.json").read_text())
    assert (meta["zero_stage"], meta["world_size"], meta["op_group_size"], meta["step"]) == (stage, 2, 2, 5)
    per_rank = {"network": stage == 3, "optimizer": stage >= 1, "ema": stage >= 1}
    for kind, split in per_rank.items():
        assert meta["files"][kind] == ([f"{kind}_rank{r}.{fmt}" for r in range(2)] if split else [f"{kind}.{fmt}"])
    for r in range(2):
        info = json.loads((step_dir / "params_info" / f"params_split_info_{r}.json").read_text())
        names = {}
        for kind, files in meta["files"].items():
            index = r if len(files) > 1 else 0
            names.update({n: (kind, t.shape) for n, t in open_checkpoint(str(step_dir / files[index])).infos.items()})
        assert sorted(info) == sorted(names)
        for name, (kind, shape) in names.items():
            entry = info[name]
            assert entry["rank_id"] == r and entry["group_size"] == 2
            rows = -(-entry["shape"][0] // 2) if entry["split"] else None
            if kind != "network" or stage == 3:
                want = tuple([rows] + entry["shape"][1:]) if entry["split"] else tuple(entry["shape"])
                assert shape == want, name
    assert meta["sizes"] == {n: os.path.getsize(step_dir / n) for n in meta["sizes"]}


def test_frozen_parameters_are_saved_as_shards_and_never_as_optimizer_states(jobs):
    step_dir = jobs("A") / "s3_frz" / step_dir_name(5)
    meta = json.loads((step_dir / "meta.json").read_text())
    for r in range(2):
        info = json.loads((step_dir / "params_info" / f"params_split_info_{r}.json").read_text())
        network = open_checkpoint(str(step_dir / meta["files"]["network"][r])).infos
        optimizer = open_checkpoint(str(step_dir / meta["files"]["optimizer"][r])).infos
        for name in (f"net.{n}" for n in FROZEN):  # the saved names: the loss Cell's
            full = info[name]["shape"]
            assert info[name]["split"] and network[name].shape == tuple([-(-full[0] // 2)] + full[1:]), name
            assert not [n for n in optimizer if name in n], (name, sorted(optimizer))
        assert any("norm.gamma" in n for n in optimizer), sorted(optimizer)  # the trainable ones have states


def test_failed_save_raises_everywhere_and_keeps_the_previous_checkpoint(jobs):
    run, root = Run(jobs("A"), "s2", 2), jobs("A") / "s2"
    errors = [ev["save_errors"] for ev in run.events]
    assert list(errors[1]) == ["7"] and errors[1]["7"].startswith("OSError: injected failure after writing")
    assert list(errors[0]) == ["7"] and errors[0]["7"].startswith("RuntimeError") and "[1]" in errors[0]["7"]
    assert not (root / step_dir_name(7)).exists()
    assert sorted(p.name for p in root.iterdir()) == ["latest", step_dir_name(5), step_dir_name(10)]
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def test_offloaded_states_in_files_train_like_the_device(jobs):
    """Issue 13: Adam's states in files (stage 3) follow the on-device run (stage 3, same job)."""
    a = jobs("A")
    device, files = Run(a, "s3", 2), Run(a, "s3_off", 2)
    np.testing.assert_allclose(files.step_means(0), device.step_means(0), rtol=1e-6, atol=1e-7)
    for key, value in device.params().items():
        np.testing.assert_allclose(files.params()[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


def test_full_disk_during_a_step_raises_everywhere_and_the_last_checkpoint_resumes(jobs):
    """A state-file write fails (ENOSPC) on rank 1 during step 7: both ranks raise, rank 1 naming the
    file, rank 0 rank 1; both reload step 5 and the run ends where the device run (s1) ends."""
    a = jobs("A")
    run, device = Run(a, "s1_off_fault", 2), Run(a, "s1", 2)
    errors = [ev["step_errors"] for ev in run.events]
    assert list(errors[1]) == ["7"] and errors[1]["7"].startswith("OSError: [Errno 28] For 'optimizer_offload', "
                                                                  "writing the state file ")
    assert "No space left on device (injected)" in errors[1]["7"] and "resume from the last checkpoint" in errors[1]["7"]
    assert list(errors[0]) == ["7"] and errors[0]["7"].startswith("RuntimeError") and "[1]" in errors[0]["7"]
    assert [ev["recovered_from"] for ev in run.events] == [5, 5]
    np.testing.assert_allclose(run.step_means(0)[-3:], device.step_means(0)[-3:], rtol=1e-6, atol=1e-7)
    for key, value in device.params().items():
        np.testing.assert_allclose(run.params()[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
    assert sorted(p.name for p in (a / "s1_off_fault").iterdir()) == ["latest", step_dir_name(5), step_dir_name(10)]


def test_gather_rank0_only(jobs):
    run = Run(jobs("A"), "s3", 2)
    assert run.events[0]["rank0_only_sizes"] == 8 and run.events[1]["rank0_only_sizes"] == 0


# ----------------------------------------------------------------------------- combine


# (job, world, stage) -> (run, step of its last checkpoint, format)
COMBINES = {("A", 2, 1): ("s1", 10, "ckpt"), ("A", 2, 2): ("s2", 10, "ckpt"), ("A", 2, 3): ("s3", 10, "safetensors"),
            ("C", 4, 1): ("s1_n4", 5, "ckpt"), ("C", 4, 2): ("r2to4_s2", 10, "ckpt"),
            ("C", 4, 3): ("r2to4_s3", 10, "ckpt")}


@pytest.mark.parametrize("job,world,stage", sorted(COMBINES), ids=[f"N{w}-s{s}" for _, w, s in sorted(COMBINES)])
def test_combined_checkpoint_gives_the_distributed_outputs(jobs, job, world, stage):
    name, step, fmt = COMBINES[job, world, stage]
    run, step_dir = Run(jobs(job), name, world), jobs(job) / name / step_dir_name(step)
    gathered = run.params()
    if stage == 3:
        network = _combine(step_dir, "network", world, fmt)
    else:  # the network file is full already; the combined fp32 masters must reproduce it
        network = _read_all(step_dir / f"network.{fmt}")
        masters = {k[len("master."):]: v for k, v in _combine(step_dir, "optimizer", world, fmt).items()
                   if k.startswith("master.")}
        assert masters and all(np.array_equal(masters[k], network[k]) for k in masters)
        network.update(masters)
    ema = _combine(step_dir, "ema", world, fmt)
    for k, v in list(network.items()) + list(ema.items()):
        assert np.array_equal(v, gathered[k]), k
    np.testing.assert_allclose(_single_process_logits(network), run.npz[0]["logits"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_combined_optimizer_states_agree_across_world_sizes(jobs, stage):
    """The same training state combined from 2 and from 4 rank files (stage 1: both straight runs
    at step 5; stages 2-3: the N=4 run resumed from the N=2 one, both at step 10)."""
    step = 5 if stage == 1 else 10
    two = _combine(jobs("A") / f"s{stage}" / step_dir_name(step), "optimizer", 2, COMBINES["A", 2, stage][2])
    four = _combine(jobs("C") / COMBINES["C", 4, stage][0] / step_dir_name(step), "optimizer", 4)
    assert sorted(two) == sorted(four) and any(k.startswith("moment2.") for k in two)
    for k in two:
        np.testing.assert_allclose(four[k], two[k], rtol=RTOL, atol=ATOL, err_msg=k)


def test_save_full_checkpoint_loads_into_one_process(jobs):
    run = Run(jobs("A"), "s3", 2)
    full = _read_all(jobs("A") / "s3_full.ckpt")
    assert sorted(full) == sorted(run.params())
    assert all(np.array_equal(full[k], v) for k, v in run.params().items())
    np.testing.assert_allclose(_single_process_logits(full), run.npz[0]["logits"], rtol=1e-6, atol=1e-6)


def test_mindone_format_json_combines_and_loads(jobs, tmp_path):
    a, b = jobs("A"), jobs("B")
    gathered = Run(a, "even_s3", 2).params()
    step_dir = a / "even_s3" / step_dir_name(1)
    for r in range(2):  # MindOne: network names only, no shape/pad (its split dims divide by the group)
        info = json.loads((step_dir / "params_info" / f"params_split_info_{r}.json").read_text())
        mindone = {k: {f: v[f] for f in ("split", "group_size", "rank_id")} for k, v in info.items()
                   if k.startswith("net.")}
        (tmp_path / f"mindone_{r}.json").write_text(json.dumps(mindone))
    pattern = str(tmp_path / "mindone_{}.json")
    combined = {**_combine(step_dir, "network", 2, json_pattern=pattern),
                **_combine(step_dir, "ema", 2, json_pattern=pattern)}
    assert sorted(combined) == sorted(gathered)
    assert all(np.array_equal(combined[k], gathered[k]) for k in gathered)
    optimizer = _combine(step_dir, "optimizer", 2, json_pattern=pattern)
    assert optimizer["moment1.net.fc1.weight"].shape == (8, 4)
    loaded = Run(b, "r_even_mindone", 2)  # load_train_state on the shape-less JSON copy
    assert all(np.array_equal(loaded.params(r)[k], gathered[k]) for r in range(2) for k in gathered)


# ----------------------------------------------------------------------------- errors


EXPECTED = {
    "missing_file": ("FileNotFoundError", ["optimizer_rank1.ckpt", "does not exist"]),
    "json_group_size": ("ValueError", ["params_split_info_1.json", "group_size 4", "group of 2"]),
    "names_differ": ("ValueError", ["optimizer_rank1.ckpt", "other names or shapes", "beta1_power"]),
    "shapes_differ": ("ValueError", ["optimizer_rank1.ckpt", "other names or shapes", "moment1.net.head.weight"]),
    "truncated": ("ValueError", ["optimizer_rank0.ckpt", "truncated or was changed", "3000 bytes"]),
    "truncated_meta_updated": ("ValueError", ["optimizer_rank0.ckpt", "truncated or corrupted"]),
    "corrupted": ("ValueError", ["optimizer_rank0.ckpt", "truncated or corrupted"]),
    "wrong_stage": ("ValueError", ["ZeRO stage 1", "at stage 2", "'train_net'"]),
    "other_names": ("ValueError", ["network.ckpt", "different names", "net.temperature"]),
    "other_shapes": ("ValueError", ["net.head.weight", "(7, 90)", "(5, 90)", "network.ckpt"]),
    "no_checkpoint": ("FileNotFoundError", ["'ckpt_dir'", "no complete checkpoint"]),
    "mid_accum_other_accum": ("ValueError", ["middle of gradient accumulation", "gradient_accumulation_steps 2"]),
    "mid_accum_reshard": ("ValueError", ["middle of gradient accumulation", "world size 2", "but 'train_net' has 4"]),
    "save_exists": ("FileExistsError", [step_dir_name(5), "already exists"]),
    "save_bad_format": ("ValueError", ["'format'", "'h5'"]),
    "save_bad_step": ("ValueError", ["'step'", "-1"]),
}


@pytest.mark.parametrize("check", sorted(EXPECTED))
def test_bad_input_names_file_and_problem_and_changes_nothing(jobs, check):
    job, name, world = ("C", "errors_n4", 4) if check == "mid_accum_reshard" else ("B", "errors", 2)
    kind, words = EXPECTED[check]
    for r in range(world):
        result = json.loads((jobs(job) / f"{name}_rank{r}.json").read_text())[check]
        assert result["error"] is not None and result["error"].startswith(kind + ":"), result["error"]
        for word in words:
            assert word in result["error"], (word, result["error"])
        assert result["unchanged"], "a failed load or save changed the train network"
        assert result["files_after"] == result["files_before"], "a failed call left or removed files"
