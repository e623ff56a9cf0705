"""Exports of full tensors (one process): the Hugging Face sharded layout (hf_index), the dtype
option, and ``convert_checkpoints`` / ``mindone-zero-convert`` with ``dtype`` and ``max_shard_size``,
read back with the ``safetensors`` package and ``mindspore.load_checkpoint``; bad inputs."""
import json
import os

import mindspore as ms
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from models import LiveArrays
from mindone_zero.checkpoint import atomic_save_checkpoint, convert_checkpoints, write_split_info
from mindone_zero.checkpoint.export import cast_tensor, check_dtype, plan_export
from mindone_zero.checkpoint.hf_index import (INDEX_NAME, group_into_shards, index_json, parse_size, shard_file_name,
                                              write_index)
from mindone_zero.cli.convert import main as convert_main
from mindone_zero.core.partition import ShardSpec, split_all

BF16 = np.dtype("bfloat16")
N = 2
RNG = np.random.default_rng(7)
TENSORS = {  # name -> (full value, split); dim 0 of the split ones does not divide by N
    "dense.weight": (RNG.standard_normal((7, 3)).astype(np.float32), True),
    "emb.table": (RNG.standard_normal((11, 4)).astype(np.float32), True),
    "norm.gamma": (RNG.standard_normal(5).astype(np.float32), False),
    "half.w": (RNG.standard_normal((3, 2)).astype(np.float16), False),
    "ids": (np.arange(6, dtype=np.int32), False),
    "global_step": (np.array(3, np.int32), False),
}
ORDER = list(TENSORS)


# ----------------------------------------------------------------------------- hf_index


@pytest.mark.parametrize("value, want", [
    (1, 1), (5000, 5000), ("5GB", 5 * 10 ** 9), ("500MB", 500 * 10 ** 6), ("2GiB", 2 * 2 ** 30), ("1.5kb", 1500),
    (" 10 KiB ", 10 * 1024), ("7B", 7),
])
def test_parse_size_good(value, want):
    assert parse_size(value, "f") == want


@pytest.mark.parametrize("value", [0, -3, "0MB", "5 parsecs", "GB", "", None, 1.5, True, "-1GB", [5]])
def test_parse_size_bad_names_argument_and_value(value):
    with pytest.raises(ValueError, match=r"For 'f', the argument 'max_shard_size' must be .* but got " +
                       repr(value).replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_size(value, "f")


def test_group_into_shards():
    sizes = [("a", 4), ("b", 4), ("c", 3), ("big", 20), ("d", 1), ("e", 8)]
    assert group_into_shards(sizes, 8) == [["a", "b"], ["c"], ["big"], ["d"], ["e"]]
    assert group_into_shards(sizes, 100) == [["a", "b", "c", "big", "d", "e"]]
    assert group_into_shards([], 8) == [[]]
    assert group_into_shards([("x", 0), ("y", 0)], 1) == [["x", "y"]]


def test_index_json_and_write_index(tmp_path):
    index = index_json([["a", "b"], ["c"]], 123)
    assert index == {"metadata": {"total_size": 123},
                     "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                                    "c": "model-00002-of-00002.safetensors"}}
    assert shard_file_name(3, 12) == "model-00003-of-00012.safetensors"
    path = write_index(str(tmp_path), index)
    assert path == str(tmp_path / INDEX_NAME) and json.loads((tmp_path / INDEX_NAME).read_text()) == index


# ----------------------------------------------------------------------------- dtype


@pytest.mark.parametrize("dtype, want", [(None, None), ("fp32", np.float32), ("fp16", np.float16), ("bf16", BF16),
                                         (ms.float32, np.float32), (ms.float16, np.float16), (ms.bfloat16, BF16)])
def test_check_dtype_good(dtype, want):
    got = check_dtype(dtype, "f")
    assert got is None if want is None else got == np.dtype(want)


@pytest.mark.parametrize("dtype", ["int7", "float32", "FP16", 7, ms.int32, np.float16])
def test_check_dtype_bad(dtype):
    with pytest.raises(ValueError) as err:
        check_dtype(dtype, "save_full_checkpoint")
    assert str(err.value) == ("For 'save_full_checkpoint', the argument 'dtype' must be one of "
                              f"['fp32', 'fp16', 'bf16'] or None, but got {dtype!r}.")


@pytest.mark.parametrize("target", [None, np.dtype(np.float32), np.dtype(np.float16), BF16])
def test_cast_tensor_floats_only(target):
    for name, (value, _) in TENSORS.items():
        out = cast_tensor(value, target)
        if target is None or value.dtype.kind != "f":
            assert out is value  # no copy
        else:
            assert out.dtype == target and np.array_equal(out.view(np.uint8), value.astype(target).view(np.uint8))
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 65504.0, -0.0], np.float32)  # ties to even in bf16
    assert cast_tensor(x, BF16).astype(np.float32).tolist() == [1.0, 1.0, 1.015625, 65536.0, -0.0]
    assert cast_tensor("text", BF16) == "text"


def test_plan_export_order_and_sizes():
    entries = [(k, v.shape, v.dtype) for k, (v, _) in TENSORS.items()]
    one = plan_export(entries, "ckpt", np.dtype(np.float16), None)
    assert one.order == ORDER and not one.sharded
    assert [e[2] for e in one.files[0][1]] == [np.float16] * 4 + [np.int32] * 2
    many = plan_export(entries, "safetensors", BF16, 32)
    assert many.sharded and len(many.files) > 2 and sorted(many.order) == sorted(ORDER)
    assert many.total_size == sum(v.size * (4 if v.dtype == np.int32 else 2) for v, _ in TENSORS.values())


# ----------------------------------------------------------------------------- offline combine


def _write_group(folder, fmt="ckpt"):
    for r in range(N):
        blocks = {k: split_all(a, N)[r] if s else a for k, (a, s) in TENSORS.items()}
        atomic_save_checkpoint(blocks, os.path.join(folder, f"net_{r}.{fmt}"))
        write_split_info([ShardSpec(k, a.shape, N, r, s) for k, (a, s) in TENSORS.items()], folder, r)
    return os.path.join(folder, "net_{}." + fmt), os.path.join(folder, "params_split_info_{}.json")


def _want(target):
    return {k: cast_tensor(v, target) for k, (v, _) in TENSORS.items()}


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _ms_load(path):
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(path, format=path.rsplit(".", 1)[1]).items()}


@pytest.mark.parametrize("dtype", [None, "fp32", "fp16", "bf16"])
@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_convert_single_file_in_dtype(tmp_path, dtype, fmt):
    src, info = _write_group(str(tmp_path))
    out = convert_checkpoints(src, info, N, output_format=fmt, dtype=dtype)
    assert out == str(tmp_path / f"net_all_{N}.{fmt}")
    want, got = _want(check_dtype(dtype, "t")), _ms_load(out)
    assert list(got) == ORDER if fmt == "ckpt" else sorted(got) == sorted(ORDER)
    for k in ORDER:
        assert _same_bits(got[k], want[k]), k
    if fmt == "safetensors" and dtype != "bf16":
        loaded = load_file(out)
        assert all(_same_bits(loaded[k], want[k]) for k in ORDER)


@pytest.mark.parametrize("dtype", [None, "fp16", "bf16"])
def test_convert_sharded_folder(tmp_path, dtype):
    src, info = _write_group(str(tmp_path))
    out = convert_checkpoints(src, info, N, dtype=dtype, max_shard_size=40)
    assert out == str(tmp_path / f"net_all_{N}")
    files = sorted(os.listdir(out))
    n = len(files) - 1
    assert n >= 3 and files == sorted([INDEX_NAME] + [shard_file_name(k, n) for k in range(1, n + 1)])
    index = json.loads((tmp_path / f"net_all_{N}" / INDEX_NAME).read_text())
    want = _want(check_dtype(dtype, "t"))
    assert sorted(index["weight_map"]) == sorted(ORDER)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in want.values())
    seen = {}
    for name in [f for f in files if f != INDEX_NAME]:
        path = os.path.join(out, name)
        by_ms = _ms_load(path)
        assert {k for k, f in index["weight_map"].items() if f == name} == set(by_ms)
        data = sum(v.nbytes for v in by_ms.values())
        assert data <= 40 or len(by_ms) == 1  # a tensor larger than the limit gets a file of its own
        if dtype != "bf16":
            with safe_open(path, framework="np") as f:
                assert all(_same_bits(f.get_tensor(k), by_ms[k]) for k in f.keys())
        seen.update(by_ms)
    assert sorted(seen) == sorted(ORDER) and all(_same_bits(seen[k], want[k]) for k in ORDER)


def test_cli_dtype_and_max_shard_size(tmp_path, capsys):
    src, info = _write_group(str(tmp_path), "safetensors")
    assert convert_main(["--src_checkpoint", src, "--src_param_split_info_json", info, "--group_size", str(N),
                         "--dtype", "bf16", "--max_shard_size", "40B", "--quiet"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / f"net_all_{N}") and os.path.isfile(os.path.join(out, INDEX_NAME))
    with pytest.raises(SystemExit) as err:
        convert_main(["--src_checkpoint", src, "--src_param_split_info_json", info, "--group_size", str(N),
                      "--max_shard_size", "lots"])
    assert err.value.code == 2 and "'max_shard_size'" in capsys.readouterr().err


def _no_output(tmp_path):
    return [f for f in os.listdir(tmp_path) if "all" in f]


@pytest.mark.parametrize("kwargs, match", [
    (dict(dtype="int7"), "the argument 'dtype' must be one of \\['fp32', 'fp16', 'bf16'\\] or None, but got 'int7'"),
    (dict(dtype=ms.int8), "argument 'dtype'.*but got mindspore.int8"),
    (dict(max_shard_size="5 parsecs"), "argument 'max_shard_size'.*but got '5 parsecs'"),
    (dict(max_shard_size=0), "argument 'max_shard_size'.*but got 0"),
    (dict(max_shard_size=100, output_format="ckpt"), "argument 'output_format' must be 'safetensors' or None.*'ckpt'"),
])
def test_convert_bad_input_names_argument_and_leaves_nothing(tmp_path, kwargs, match):
    src, info = _write_group(str(tmp_path))
    with pytest.raises(ValueError, match=match):
        convert_checkpoints(src, info, N, **kwargs)
    assert not _no_output(tmp_path)


def test_convert_sharded_target_must_be_new_or_empty_folder(tmp_path):
    src, info = _write_group(str(tmp_path))
    target = tmp_path / f"net_all_{N}"
    target.write_text("a file")
    with pytest.raises(ValueError, match="must be a folder when 'max_shard_size' is set, but .* is a file"):
        convert_checkpoints(src, info, N, max_shard_size=100)
    target.unlink()
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    with pytest.raises(ValueError, match="must be a new or empty folder"):
        convert_checkpoints(src, info, N, max_shard_size=100)
    assert os.listdir(target) == ["keep.txt"]
    (target / "keep.txt").unlink()
    assert convert_checkpoints(src, info, N, max_shard_size=100) == str(target)  # an empty folder is filled
    assert INDEX_NAME in os.listdir(target) and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_convert_sharded_failure_half_way_leaves_nothing(tmp_path, monkeypatch):
    src, info = _write_group(str(tmp_path))
    from mindone_zero.checkpoint import convert as convert_mod
    calls = []

    def failing(value, target):
        calls.append(1)
        if len(calls) == 4:
            raise OSError("disk full (injected)")
        return cast_tensor(value, target)

    monkeypatch.setattr(convert_mod, "cast_tensor", failing)
    with pytest.raises(OSError, match="injected"):
        convert_checkpoints(src, info, N, max_shard_size=40)
    assert not _no_output(tmp_path) and not [f for f in os.listdir(tmp_path) if f.startswith(".")]


# ----------------------------------------------------------------------------- online export, one process


@pytest.mark.parametrize("dtype, max_shard_size, name", [(None, None, "full.ckpt"), ("bf16", None, "full.safetensors"),
                                                         ("fp16", "200B", "full/")])
@pytest.mark.usefixtures("pynative_mode")
def test_save_full_checkpoint_one_process_streams(tmp_path, monkeypatch, dtype, max_shard_size, name):
    """World 1 (no communication): the export equals gather_full_params cast with numpy, and each
    gathered array is gone before the next gather (the multi-process version: tests/dist/test_export_job.py)."""
    from models import LossNet, TinyNet, init_weights, make_optimizer
    from mindone_zero import EMA, gather_full_params, prepare_train_network, save_full_checkpoint
    from mindone_zero.checkpoint import online

    net = init_weights(TinyNet())
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params()), ema=EMA(net, 0.9),
                                  params_split_info=str(tmp_path / "info"))
    full = gather_full_params(train, include_ema=True)
    real, seen = online._full_value, []

    def spy(*args):
        seen.append(LiveArrays.live)
        return real(*args).view(LiveArrays)

    monkeypatch.setattr(online, "_full_value", spy)
    path = str(tmp_path / name)
    assert save_full_checkpoint(train, path, True, dtype=dtype, max_shard_size=max_shard_size) == path
    assert seen == [0] * len(full)
    files = [path] if max_shard_size is None else [os.path.join(path, f) for f in sorted(os.listdir(path))
                                                   if f != INDEX_NAME]
    assert len(files) >= (1 if max_shard_size is None else 3)
    got = {k: v.asnumpy() for f in files for k, v in ms.load_checkpoint(f, format=f.rsplit(".", 1)[1]).items()}
    target = check_dtype(dtype, "t")
    want = {k: v if target is None or v.dtype.kind != "f" else v.astype(target) for k, v in full.items()}
    assert sorted(got) == sorted(want) and all(_same_bits(got[k], want[k]) for k in want)
