"""load_full_checkpoint in one process, and the ranged reads under it ([Note: ranged reads]).

A pretrained TinyNet (tests/models.py: uneven dims, a 0-d parameter) is written as a .ckpt, a
.safetensors file and a Hugging Face sharded folder, and loaded into a plain network (stage 0).
The split path is exercised here by a parameter carrying a ``zero_spec`` (as ZeRO-3 leaves it).
"""
import json
import os
import struct

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from safetensors.numpy import save_file

from models import TinyNet, init_weights
from mindone_zero import load_full_checkpoint
from mindone_zero.checkpoint import hf_index, open_checkpoint
from mindone_zero.checkpoint import writers as checkpoint_writers
from mindone_zero.checkpoint.writers import stream_checkpoint
from mindone_zero.core.partition import ShardSpec, set_zero_spec, split_array

ms.set_device("CPU")
pytestmark = pytest.mark.usefixtures("pynative_mode")  # restored after each test ([Note: leak guard])

BF16 = np.dtype("bfloat16")
CALLER = "For 'load_full_checkpoint'"


def _arrays():
    rng = np.random.default_rng(3)
    return {
        "w73": rng.standard_normal((7, 3)).astype(np.float32) + 5,
        "v5": rng.standard_normal((5,)).astype(np.float16),
        "t234": (rng.standard_normal((2, 3, 4)) + 5).astype(BF16),
        "i9": np.arange(9 * 2, dtype=np.int32).reshape(9, 2),
        "s": np.array(2.5, np.float32),
    }


def _stream(path, fmt, arrays):
    entries = [(k, v.shape, v.dtype) for k, v in arrays.items()]
    return stream_checkpoint(str(path), fmt, entries, lambda name: arrays[name])


def _ranges(d0):
    return [(a, b) for a in range(d0 + 1) for b in range(a, d0 + 1)]


# ----------------------------------------------------------------------------- ranged reads


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_read_rows_equals_numpy_slicing(tmp_path, fmt, monkeypatch):
    # ckpt records of 20 bytes: tensors span several records, cut inside rows (rows of 12, 2, 48 bytes)
    monkeypatch.setattr(checkpoint_writers, "_CKPT_RECORD_BYTES", 20)
    arrays = _arrays()
    reader = open_checkpoint(_stream(tmp_path / f"a.{fmt}", fmt, arrays))
    if fmt == "ckpt":
        assert len(reader._chunks["w73"]) == 5  # 84 bytes in records of 20
    for name, arr in arrays.items():
        if arr.ndim == 0:
            assert reader.read_rows(name) == arr
            with pytest.raises(ValueError, match="0-d"):
                reader.read_rows(name, 0, 1)
            continue
        assert np.array_equal(reader.read_rows(name), arr) and reader.read_rows(name).dtype == arr.dtype
        for a, b in _ranges(arr.shape[0]):
            got = reader.read_rows(name, a, b)
            assert got.dtype == arr.dtype and np.array_equal(got, arr[a:b]), (name, a, b)
        with pytest.raises(ValueError, match="outside"):
            reader.read_rows(name, 0, arr.shape[0] + 1)


def test_read_rows_of_a_file_written_by_safetensors(tmp_path):
    arrays = {k: v for k, v in _arrays().items() if v.dtype != BF16}
    save_file(arrays, str(tmp_path / "x.safetensors"))
    reader = open_checkpoint(str(tmp_path / "x.safetensors"))
    for a, b in _ranges(7):
        assert np.array_equal(reader.read_rows("w73", a, b), arrays["w73"][a:b])


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_truncated_file_is_refused_at_open(tmp_path, fmt):
    path = _stream(tmp_path / f"a.{fmt}", fmt, _arrays())
    os.chmod(path, 0o644)
    os.truncate(path, os.path.getsize(path) - 3)
    with pytest.raises(ValueError, match="truncated or corrupted") as err:
        open_checkpoint(path)
    assert path in str(err.value)


# ----------------------------------------------------------------------------- formats


def _pretrained(seed=7):
    net = init_weights(TinyNet(), seed=seed)
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def _write(tmp_path, fmt, values, prefix=""):
    named = {prefix + k: v for k, v in values.items()}
    if fmt == "hf":
        folder = tmp_path / "hf"
        folder.mkdir()
        groups = hf_index.group_into_shards([(k, v.nbytes) for k, v in named.items()], 200)
        assert len(groups) >= 3
        for k, names in enumerate(groups):
            save_file({n: named[n] for n in names}, str(folder / hf_index.shard_file_name(k + 1, len(groups))))
        hf_index.write_index(str(folder), hf_index.index_json(groups, sum(v.nbytes for v in named.values())))
        return str(folder)
    path = str(tmp_path / f"pre.{fmt}")
    ms.save_checkpoint([{"name": k, "data": Tensor(v)} for k, v in named.items()], path, format=fmt)
    return path


def _values(net):
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def _assert_values(net, values):
    got = _values(net)
    assert sorted(got) == sorted(values)
    for k, v in values.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors", "hf"])
def test_load_into_a_plain_network_in_each_format(tmp_path, fmt):
    values = _pretrained()
    path = _write(tmp_path, fmt, values, prefix="model." if fmt == "hf" else "")
    net = init_weights(TinyNet(), seed=0)
    kwargs = {"strip_prefix": "model."} if fmt == "hf" else {}
    assert load_full_checkpoint(net, path, **kwargs) == ([], [])
    _assert_values(net, values)


def test_unmaterialized_parameters_get_their_data_without_init(tmp_path):
    values = _pretrained()
    path = _write(tmp_path, "safetensors", values)
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        net = TinyNet()
    assert any(p.has_init for p in net.get_parameters())
    load_full_checkpoint(net, path)
    assert not any(p.has_init for p in net.get_parameters())
    _assert_values(net, values)


class _Holder(nn.Cell):
    def __init__(self, **params):
        super().__init__()
        for k, v in params.items():
            setattr(self, k, v)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_split_parameter_gets_its_rows_zero_padded(tmp_path, rank):
    full = np.arange(7 * 3, dtype=np.float32).reshape(7, 3) + 1
    path = _write(tmp_path, "ckpt", {"w": full, "b": full[:, 0].copy()})
    w = Parameter(Tensor(np.zeros((4, 3), np.float32)), name="w")
    set_zero_spec(w, ShardSpec("w", (7, 3), 2, rank, True))
    b = Parameter(Tensor(np.zeros((7,), np.float32)), name="b")
    load_full_checkpoint(_Holder(w=w, b=b), path)
    assert np.array_equal(w.asnumpy(), split_array(full, 2, rank)) and np.array_equal(b.asnumpy(), full[:, 0])


# ----------------------------------------------------------------------------- names


def test_name_map_renames_and_skips(tmp_path):
    values = _pretrained()
    named = {"hf." + k.replace(".", "/"): v for k, v in values.items()}
    named["hf.extra"] = np.zeros(2, np.float32)
    path = _write(tmp_path, "ckpt", named)
    net = TinyNet()
    mapping = {"hf." + k.replace(".", "/"): k for k in values}
    assert load_full_checkpoint(net, path, name_map=mapping.get) == ([], [])
    _assert_values(net, values)


def test_prefixes_add_and_strip(tmp_path):
    values = _pretrained()
    path = _write(tmp_path, "ckpt", {"model." + k: v for k, v in values.items()})
    holder = _Holder(net=TinyNet())  # parameters named net.*
    load_full_checkpoint(holder, path, strip_prefix="model.", add_prefix="net.")
    _assert_values(holder, {"net." + k: v for k, v in values.items()})


def test_two_names_mapped_to_one_raise_naming_both(tmp_path):
    path = _write(tmp_path, "ckpt", _pretrained())
    net = TinyNet()
    before = _values(net)
    with pytest.raises(ValueError, match="'name_map'") as err:
        load_full_checkpoint(net, path, name_map=lambda n: "head.weight" if n.startswith("head.") else n)
    assert "'head.weight'" in str(err.value) and "'head.bias'" in str(err.value)
    _assert_values(net, before)


# ----------------------------------------------------------------------------- dtypes


def _bf16_exact(arr):
    return arr.astype(BF16).astype(np.float32)


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_bf16_and_fp16_files_load_into_fp32_exactly(tmp_path, fmt):
    values = _pretrained()
    low = {k: (v.astype(BF16) if i % 2 else v.astype(np.float16)) for i, (k, v) in enumerate(values.items())}
    path = _stream(tmp_path / f"low.{fmt}", fmt, low)
    net = TinyNet()
    load_full_checkpoint(net, path)
    _assert_values(net, {k: v.astype(np.float32) for k, v in low.items()})


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16])
def test_fp32_file_into_low_precision_params_and_back(tmp_path, dtype):
    full = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    exact = _bf16_exact(full) if dtype == ms.bfloat16 else full.astype(np.float16).astype(np.float32)
    path = _write(tmp_path, "safetensors", {"w": full, "x": exact})
    w = Parameter(Tensor(np.zeros((5, 3)), dtype), name="w")
    x = Parameter(Tensor(np.zeros((5, 3)), dtype), name="x")
    load_full_checkpoint(_Holder(w=w, x=x), path)
    want = full.astype(BF16 if dtype == ms.bfloat16 else np.float16)
    assert np.array_equal(w.asnumpy(), want) and np.array_equal(x.asnumpy(), want)
    # round trip: representable values come back bit for bit
    assert np.array_equal(x.astype(ms.float32).asnumpy(), exact)


def test_an_int_tensor_does_not_load_into_a_float_parameter(tmp_path):
    path = _write(tmp_path, "ckpt", {"w": np.ones((2, 2), np.int32)})
    w = Parameter(Tensor(np.zeros((2, 2), np.float32)), name="w")
    with pytest.raises(ValueError, match="dtype int32.*only floating types convert") as err:
        load_full_checkpoint(_Holder(w=w), path)
    assert path in str(err.value) and "'w'" in str(err.value)


def test_an_unknown_dtype_in_the_file_raises(tmp_path):
    header = json.dumps({"w": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    path = str(tmp_path / "f8.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\x01" * 4)
    w = Parameter(Tensor(np.zeros((2, 2), np.float32)), name="w")
    with pytest.raises(ValueError, match="F8_E4M3") as err:
        load_full_checkpoint(_Holder(w=w), path)
    assert path in str(err.value) and CALLER in str(err.value)


# ----------------------------------------------------------------------------- strict and bad input


def test_strict_missing_and_unexpected_raise_and_change_nothing(tmp_path):
    values = _pretrained()
    values.pop("head.bias")
    values["stray.weight"] = np.ones(3, np.float32)
    path = _write(tmp_path, "ckpt", values)
    net = TinyNet()
    before = _values(net)
    with pytest.raises(ValueError, match="strict=True") as err:
        load_full_checkpoint(net, path)
    for word in ("'head.bias'", "'stray.weight'", path):
        assert word in str(err.value), word
    _assert_values(net, before)
    missing, unexpected = load_full_checkpoint(net, path, strict=False)
    assert (missing, unexpected) == (["head.bias"], ["stray.weight"])
    after = _values(net)
    assert np.array_equal(after["head.bias"], before["head.bias"])
    assert np.array_equal(after["head.weight"], values["head.weight"])


@pytest.mark.parametrize("strict", [True, False])
def test_a_wrong_shape_raises_even_when_not_strict(tmp_path, strict):
    values = _pretrained()
    values["head.weight"] = values["head.weight"][:5]
    path = _write(tmp_path, "safetensors", values)
    net = TinyNet()
    before = _values(net)
    with pytest.raises(ValueError, match=r"'head.weight'.*\(5, 90\).*\(7, 90\)") as err:
        load_full_checkpoint(net, path, strict=strict)
    assert path in str(err.value)
    _assert_values(net, before)


def _bad_paths(tmp_path):
    values = _pretrained()
    hf = _write(tmp_path, "hf", values)
    no_shard = tmp_path / "no_shard"
    os.rename(hf, no_shard)
    os.remove(no_shard / hf_index.shard_file_name(2, len(os.listdir(no_shard)) - 1))
    lying = tmp_path / "lying"
    os.makedirs(lying)
    save_file({"head.weight": values["head.weight"]}, str(lying / hf_index.shard_file_name(1, 1)))
    hf_index.write_index(str(lying), hf_index.index_json([["head.weight", "head.bias"]], 0))
    truncated = _write(tmp_path, "ckpt", values)
    os.chmod(truncated, 0o644)
    os.truncate(truncated, os.path.getsize(truncated) - 10)
    (tmp_path / "w.bin").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    return {
        "missing_path": (str(tmp_path / "nope.ckpt"), ["'path'", "nope.ckpt"]),
        "extension": (str(tmp_path / "w.bin"), ["'path'", "w.bin", ".safetensors"]),
        "no_index": (str(tmp_path / "empty"), ["'path'", "model.safetensors.index.json"]),
        "missing_shard": (str(no_shard), ["shard file", "model-00002-of"]),
        "index_names_missing_tensor": (str(lying), ["'head.bias'", "does not hold it", "model-00001-of-00001"]),
        "truncated": (truncated, ["truncated or corrupted", truncated]),
    }


def test_each_bad_path_raises_naming_it_and_changes_nothing(tmp_path):
    net = TinyNet()
    before = _values(net)
    for case, (path, words) in _bad_paths(tmp_path).items():
        with pytest.raises(ValueError) as err:
            load_full_checkpoint(net, path)
        for word in words + [CALLER]:
            assert word in str(err.value), (case, word, str(err.value))
    _assert_values(net, before)


@pytest.mark.parametrize("kwargs,arg", [
    (dict(network=object()), "'network'"),
    (dict(path=3), "'path'"),
    (dict(strict="yes"), "'strict'"),
    (dict(strip_prefix=1), "'strip_prefix'"),
    (dict(name_map="x"), "'name_map'"),
    (dict(name_map=lambda n: 1), "'name_map'"),
])
def test_bad_arguments_raise_type_errors_naming_them(tmp_path, kwargs, arg):
    path = _write(tmp_path, "ckpt", _pretrained())
    args = dict(network=TinyNet(), path=path)
    args.update(kwargs)
    with pytest.raises(TypeError, match=arg):
        load_full_checkpoint(args.pop("network"), args.pop("path"), **args)


def test_name_map_with_prefixes_is_refused(tmp_path):
    path = _write(tmp_path, "ckpt", _pretrained())
    with pytest.raises(ValueError, match="either the argument 'name_map' or the prefixes"):
        load_full_checkpoint(TinyNet(), path, name_map=str, add_prefix="a.")


# ----------------------------------------------------------------------------- train network


def _train_net(**kwargs):
    from models import LossNet, make_optimizer
    from mindone_zero import EMA, prepare_train_network

    net = init_weights(TinyNet(), seed=0)
    loss_net = LossNet(net)
    ema = EMA(net, ema_decay=0.9)
    return prepare_train_network(loss_net, make_optimizer(net.trainable_params()), ema=ema, **kwargs)


def test_a_train_network_and_its_ema_follow_the_file(tmp_path):
    values = _pretrained()
    path = _write(tmp_path, "safetensors", values)
    train = _train_net()
    assert load_full_checkpoint(train, path, add_prefix="net.") == ([], [])
    _assert_values(train.network, {"net." + k: v for k, v in values.items()})
    ema = {p.name: p.asnumpy() for p in train.ema.ema_weight}
    assert ema and all(np.array_equal(v, values[k[len("ema.net."):]]) for k, v in ema.items())


def test_a_train_network_with_optimizer_offload_is_refused(tmp_path):
    path = _write(tmp_path, "ckpt", _pretrained())
    train = _train_net(zero_stage=0, optimizer_offload=True)
    assert train.zero_helper.host_offload is not None  # the refusal below is about a host-offloaded train network
    with pytest.raises(ValueError, match="optimizer_offload"):
        load_full_checkpoint(train, path, add_prefix="net.")


def test_prefixes_that_map_two_names_to_one_raise_naming_both(tmp_path):
    values = _pretrained()
    path = _write(tmp_path, "ckpt", dict(values, **{"model.head.bias": values["head.bias"]}))
    with pytest.raises(ValueError, match="'strip_prefix'/'add_prefix'") as err:
        load_full_checkpoint(TinyNet(), path, strip_prefix="model.")
    assert "'head.bias'" in str(err.value) and "'model.head.bias'" in str(err.value)
