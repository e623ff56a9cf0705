"""mindone_zero.checkpoint file pieces: atomic writes, split-info JSON, and the offline combine of per-rank shards.

Per-rank files are faked in one process with partition.split_all and atomic_save_checkpoint,
exactly as ZeRO ranks would write them: uneven dim 0 (7, 11), 0-d and replicated tensors,
optimizer states, both file formats, groups of 2 and 4.
"""
import json
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest

from msrun_harness import REPO as ROOT
from mindone_zero import checkpoint
from mindone_zero.checkpoint import (
    atomic_save_checkpoint,
    atomic_write_json,
    convert_checkpoints,
    open_checkpoint,
    read_split_info,
    write_split_info,
)
from mindone_zero.checkpoint import writers as checkpoint_writers
from mindone_zero.core.partition import ShardSpec, merge_arrays, split_all

ms.set_device("CPU")
BF16 = np.dtype("bfloat16")  # registered by mindspore
FORMATS = ["ckpt", "safetensors"]


def _full_tensors():
    """name -> (full array, split). Values start away from 0 so padding rows cannot pass as data."""
    rng = np.random.default_rng(7)
    net = {
        "dense.weight": (rng.standard_normal((7, 3)).astype(np.float32) + 5, True),
        "dense.bias": (rng.standard_normal((11,)).astype(np.float16) + 5, True),
        "embed.table": ((rng.standard_normal((8, 2, 2)) + 5).astype(BF16), True),
        "norm.gamma": (rng.standard_normal((5,)).astype(np.float32) + 5, False),  # parallel_optimizer=False
        "scale": (np.array(3.25, np.float32), False),  # 0-d: always replicated
    }
    tensors = dict(net)
    for name, (arr, split) in net.items():
        tensors[f"moment1.{name}"] = ((arr.astype(np.float32) * 2).astype(arr.dtype), split)
        tensors[f"moment2.{name}"] = ((arr.astype(np.float32) * 3).astype(arr.dtype), split)
    tensors["ema.dense.weight"] = (net["dense.weight"][0] - 1, True)
    tensors["global_step"] = (np.array(12, np.int32), False)
    tensors["beta1_power"] = (np.array(0.5, np.float32), False)
    return tensors


def _rank_tensors(tensors, n):
    """One {name: block} dict per rank."""
    ranks = [{} for _ in range(n)]
    for name, (arr, split) in tensors.items():
        for r in range(n):
            ranks[r][name] = split_all(arr, n)[r] if split else arr
    return ranks


def _write_group(folder, n, fmt, tensors=None, *, ranks=None, mindone_json=False):
    """Save every rank's checkpoint and split info; returns (ckpt pattern, json pattern)."""
    tensors = _full_tensors() if tensors is None else tensors
    ranks = _rank_tensors(tensors, n) if ranks is None else ranks
    for r, blocks in enumerate(ranks):
        atomic_save_checkpoint(blocks, os.path.join(folder, f"net_{r}.{fmt}"))
        if mindone_json:  # MindOne lists network parameters only, without shape/pad
            info = {k: {"split": s, "group_size": n, "rank_id": r} for k, (_, s) in tensors.items()
                    if not k.startswith(("moment", "ema.", "global_step", "beta"))}
            atomic_write_json(info, os.path.join(folder, "info", f"params_split_info_{r}.json"))
        else:
            specs = [ShardSpec(k, a.shape, n, r, s) for k, (a, s) in tensors.items()]
            write_split_info(specs, os.path.join(folder, "info"), r)
    return os.path.join(folder, "net_{}." + fmt), os.path.join(folder, "info", "params_split_info_{}.json")


def _load(path):
    fmt = "safetensors" if path.endswith(".safetensors") else "ckpt"
    return {k: v.float().asnumpy() if v.dtype == ms.bfloat16 else v.asnumpy()
            for k, v in ms.load_checkpoint(path, format=fmt).items()}


def _assert_equal_to_full(loaded, tensors, names):
    assert sorted(loaded) == sorted(names)
    for name in names:
        want = tensors[name][0]
        got = loaded[name]
        assert got.shape == want.shape, name
        assert np.array_equal(got, want.astype(np.float32) if want.dtype == BF16 else want), name
        if want.dtype != BF16:
            assert got.dtype == want.dtype, name


# ----------------------------------------------------------------------------- atomic writes


@pytest.mark.parametrize("fmt", FORMATS)
def test_atomic_save_round_trip_and_input_forms(tmp_path, fmt):
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = str(tmp_path / f"a.{fmt}")
    forms = [
        {"x": arr, "s": np.float32(2)},
        [{"name": "x", "data": ms.Tensor(arr)}, {"name": "s", "data": np.array(2, np.float32)}],
        [ms.Parameter(ms.Tensor(arr), name="x"), ms.Parameter(ms.Tensor(np.array(2, np.float32)), name="s")],
    ]
    for params in forms:
        assert atomic_save_checkpoint(params, path) == path
        loaded = _load(path)
        assert np.array_equal(loaded["x"], arr) and loaded["s"].shape == () and loaded["s"] == 2
    assert os.listdir(tmp_path) == [f"a.{fmt}"]


def test_atomic_save_rejects_bad_path_and_format(tmp_path):
    with pytest.raises(ValueError, match="must end with"):
        atomic_save_checkpoint({"x": np.ones(2)}, str(tmp_path / "a.bin"))
    with pytest.raises(ValueError, match="matching 'format'"):
        atomic_save_checkpoint({"x": np.ones(2)}, str(tmp_path / "a.ckpt"), format="safetensors")
    with pytest.raises(TypeError, match="safetensors cannot store strings"):
        atomic_save_checkpoint({"x": "text"}, str(tmp_path / "a.safetensors"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_interrupted_save_keeps_previous_file(tmp_path, monkeypatch, fmt):
    path = str(tmp_path / f"a.{fmt}")
    atomic_save_checkpoint({"x": np.ones((4, 2), np.float32)}, path)
    real_save = ms.save_checkpoint

    def crash_midway(save_obj, ckpt_file_name, *args, **kwargs):
        real_save(save_obj, ckpt_file_name, *args, **kwargs)
        with open(ckpt_file_name, "r+b") as f:  # a half-written file under the name it was given
            f.truncate(os.path.getsize(ckpt_file_name) // 2)
        raise RuntimeError("disk full")

    monkeypatch.setattr(ms, "save_checkpoint", crash_midway)
    with pytest.raises(RuntimeError, match="disk full"):
        atomic_save_checkpoint({"x": np.zeros((40, 2), np.float32)}, path)
    with pytest.raises(RuntimeError, match="disk full"):
        atomic_save_checkpoint({"x": np.zeros(3, np.float32)}, str(tmp_path / f"new.{fmt}"))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [f"a.{fmt}"]  # no new file, no temporary left behind
    assert np.array_equal(_load(path)["x"], np.ones((4, 2), np.float32))


def test_atomic_write_json_failure_keeps_previous_file(tmp_path):
    path = str(tmp_path / "sub" / "x.json")
    atomic_write_json({"a": 1}, path)
    with pytest.raises(TypeError):
        atomic_write_json({"a": object()}, path)
    assert os.listdir(tmp_path / "sub") == ["x.json"]
    with open(path) as f:
        assert json.load(f) == {"a": 1}


# ----------------------------------------------------------------------------- readers


def test_ckpt_reader_matches_mindspore_on_sliced_crc_and_string_entries(tmp_path, monkeypatch):
    from mindspore.train import serialization

    # Force MindSpore to cut tensors into 1 KB records, as it does above 512 MB.
    monkeypatch.setattr(serialization, "SLICE_SIZE", 1)
    big = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    path = str(tmp_path / "a.ckpt")
    ms.save_checkpoint([{"name": "big", "data": ms.Tensor(big)}, {"name": "z", "data": ms.Tensor(np.int64(4))}],
                       path, crc_check=True, append_dict={"note": "hello"})
    reader = open_checkpoint(path)
    assert reader.infos["big"].shape == (1000, 3) and reader.infos["z"].shape == ()
    assert np.array_equal(reader.read("big"), big)
    assert reader.read("z") == 4 and reader.read("note") == "hello"
    assert np.array_equal(ms.load_checkpoint(path)["big"].asnumpy(), big)


# ----------------------------------------------------------------------------- split-info JSON


def test_split_info_round_trip_tag_and_mindone_format(tmp_path):
    specs = [ShardSpec("w", (7, 3), 4, 2, True), ShardSpec("s", (), 4, 2, False)]
    path = write_split_info(specs, str(tmp_path), 2, tag="_dp1")
    assert os.path.basename(path) == "params_split_info_2_dp1.json"
    info = read_split_info(path)
    assert info == {s.name: s.to_json() for s in specs}
    assert info["w"] == {"split": True, "group_size": 4, "rank_id": 2, "shape": [7, 3], "pad": 1}
    assert os.path.basename(write_split_info(specs, str(tmp_path), 2)) == "params_split_info_2.json"
    mindone = tmp_path / "mindone.json"
    mindone.write_text(json.dumps({"w": {"split": True, "group_size": 2, "rank_id": 1}}))
    assert read_split_info(str(mindone)) == {"w": {"split": True, "group_size": 2, "rank_id": 1}}


def test_write_split_info_rejects_other_rank(tmp_path):
    with pytest.raises(ValueError, match="must have rank 1"):
        write_split_info([ShardSpec("w", (7,), 2, 0, True)], str(tmp_path), 1)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("entry,problem", [
    ({"split": 1, "group_size": 2, "rank_id": 0}, "'split' must be a bool"),
    ({"split": True, "group_size": 2, "rank_id": 2}, "0 <= rank_id < group_size"),
    ({"split": True, "group_size": 2, "rank_id": 0, "shape": [7], "pad": 0}, "needs 1"),
    ({"split": True, "group_size": 2, "rank_id": 0, "shape": []}, "0-d tensor cannot be split"),
    ({"split": False, "group_size": 2, "rank_id": 0, "shape": "7"}, "'shape' must be a list"),
])
def test_read_split_info_names_file_and_problem(tmp_path, entry, problem):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"w": entry}))
    with pytest.raises(ValueError, match=problem) as err:
        read_split_info(str(path))
    assert str(path) in str(err.value) and "'w'" in str(err.value)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON") as err:
        read_split_info(str(path))
    assert str(path) in str(err.value)


# ----------------------------------------------------------------------------- combine


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_round_trip_is_exact(tmp_path, n, fmt):
    tensors = _full_tensors()
    src, info = _write_group(str(tmp_path), n, fmt, tensors)
    seen = []
    out = convert_checkpoints(src, info, n, progress=lambda done, total, name: seen.append((done, total, name)))
    assert out == str(tmp_path / f"net_all_{n}.{fmt}")
    _assert_equal_to_full(_load(out), tensors, list(tensors))
    assert [s[0] for s in seen] == list(range(1, len(tensors) + 1)) and {s[1] for s in seen} == {len(tensors)}
    assert sorted(s[2] for s in seen) == sorted(tensors)


@pytest.mark.parametrize("src_fmt,out_fmt", [("ckpt", "safetensors"), ("safetensors", "ckpt")])
def test_convert_switches_output_format(tmp_path, src_fmt, out_fmt):
    tensors = _full_tensors()
    src, info = _write_group(str(tmp_path), 2, src_fmt, tensors)
    out = convert_checkpoints(src, info, 2, output_format=out_fmt)
    assert out == str(tmp_path / f"net_all_2.{out_fmt}")
    _assert_equal_to_full(_load(out), tensors, list(tensors))
    assert not os.path.exists(tmp_path / f"net_all_2.{src_fmt}")


@pytest.mark.parametrize("mindone_json", [False, True])
def test_exclude_optimizer_states_keeps_network_and_ema(tmp_path, mindone_json):
    tensors = _full_tensors()
    if mindone_json:  # MindOne splits only tensors whose dim 0 divides by the group
        tensors = {k: (a, s and a.shape[0] % 2 == 0) for k, (a, s) in tensors.items()}
    src, info = _write_group(str(tmp_path), 2, "ckpt", tensors, mindone_json=mindone_json)
    out = convert_checkpoints(src, info, 2, exclude_optimizer_states=True)
    kept = ["dense.weight", "dense.bias", "embed.table", "norm.gamma", "scale", "ema.dense.weight"]
    _assert_equal_to_full(_load(out), tensors, kept)


def test_mindone_json_combines_optimizer_states_by_prefix(tmp_path):
    """MindOne's JSON has no shape and lists network names only; it split only dim 0 % N == 0."""
    rng = np.random.default_rng(3)
    net = {"dense.weight": (rng.standard_normal((8, 3)).astype(np.float32), True),
           "dense.bias": (rng.standard_normal((3,)).astype(np.float32), False),
           "blocks.0.proj.weight": (rng.standard_normal((12, 2)).astype(np.float32), True)}
    tensors = dict(net)
    for name, (arr, split) in net.items():
        tensors[f"moment1.{name}"] = (arr * 2, split)
        tensors[f"adam_v.{name}"] = (arr * 3, split)
    tensors["global_step"] = (np.array(5, np.int32), False)
    src, info = _write_group(str(tmp_path), 4, "safetensors", tensors, mindone_json=True)
    assert "shape" not in read_split_info(info.format(0))["dense.weight"]
    _assert_equal_to_full(_load(convert_checkpoints(src, info, 4)), tensors, list(tensors))


def test_string_entries_are_copied_to_ckpt_and_refused_for_safetensors(tmp_path):
    tensors = {"w": (np.arange(7, dtype=np.float32) + 1, True)}
    ranks = _rank_tensors(tensors, 2)
    for r in ranks:
        r["note"] = "epoch 3"
    src, info = _write_group(str(tmp_path), 2, "ckpt", tensors, ranks=ranks)
    out = convert_checkpoints(src, info, 2)
    assert ms.load_checkpoint(out)["note"] == "epoch 3"
    os.remove(out)
    with pytest.raises(ValueError, match="safetensors cannot store") as err:
        convert_checkpoints(src, info, 2, output_format="safetensors")
    assert src.format(0) in str(err.value)
    assert not os.path.exists(tmp_path / "net_all_2.safetensors")


# ----------------------------------------------------------------------------- combine: bad input


def _expect_failure(src, info, n, exc, *fragments, **kwargs):
    """convert_checkpoints raises ``exc`` naming every fragment, and leaves no output or temp file."""
    folder = os.path.dirname(src)
    before = sorted(os.listdir(folder))
    with pytest.raises(exc) as err:
        convert_checkpoints(src, info, n, **kwargs)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
    assert sorted(os.listdir(folder)) == before
    assert not any(name.startswith("net_all") for name in before)


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_rank_files(tmp_path, fmt):
    src, info = _write_group(str(tmp_path), 4, fmt)
    os.remove(src.format(2))
    _expect_failure(src, info, 4, FileNotFoundError, src.format(2), "does not exist")
    src, info = _write_group(str(tmp_path), 4, fmt)
    os.remove(info.format(3))
    _expect_failure(src, info, 4, FileNotFoundError, info.format(3), "does not exist")


def test_json_group_size_and_rank_id_must_agree(tmp_path):
    src, info = _write_group(str(tmp_path), 4, "ckpt")
    _expect_failure(src, info, 2, ValueError, info.format(0), "group of 4 ranks", "'group_size' is 2")
    with open(info.format(0)) as f:
        rank0 = f.read()
    with open(info.format(1), "w") as f:
        f.write(rank0)  # rank 1's file now claims rank_id 0
    _expect_failure(src, info, 4, ValueError, info.format(1), "file 1 of the group", "rank_id 0")


def test_json_disagreeing_with_rank_0(tmp_path):
    src, info = _write_group(str(tmp_path), 2, "ckpt")
    entries = read_split_info(info.format(1))
    entries["dense.weight"]["split"] = False
    entries["dense.weight"]["pad"] = 0
    atomic_write_json(entries, info.format(1))
    _expect_failure(src, info, 2, ValueError, info.format(1), "disagrees", "'dense.weight'")


@pytest.mark.parametrize("fmt", FORMATS)
def test_different_names_across_ranks(tmp_path, fmt):
    tensors = _full_tensors()
    ranks = _rank_tensors(tensors, 2)
    del ranks[1]["moment2.dense.bias"]
    src, info = _write_group(str(tmp_path), 2, fmt, tensors, ranks=ranks)
    _expect_failure(src, info, 2, ValueError, src.format(1), "other names", "moment2.dense.bias")


@pytest.mark.parametrize("fmt", FORMATS)
def test_different_shard_shapes_across_ranks(tmp_path, fmt):
    tensors = _full_tensors()
    ranks = _rank_tensors(tensors, 2)
    ranks[1]["dense.weight"] = np.zeros((5, 3), np.float32)
    src, info = _write_group(str(tmp_path), 2, fmt, tensors, ranks=ranks)
    _expect_failure(src, info, 2, ValueError, src.format(1), "'dense.weight'", "(5, 3)", "(4, 3)")


def test_shard_shape_inconsistent_with_json_shape(tmp_path):
    tensors = _full_tensors()
    ranks = _rank_tensors(tensors, 4)
    for r in ranks:  # 7 rows over 4 ranks need blocks of ceil(7 / 4) = 2 rows
        r["dense.weight"] = np.zeros((3, 3), np.float32)
    src, info = _write_group(str(tmp_path), 4, "ckpt", tensors, ranks=ranks)
    _expect_failure(src, info, 4, ValueError, info.format(0), "'dense.weight'", "(3, 3)", "ceil(7 / 4)")
    ranks = _rank_tensors(tensors, 4)
    for r in ranks:
        r["norm.gamma"] = np.zeros(6, np.float32)
    src, info = _write_group(str(tmp_path), 4, "ckpt", tensors, ranks=ranks)
    _expect_failure(src, info, 4, ValueError, info.format(0), "'norm.gamma'", "(6,)", "(5,)")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("damage", ["truncate", "garble"])
def test_truncated_or_corrupted_checkpoint(tmp_path, fmt, damage):
    src, info = _write_group(str(tmp_path), 2, fmt)
    path = src.format(1)
    os.chmod(path, 0o600)  # MindSpore saves read-only
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if damage == "truncate":
            f.truncate(size - 7)
        else:
            f.write(b"\xff" * 16)
    _expect_failure(src, info, 2, ValueError, path, "truncated or corrupted")


@pytest.mark.parametrize("kwargs,fragments", [
    ({"group_size": 0}, ["'group_size'", "0"]),
    ({"group_size": -2}, ["'group_size'", "-2"]),
    ({"src_checkpoint": "net_0.ckpt"}, ["'src_checkpoint'", "net_0.ckpt"]),
    ({"src_checkpoint": "net_{}_{}.ckpt"}, ["'src_checkpoint'"]),
    ({"src_param_split_info_json": "info.json"}, ["'src_param_split_info_json'", "info.json"]),
    ({"src_checkpoint": "net_{}.bin"}, ["'src_checkpoint'", ".bin"]),
    ({"output_format": "pt"}, ["'output_format'", "'pt'"]),
])
def test_bad_arguments(tmp_path, kwargs, fragments):
    src, info = _write_group(str(tmp_path), 2, "ckpt")
    args = {"src_checkpoint": src, "src_param_split_info_json": info, "group_size": 2}
    args.update({k: (os.path.join(str(tmp_path), v) if k.startswith("src") else v) for k, v in kwargs.items()})
    extra = {"output_format": args.pop("output_format")} if "output_format" in args else {}
    _expect_failure(args["src_checkpoint"], args["src_param_split_info_json"], args["group_size"], ValueError,
                    *fragments, **extra)


@pytest.mark.parametrize("fmt", FORMATS)
def test_failed_write_midway_leaves_no_output(tmp_path, monkeypatch, fmt):
    src, info = _write_group(str(tmp_path), 2, fmt)
    writer = checkpoint_writers.CkptWriter if fmt == "ckpt" else checkpoint_writers.SafetensorsWriter
    original, calls = writer.write, []

    def fail_third(self, name, value):
        calls.append(name)
        if len(calls) == 3:  # two tensors are already in the temporary file
            raise OSError("no space left on device")
        original(self, name, value)

    monkeypatch.setattr(writer, "write", fail_third)
    _expect_failure(src, info, 2, OSError, "no space left")
    assert len(calls) == 3


# ----------------------------------------------------------------------------- combine: streamed output


def _save_checkpoint_of(src, n, fmt, path):
    """What the combine wrote before issue 11: every merged tensor, in rank 0's order, in one
    ``mindspore.save_checkpoint`` call."""
    readers = [open_checkpoint(src.format(r)) for r in range(n)]
    with open(src.replace("net_{}." + fmt, "info/params_split_info_0.json")) as f:
        info = json.load(f)
    merged = []
    for name in readers[0].infos:
        entry = info.get(name)
        data = readers[0].read(name)
        if entry is not None and entry["split"]:
            data = merge_arrays([r.read(name) for r in readers], entry["shape"][0])
        merged.append({"name": name, "data": data})
    return atomic_save_checkpoint(merged, path, fmt)


def _as_transformers_metadata(data: bytes) -> bytes:
    """A safetensors file of ``mindspore.save_checkpoint`` with its one ``{"format": "ms"}`` in the
    header read as ``{"format": "pt"}`` ([Note: safetensors metadata] in writers.py)."""
    size = int.from_bytes(data[:8], "little")
    header = data[8:8 + size]
    assert header.count(b'"__metadata__":{"format":"ms"}') == 1
    return data[:8] + header.replace(b'"format":"ms"', b'"format":"pt"') + data[8 + size:]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("fmt", FORMATS)
def test_streamed_output_is_byte_identical_to_save_checkpoint(tmp_path, n, fmt):
    """The same bytes as ``save_checkpoint``'s, but for the safetensors metadata, which says what
    ``transformers`` reads."""
    tensors = _full_tensors()  # float32, float16, bfloat16, int32, 0-d, split and replicated
    tensors["flags"] = (np.array([True, False, True]), False)
    tensors["ids"] = (np.arange(10, dtype=np.int64).reshape(5, 2), True)
    ranks = _rank_tensors(tensors, n)
    if fmt == "ckpt":
        for r in ranks:
            r["note"] = "epoch 3"  # strings come after every tensor, as with append_dict
    src, info = _write_group(str(tmp_path), n, fmt, tensors, ranks=ranks)
    out = convert_checkpoints(src, info, n)
    expected = _save_checkpoint_of(src, n, fmt, str(tmp_path / f"expected.{fmt}"))
    with open(out, "rb") as f, open(expected, "rb") as g:
        want = g.read()
        assert f.read() == (_as_transformers_metadata(want) if fmt == "safetensors" else want)
    assert oct(os.stat(out).st_mode & 0o777) == oct(os.stat(expected).st_mode & 0o777)


def test_streamed_ckpt_cuts_large_tensors_into_records_as_mindspore_does(tmp_path, monkeypatch):
    from mindspore.train import serialization

    # MindSpore cuts tensors above 512 MB into records; make both cut at 1 KB.
    monkeypatch.setattr(serialization, "SLICE_SIZE", 1)
    monkeypatch.setattr(checkpoint_writers, "_CKPT_RECORD_BYTES", 1024)
    tensors = {"big": (np.arange(3003, dtype=np.float32).reshape(1001, 3), True),
               "small": (np.arange(4, dtype=np.float16), False)}
    src, info = _write_group(str(tmp_path), 2, "ckpt", tensors)
    out = convert_checkpoints(src, info, 2)
    expected = _save_checkpoint_of(src, 2, "ckpt", str(tmp_path / "expected.ckpt"))
    with open(out, "rb") as f, open(expected, "rb") as g:
        data = f.read()
        assert data == g.read()
    assert data.count(b"\n\x03big") == 12  # 12012 bytes in records of at most 1024
    _assert_equal_to_full(_load(out), tensors, list(tensors))


# ----------------------------------------------------------------------------- memory

_PEAK_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import mindspore as ms
ms.set_device("CPU")
from mindone_zero.checkpoint import convert_checkpoints
def mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
before = mb("VmRSS")
convert_checkpoints({src!r}, {info!r}, 4)
print(mb("VmHWM") - before)
"""


@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_peak_memory_is_about_the_largest_tensor_not_the_output(tmp_path, fmt):
    """4 ranks x 25 MB, 10 tensors of 10 MB: the combine writes as it goes, so it holds one
    tensor's blocks and their concatenation (about 20 MB), never the 100 MB output (issue 11;
    the combine that saved everything in one call raised the peak by about 130 MB here)."""
    tensors = {f"p{i}": (np.full((2503, 1000), i + 1, np.float32), True) for i in range(10)}
    src, info = _write_group(str(tmp_path), 4, fmt, tensors)
    script = _PEAK_SCRIPT.format(root=str(ROOT), src=src, info=info)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    peak_mb = float(res.stdout.split()[-1])
    largest_mb = 10.0
    assert peak_mb < 2 * largest_mb + 10, peak_mb


def test_module_exports():
    assert set(checkpoint.__all__) >= {"atomic_save_checkpoint", "atomic_write_json", "write_split_info",
                                          "read_split_info", "convert_checkpoints"}
