"""``save_full_checkpoint`` streamed exports at N=2 and N=4: stages 0-3, both split rules, every
dtype, one ``.ckpt`` / ``.safetensors`` file and the Hugging Face sharded folder; reloaded into the
unsharded network and compared bit for bit with ``gather_full_params`` cast with numpy; rank 0
holds one gathered tensor at a time; bad inputs raise on every rank and no rank hangs.

The hand-back: a tiny Llama (tests/dist/hf_llama.py) loaded from a Hugging Face folder, fine-tuned
at stage 3 and exported with the loss Cell's prefix stripped and the folder's files copied, is read
as ``transformers`` reads it (the ``safetensors`` package: metadata, index, shapes, dtypes), and,
where ``torch`` and ``transformers`` are installed, loaded with ``from_pretrained``.

One msrun job per world size runs every case (tests/dist/workers/export_worker.py).
"""
import json
import os

import mindspore as ms
import numpy as np
import pytest
from safetensors import safe_open

from export_cases import ExportLoss, ExportNet, MAX_SHARD_SIZE, cases, export_path, exports
from hf_llama import COMPANIONS, hf_shapes, hf_weights, input_ids, write_hf_folder
from msrun_harness import load_json, run_msrun
from mindone_zero.checkpoint.hf_index import INDEX_NAME, shard_file_name
from mindone_zero.checkpoint.readers import open_checkpoint

WORKER = "tests/dist/workers/export_worker.py"
WORLDS = (2, 4)
CASES = cases()
TARGETS = {None: None, "fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype("bfloat16")}
# The "format" values transformers' from_pretrained accepts in a safetensors header (modeling_utils.py, 4.57).
TRANSFORMERS_FORMATS = ("pt", "tf", "flax", "mlx")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """world size -> the job's output folder; each job runs once, on first use."""
    done = {}

    def get(world):
        if world not in done:
            out = tmp_path_factory.mktemp(f"export_N{world}")
            hf = dict(name="hf", src=write_hf_folder(str(out / "hf_src"), hf_weights()))
            try:
                run_msrun(WORKER, world, out, ["--cases", json.dumps([hf] + CASES)], timeout=300)
                done[world] = out
            except AssertionError as err:  # a failed job fails every test that reads it, once
                done[world] = err
        if isinstance(done[world], AssertionError):
            raise done[world]
        return done[world]

    return get


def _reports(out, case, world):
    return [load_json(out / f"{case}_rank{r}.json") for r in range(world)]


def _numpy_cast(value, dtype):
    target = TARGETS[dtype]
    return value if target is None or value.dtype.kind != "f" else value.astype(target)


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _load(path):
    """{name: numpy array} of a file, or of every file of a sharded folder (checked against its index)."""
    if os.path.isfile(path):
        return {k: v.asnumpy() for k, v in ms.load_checkpoint(path, format=path.rsplit(".", 1)[1]).items()}
    index = json.loads(open(os.path.join(path, INDEX_NAME)).read())
    names = sorted(os.listdir(path))
    n = len(names) - 1
    assert names == sorted([INDEX_NAME] + [shard_file_name(k, n) for k in range(1, n + 1)])
    out = {}
    for file_name in names[:-1]:
        tensors = {k: v.asnumpy() for k, v in ms.load_checkpoint(os.path.join(path, file_name),
                                                                  format="safetensors").items()}
        assert set(tensors) == {k for k, f in index["weight_map"].items() if f == file_name}
        assert sum(v.nbytes for v in tensors.values()) <= MAX_SHARD_SIZE or len(tensors) == 1
        with safe_open(os.path.join(path, file_name), framework="np") as f:  # the safetensors package itself
            assert sorted(f.keys()) == sorted(tensors)
            for k in f.keys():
                if tensors[k].dtype != np.dtype("bfloat16"):  # its numpy binding has no bf16
                    assert _same_bits(f.get_tensor(k), tensors[k]), k
        out.update(tensors)
    assert sorted(index["weight_map"]) == sorted(out)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in out.values())
    return out


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_exports_match_gathered_params(job, world, case):
    out = job(world)
    full = dict(np.load(out / case["name"] / "full.npz"))
    assert any(k.startswith("ema.") for k in full) and full["net.steps"].dtype == np.int32
    reports = _reports(out, case["name"], world)
    for name, layout, dtype, include_ema in exports(case["i"]):
        assert all(r[name] == "ok" for r in reports), (name, [r[name] for r in reports])
        path = export_path(str(out), case["name"], name, layout)
        got = _load(path)
        want = {k: _numpy_cast(v, dtype) for k, v in full.items() if include_ema or not k.startswith("ema.")}
        assert sorted(got) == sorted(want), name
        for k in want:
            assert _same_bits(got[k], want[k]), (name, k)
        if layout == "sharded":
            assert len(os.listdir(path)) >= 3, name  # the index and at least two files
    assert reports[0]["tmp_left"] == []


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", [c for c in CASES if c["stage"] in (0, 3)], ids=lambda c: c["name"])
@pytest.mark.usefixtures("pynative_mode")
def test_fp32_exports_load_into_the_unsharded_network(job, world, case):
    out = job(world)
    full = dict(np.load(out / case["name"] / "full.npz"))
    for name, layout, dtype, _ in exports(case["i"]):
        if dtype not in (None, "fp32") or layout == "sharded":
            continue
        plain = ExportLoss(ExportNet())
        path = export_path(str(out), case["name"], name, layout)
        not_loaded, _ = ms.load_param_into_net(plain, ms.load_checkpoint(path, format=layout))
        assert not_loaded == []
        for p in plain.get_parameters():
            assert _same_bits(p.asnumpy(), full[p.name]), (name, p.name)


@pytest.mark.parametrize("world", WORLDS)
def test_rank0_holds_one_gathered_tensor_at_a_time(job, world):
    out = job(world)
    for case in CASES:
        reports = _reports(out, case["name"], world)
        full = np.load(out / case["name"] / "full.npz")
        for name, _, _, include_ema in exports(case["i"]):
            tensors = sum(1 for k in full.files if include_ema or not k.startswith("ema."))
            spy = [r["spy"][name] for r in reports]
            assert spy[0] == {"gathers": tensors, "max_live_at_gather": 0}, (case["name"], name)
            assert all(s["max_live_at_gather"] == 0 and s["gathers"] <= tensors for s in spy)


@pytest.mark.parametrize("world", WORLDS)
def test_bad_inputs_raise_on_every_rank(job, world):
    out = job(world)
    reports = _reports(out, CASES[-1]["name"], world)
    errors = [r["errors"] for r in reports]
    message = ("ValueError: For 'save_full_checkpoint', the argument 'dtype' must be one of ['fp32', 'fp16', 'bf16'] "
               "or None, but got 'int7'.")
    assert all(e["dtype_int7"] == message for e in errors)
    assert errors[1]["dtype_on_rank1"] == message
    failed_0 = "RuntimeError: For 'save_full_checkpoint', global rank(s) [0] failed"
    for r, e in enumerate(errors):
        if r != 1:
            assert e["dtype_on_rank1"].startswith("RuntimeError: For 'save_full_checkpoint', global rank(s) [1] failed")
        assert e["max_shard_size_bad"].startswith("ValueError:") and "'max_shard_size'" in e["max_shard_size_bad"]
        assert "'5 parsecs'" in e["max_shard_size_bad"]
        assert e["path_npz"].startswith("ValueError:") and "'path'" in e["path_npz"] and "d.npz" in e["path_npz"]
        assert e["sharded_path_ext"].startswith("ValueError:") and "must be a folder" in e["sharded_path_ext"]
        assert e["sharded_folder_busy"].startswith("ValueError:" if r == 0 else failed_0)
        for name in ("fail_file", "fail_sharded"):
            assert e[name].startswith("OSError: No space left" if r == 0 else failed_0), (r, name, e[name])
        assert e["after"] == "ok"  # the ranks are still in step
    assert reports[0]["errors_left"] == ["after.ckpt", "busy"]  # nothing else: no file, folder or temporary
    assert os.listdir(out / CASES[-1]["name"] / "errors" / "busy") == ["keep.txt"]


@pytest.mark.parametrize("world", WORLDS)
def test_export_reloads_with_load_full_checkpoint(job, world):
    """Export, then ``load_full_checkpoint`` into a fresh sharded network of the same case: every
    network tensor comes back bit for bit (as the export's dtype rounded it, in the parameter's own
    dtype); the EMA tensors are reported unexpected, nothing missing."""
    out = job(world)
    for case in CASES:
        full = dict(np.load(out / case["name"] / "full.npz"))
        reports = _reports(out, case["name"], world)
        for name, layout, dtype, include_ema in exports(case["i"]):
            reloaded = dict(np.load(out / case["name"] / f"reload_{name}.npz"))
            network = {k: v for k, v in full.items() if not k.startswith("ema.")}
            assert sorted(reloaded) == sorted(network), (case["name"], name)
            for k, v in network.items():
                want = _numpy_cast(v, dtype).astype(v.dtype)
                assert _same_bits(reloaded[k], want), (world, case["name"], name, k)
            ema = sorted(k for k in full if k.startswith("ema.")) if include_ema else []
            for report in reports:
                assert report["reload"][name] == {"missing": [], "unexpected": ema}, (case["name"], name)


# ----------------------------------------------------------------------------- the hand-back


def _header(path):
    """The JSON header of a safetensors file, as any reader sees it (dtype names included)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size))


def _hf_folder_tensors(folder):
    """{name: numpy array} of an exported folder, after the checks of transformers' sharded load."""
    index = json.loads(open(os.path.join(folder, INDEX_NAME)).read())
    files = sorted(set(index["weight_map"].values()))
    assert sorted(os.listdir(folder)) == sorted(files + [INDEX_NAME] + list(COMPANIONS))
    out = {}
    for file_name in files:
        path = os.path.join(folder, file_name)
        with safe_open(path, framework="np") as f:  # as transformers opens it first
            assert f.metadata() == {"format": "pt"} and f.metadata()["format"] in TRANSFORMERS_FORMATS
            assert sorted(f.keys()) == sorted(k for k, v in index["weight_map"].items() if v == file_name)
        reader = open_checkpoint(path)
        for name in reader.infos:
            assert name not in out, name  # every tensor in one file only
            out[name] = reader.read(name)
    assert sorted(out) == sorted(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in out.values())
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_hf_export_reads_as_transformers_reads(job, world):
    """The export of a stage-3 fine-tune, read with the safetensors package alone: the metadata,
    the index covering every tensor once, the config's names and shapes, the dtypes; the values are
    the fine-tuned network's (bf16: rounded from fp32); the folder's files are copied as they are."""
    out = job(world)
    for r in range(world):
        report = load_json(out / f"hf_rank{r}.json")
        assert report["missing"] == [] and report["unexpected"] == []
        assert all(np.isfinite(report["losses"]))
    full = dict(np.load(out / "hf" / "full.npz"))
    shapes = hf_shapes()
    assert sorted(full) == sorted("net." + k for k in shapes)
    source = hf_weights()
    fp32 = _hf_folder_tensors(str(out / "hf" / "fp32"))
    bf16 = _hf_folder_tensors(str(out / "hf" / "bf16"))
    for name, shape in shapes.items():
        assert fp32[name].shape == shape and fp32[name].dtype == np.float32, name
        assert _same_bits(fp32[name], full["net." + name]), name
        assert not np.array_equal(fp32[name], source[name]), name  # fine-tuned, not the folder's weights
        assert _same_bits(bf16[name], fp32[name].astype(np.dtype("bfloat16"))), name
    for file_name in os.listdir(out / "hf" / "bf16"):
        if file_name.endswith(".safetensors"):
            header = _header(str(out / "hf" / "bf16" / file_name))
            assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    for name, text in COMPANIONS.items():
        assert (out / "hf" / "fp32" / name).read_text() == text


@pytest.mark.parametrize("world", WORLDS)
def test_hf_export_loads_in_transformers(job, world):
    """``from_pretrained`` of the export: no missing, unexpected or mismatched key; the logits are
    MindSpore's within 1e-5; the bf16 export holds the fp32 export rounded."""
    torch = pytest.importorskip("torch", reason="torch is not a test dependency (a CPU build is several hundred "
                                                "MB); the safetensors checks above run without it")
    transformers = pytest.importorskip("transformers", reason="transformers is not a test dependency")
    out = job(world)
    model, info = transformers.LlamaForCausalLM.from_pretrained(str(out / "hf" / "fp32"), output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
    with torch.no_grad():
        logits = model(torch.tensor(input_ids(), dtype=torch.long)).logits.numpy()
    assert np.abs(logits - np.load(out / "hf" / "logits.npy")).max() < 1e-5
    half = transformers.LlamaForCausalLM.from_pretrained(str(out / "hf" / "bf16"), torch_dtype=torch.bfloat16)
    for name, value in model.state_dict().items():
        assert torch.equal(half.state_dict()[name], value.to(torch.bfloat16)), name
