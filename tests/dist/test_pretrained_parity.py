"""load_full_checkpoint on 2 and 4 ranks: the same Parameters, bit for bit, as MindOne's way.

MindOne's way: build the full network, ``ms.load_checkpoint`` + ``load_param_into_net`` of the full
file, EMA, optimizer, ``prepare_train_network``. Ours: load the pretrained file into the network
from ``prepare_network`` (``via="net"``, where fine-tuning scripts load: at stage 3 each rank reads
only its rows) or into the train network (``via="train"``: master shards and EMA follow). TinyNet's
dims do not divide by 2 or 4 (tests/models.py), under both split rules. Each case compares every
network Parameter, master shard and EMA weight each rank holds; with those equal bit for bit the
train steps are the same computation, so 5 steps' losses are compared in three cases only. Most
cases build our network under ``sharded_init`` (so only the load gives it values), in both orders: the
sharded build plus the load equal MindOne's eager build plus ``ms.load_checkpoint`` (a
train-step compile costs about 10 s of the jobs' 90). One
msrun job per world size runs every case; the N=2 job also runs the bad inputs, every rank raising.
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from msrun_harness import run_msrun

WORKER = "tests/dist/workers/pretrained_worker.py"
BF16 = np.dtype("bfloat16")


def _cases(world, pre):
    p = {k: str(pre / v) for k, v in {"ckpt": "pre.ckpt", "safetensors": "pre.safetensors", "hf": "hf",
                                      "bf16": "pre_bf16.safetensors", "bf16_ref": "pre_bf16_ref.ckpt"}.items()}

    def case(name, stage, pad, fmt, via, **extra):
        c = dict(name=name, stage=stage, pad=pad, path=p[fmt], ref=p["bf16_ref" if fmt == "bf16" else "ckpt"],
                 via=via, strip="model." if fmt == "hf" else None, bf16=fmt == "bf16")
        return dict(c, **extra)

    if world == 2:
        return [
            case("s0_ckpt_train", 0, False, "ckpt", "train", sharded=True),
            case("s1_st_train_shard_ema", 1, True, "safetensors", "train", shard_ema=True, train=True, sharded=True),
            case("s2_hf_train", 2, False, "hf", "train"),
            case("s3_hf_net_pad", 3, True, "hf", "net", train=True, sharded=True),
            case("s3_ckpt_train", 3, False, "ckpt", "train", sharded=True),
            case("s1_bf16_net", 1, False, "bf16", "net"),
            dict(name="errors", checks=_bad_checks(pre)),
        ]
    return [
        case("s1_ckpt_train_pad", 1, True, "ckpt", "train"),
        case("s2_hf_train_hybrid", 2, True, "hf", "train", hybrid=True, train=True, sharded=True),
        case("s3_st_net_pad", 3, True, "safetensors", "net", sharded=True),
        case("s3_bf16_net", 3, False, "bf16", "net"),
        case("s3_hf_train", 3, False, "hf", "train", sharded=True),
    ]


# ----------------------------------------------------------------------------- files


def _pretrained() -> dict:
    import mindspore as ms
    from models import TinyNet, init_weights

    ms.set_device("CPU")
    return {p.name: p.asnumpy().copy() for p in init_weights(TinyNet(), seed=7).get_parameters()}


def _save_ckpt(values, path, fmt="ckpt"):
    import mindspore as ms

    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in values.items()], str(path), format=fmt)


def _save_hf(values, folder: Path, prefix="model."):
    from mindone_zero.checkpoint import hf_index

    folder.mkdir(parents=True)
    named = {prefix + k: v for k, v in values.items()}
    groups = hf_index.group_into_shards([(k, v.nbytes) for k, v in named.items()], 1000)
    for k, names in enumerate(groups):
        save_file({n: named[n] for n in names}, str(folder / hf_index.shard_file_name(k + 1, len(groups))))
    hf_index.write_index(str(folder), hf_index.index_json(groups, sum(v.nbytes for v in named.values())))
    return len(groups)


def make_files(pre: Path):
    from mindone_zero.checkpoint.writers import stream_checkpoint

    values = _pretrained()
    pre.mkdir(parents=True)
    _save_ckpt(values, pre / "pre.ckpt")
    _save_ckpt(values, pre / "pre.safetensors", "safetensors")
    assert _save_hf(values, pre / "hf") >= 3
    low = {k: v.astype(BF16) for k, v in values.items()}
    stream_checkpoint(str(pre / "pre_bf16.safetensors"), "safetensors", [(k, v.shape, v.dtype) for k, v in low.items()],
                      low.get)
    _save_ckpt({k: v.astype(np.float32) for k, v in low.items()}, pre / "pre_bf16_ref.ckpt")
    _make_bad(values, pre / "bad")


def _make_bad(values, bad: Path):
    n = _save_hf(values, bad / "missing_shard")
    os.remove(bad / "missing_shard" / f"model-00002-of-{n:05d}.safetensors")
    _save_hf(values, bad / "index_lies")
    index = json.loads((bad / "index_lies" / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.ghost.weight"] = index["weight_map"]["model.head.weight"]
    (bad / "index_lies" / "model.safetensors.index.json").write_text(json.dumps(index))
    _save_ckpt(values, bad / "truncated.ckpt")
    os.chmod(bad / "truncated.ckpt", 0o644)
    os.truncate(bad / "truncated.ckpt", os.path.getsize(bad / "truncated.ckpt") - 7)
    _save_ckpt(dict(values, **{"head.weight": values["head.weight"][:5]}), bad / "shape.safetensors", "safetensors")
    (bad / "weights.bin").write_bytes(b"not a checkpoint")
    header = json.dumps({"head.weight": {"dtype": "F8_E4M3", "shape": [7, 90], "data_offsets": [0, 630]}}).encode()
    header += b" " * (-len(header) % 8)
    (bad / "f8.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 630)


def _bad_checks(pre: Path) -> dict:
    bad, good = pre / "bad", str(pre / "pre.ckpt")
    return {
        "missing_shard": [str(bad / "missing_shard"), {"strip_prefix": "model."}],
        "index_lies": [str(bad / "index_lies"), {"strip_prefix": "model."}],
        "truncated": [str(bad / "truncated.ckpt"), {}],
        "shape": [str(bad / "shape.safetensors"), {"strict": False}],
        "unknown_dtype": [str(bad / "f8.safetensors"), {"strict": False}],
        "no_such_path": [str(bad / "nope.safetensors"), {}],
        "extension": [str(bad / "weights.bin"), {}],
        "missing_strict": [str(bad / "shape.safetensors"), {"add_prefix": "x."}],
        "name_map_dup": [good, {}],
        "one_rank": [good, {}],
    }


EXPECTED = {
    "missing_shard": ["ValueError", "shard file", "model-00002-of-"],
    "index_lies": ["ValueError", "'model.ghost.weight'", "does not hold it"],
    "truncated": ["ValueError", "truncated.ckpt", "truncated or corrupted"],
    "shape": ["ValueError", "'head.weight'", "shape.safetensors", "(5, 90)", "(7, 90)"],
    "unknown_dtype": ["ValueError", "f8.safetensors", "F8_E4M3"],
    "no_such_path": ["ValueError", "'path'", "nope.safetensors"],
    "extension": ["ValueError", "'path'", "weights.bin"],
    "missing_strict": ["ValueError", "strict=True", "'embedding.embedding_table'", "shape.safetensors"],
    "name_map_dup": ["ValueError", "'name_map'", "'head.weight'", "'head.bias'"],
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    make_files(root / "pre")
    done = {}

    def get(world):
        if world not in done:
            out = root / f"n{world}"
            try:
                run_msrun(WORKER, world, out, ["--cases", json.dumps(_cases(world, root / "pre"))], timeout=400)
                done[world] = out
            except AssertionError as err:
                done[world] = err
        if isinstance(done[world], AssertionError):
            raise done[world]
        return done[world]

    return get


# ----------------------------------------------------------------------------- tests


LOADS = {2: [c["name"] for c in _cases(2, Path("."))[:-1]], 4: [c["name"] for c in _cases(4, Path("."))]}


TRAINED = [c["name"] for w in (2, 4) for c in _cases(w, Path(".")) if c.get("train")]
CASES = [(w, name) for w in (2, 4) for name in LOADS[w]]


@pytest.mark.parametrize("world,name", CASES, ids=[f"n{w}-{n}" for w, n in CASES])
def test_loaded_state_equals_mindone_way_bit_for_bit(jobs, world, name):
    out = jobs(world)
    for r in range(world):
        npz = dict(np.load(out / f"{name}_rank{r}.npz"))
        ref = {k[4:]: v for k, v in npz.items() if k.startswith("ref/")}
        got = {k[4:]: v for k, v in npz.items() if k.startswith("got/")}
        assert sorted(got) == sorted(ref), (r, sorted(set(got) ^ set(ref)))
        assert any(k.startswith("ema/") for k in ref)
        if "s1" in name or "s2" in name:
            assert any(k.startswith("master_shards/") for k in ref)
        for k in ref:
            assert got[k].shape == ref[k].shape and np.array_equal(got[k], ref[k]), (r, k)
        result = json.loads((out / f"{name}_rank{r}.json").read_text())
        assert result["got_losses"] == result["ref_losses"], r
        assert len(result["got_losses"]) == (5 if name in TRAINED else 0)
        if result["block_bytes"] is not None:  # loaded via prepare_network: exactly this rank's rows were read
            assert result["bytes_read"] == result["block_bytes"], r


def test_stage3_ranks_read_only_their_rows(jobs):
    out = jobs(2)
    sizes = [json.loads((out / f"s3_hf_net_pad_rank{r}.json").read_text())["bytes_read"] for r in range(2)]
    whole = json.loads((out / "s2_hf_train_rank0.json").read_text())["bytes_read"]
    # every parameter split (padded rule) but the 0-d temperature, which both ranks read whole
    assert sum(sizes) == whole + 4 and max(sizes) < 0.6 * whole


@pytest.mark.parametrize("check", sorted(EXPECTED) + ["one_rank"])
def test_bad_input_raises_on_every_rank_and_changes_nothing(jobs, check):
    out = jobs(2)
    for r in range(2):
        result = json.loads((out / f"errors_rank{r}.json").read_text())[check]
        assert result["error"] is not None and result["unchanged"], (r, result)
        if check == "one_rank":
            want = ["ValueError", "'name_map'"] if r == 1 else ["RuntimeError", "global rank(s) [1]"]
        else:
            want = EXPECTED[check]
        assert result["error"].startswith(want[0] + ":"), result["error"]
        for word in want[1:] + ["load_full_checkpoint"]:
            assert word in result["error"], (r, word, result["error"])
