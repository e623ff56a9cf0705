"""An export a Hugging Face reader takes as it is (one process): the safetensors metadata
``transformers`` accepts, export names without the loss Cell's prefix, and the folder's config and
tokenizer files copied beside the weights; for ``convert_checkpoints``, ``mindone-zero-convert`` and
``save_full_checkpoint`` at world 1. The multi-process export at stage 3, read as ``transformers``
reads it: tests/dist/test_export_job.py."""
import json
import os

import mindspore as ms
import numpy as np
import pytest
from safetensors import safe_open

from mindone_zero.checkpoint import atomic_save_checkpoint, convert_checkpoints, write_split_info
from mindone_zero.checkpoint.export import export_names
from mindone_zero.checkpoint.hf_folder import companion_files
from mindone_zero.checkpoint.hf_index import INDEX_NAME
from mindone_zero.cli.convert import main as convert_main
from mindone_zero.core.partition import ShardSpec, split_all

# What transformers' from_pretrained accepts in a safetensors header's "format" (modeling_utils.py,
# 4.57), and what mindone.transformers accepts (0.5.0).
TRANSFORMERS_FORMATS = ("pt", "tf", "flax", "mlx")
MINDONE_TRANSFORMERS_FORMATS = ("pt", "tf", "flax", "np")
N = 2
RNG = np.random.default_rng(11)
TENSORS = {  # name in the rank files -> (full value, split)
    "net.model.embed.weight": (RNG.standard_normal((6, 4)).astype(np.float32), True),
    "net.model.norm.weight": (RNG.standard_normal(4).astype(np.float32), False),
    "net.lm_head.weight": (RNG.standard_normal((6, 4)).astype(np.float32), True),
    "ema.net.lm_head.weight": (RNG.standard_normal((6, 4)).astype(np.float32), True),
}
COMPANIONS = {"config.json": '{"model_type": "llama"}', "generation_config.json": '{"do_sample": false}',
              "tokenizer.json": '{"version": "1.0"}', "tokenizer_config.json": "{}", "tokenizer.model": "spm bytes"}
WEIGHTS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", INDEX_NAME, "pytorch_model.bin",
           "pytorch_model.bin.index.json", "consolidated.pth", "tf_model.h5", "flax_model.msgpack")


def _write_group(folder, fmt="safetensors", tensors=None):
    tensors = tensors or TENSORS
    for r in range(N):
        blocks = {k: split_all(a, N)[r] if s else a for k, (a, s) in tensors.items()}
        atomic_save_checkpoint(blocks, os.path.join(folder, f"net_{r}.{fmt}"))
        write_split_info([ShardSpec(k, a.shape, N, r, s) for k, (a, s) in tensors.items()], folder, r)
    return os.path.join(folder, "net_{}." + fmt), os.path.join(folder, "params_split_info_{}.json")


def _hf_folder(folder):
    """A Hugging Face model folder: companion files, weights, a hidden file, a sub-folder, a link."""
    os.makedirs(os.path.join(folder, "original"))
    for name, text in COMPANIONS.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    for name in WEIGHTS + (".gitattributes", os.path.join("original", "params.json")):
        with open(os.path.join(folder, name), "w") as f:
            f.write("not to be copied")
    os.chmod(os.path.join(folder, "tokenizer.model"), 0o640)
    blob = os.path.join(os.path.dirname(folder), "blob")
    with open(blob, "w") as f:
        f.write('{"special": 1}')
    os.symlink(blob, os.path.join(folder, "special_tokens_map.json"))  # a Hugging Face cache snapshot's way
    return folder


def _metadata(path):
    with safe_open(path, framework="np") as f:
        return f.metadata()


def _check_loads_as_transformers_does(folder, names):
    """The checks of transformers' sharded load: the index maps each tensor to one file, every file
    holds what the index says, and each file's metadata says a format transformers accepts."""
    index = json.loads(open(os.path.join(folder, INDEX_NAME)).read())
    assert sorted(index["weight_map"]) == sorted(names)
    for file_name in sorted(set(index["weight_map"].values())):
        path = os.path.join(folder, file_name)
        meta = _metadata(path)
        assert meta == {"format": "pt"}
        assert meta["format"] in TRANSFORMERS_FORMATS and meta["format"] in MINDONE_TRANSFORMERS_FORMATS
        with safe_open(path, framework="np") as f:
            assert sorted(f.keys()) == sorted(k for k, v in index["weight_map"].items() if v == file_name)


@pytest.mark.parametrize("max_shard_size", [None, 64])
def test_convert_writes_the_metadata_transformers_accepts(tmp_path, max_shard_size):
    src, info = _write_group(str(tmp_path))
    out = convert_checkpoints(src, info, N, max_shard_size=max_shard_size)
    if max_shard_size is None:
        assert _metadata(out) == {"format": "pt"}
    else:
        _check_loads_as_transformers_does(out, list(TENSORS))
    # What MindSpore writes itself, and both transformers refuse (the per-rank files are MindSpore's):
    assert _metadata(src.format(0)) == {"format": "ms"}


def test_export_names_strip_and_add_and_keep_ema_in_front():
    names = list(TENSORS) + ["other.w"]
    assert export_names(names, "net.", None, "f") == ["model.embed.weight", "model.norm.weight", "lm_head.weight",
                                                       "ema.lm_head.weight", "other.w"]
    assert export_names(names, "net.", "base.", "f") == ["base.model.embed.weight", "base.model.norm.weight",
                                                         "base.lm_head.weight", "ema.base.lm_head.weight",
                                                         "base.other.w"]
    assert export_names(names, None, None, "f") == names
    with pytest.raises(ValueError, match=r"For 'f', the arguments 'strip_prefix' \('net.'\) and 'add_prefix' \(None\) "
                                         r"would export both 'net.w' and 'w' as 'w'"):
        export_names(["net.w", "w"], "net.", None, "f")
    with pytest.raises(TypeError, match="For 'f', the argument 'strip_prefix' must be a str or None, but got 3"):
        export_names(names, 3, None, "f")


def test_companion_files_are_the_non_weight_files_at_the_top(tmp_path):
    folder = _hf_folder(str(tmp_path / "hf"))
    got = [os.path.basename(p) for p in companion_files(folder, "f")]
    assert got == sorted(list(COMPANIONS) + ["special_tokens_map.json"])
    with pytest.raises(ValueError, match="For 'f', the argument 'copy_files_from' must be an existing folder, "
                                         "but got '.*nowhere'"):
        companion_files(str(tmp_path / "nowhere"), "f")


def test_convert_hands_back_a_hugging_face_folder(tmp_path, caplog):
    hf = _hf_folder(str(tmp_path / "hf"))
    src, info = _write_group(str(tmp_path))
    with caplog.at_level("INFO", logger="mindone_zero.checkpoint.export"):
        out = convert_checkpoints(src, info, N, max_shard_size=64, strip_prefix="net.", copy_files_from=hf)
    exported = ["model.embed.weight", "model.norm.weight", "lm_head.weight", "ema.lm_head.weight"]
    _check_loads_as_transformers_does(out, exported)
    copied = sorted(list(COMPANIONS) + ["special_tokens_map.json"])
    weights = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert sorted(os.listdir(out)) == sorted(copied + weights + [INDEX_NAME])
    for name in copied:  # as they are: bytes and permission bits, the link's target
        with open(os.path.join(hf, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
            assert a.read() == b.read(), name
        assert os.stat(os.path.join(hf, name)).st_mode == os.stat(os.path.join(out, name)).st_mode, name
        assert not os.path.islink(os.path.join(out, name))
    index = json.loads(open(os.path.join(out, INDEX_NAME)).read())
    assert sorted(index["weight_map"]) == sorted(exported)  # the export's own index, not the folder's
    assert f"Copied 6 file(s) from {hf} into the export {out}: {', '.join(copied)}." in caplog.text
    full = {}
    for name in weights:
        with safe_open(os.path.join(out, name), framework="np") as f:
            full.update({k: f.get_tensor(k) for k in f.keys()})
    for name, (value, _) in TENSORS.items():
        assert np.array_equal(full[name.replace("net.", "", 1)], value), name


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(copy_files_from="HF"), ValueError, "the argument 'copy_files_from' needs 'max_shard_size'"),
    (dict(copy_files_from="NOWHERE", max_shard_size=64), ValueError,
     "the argument 'copy_files_from' must be an existing folder, but got '.*NOWHERE'"),
    (dict(copy_files_from=7, max_shard_size=64), TypeError, "'copy_files_from' must be a folder path or None, but got 7"),
    (dict(strip_prefix="net.", max_shard_size=64), ValueError,
     r"the arguments 'strip_prefix' \('net.'\) and 'add_prefix' \(None\) would export both "
     r"'lm_head.weight' and 'net.lm_head.weight' as 'lm_head.weight'"),
    (dict(add_prefix=["x"]), TypeError, r"the argument 'add_prefix' must be a str or None, but got \['x'\]"),
])
def test_convert_bad_hf_arguments_name_the_argument_and_leave_nothing(tmp_path, kwargs, error, match):
    hf = _hf_folder(str(tmp_path / "HF"))
    kwargs = {k: (str(tmp_path / v) if k == "copy_files_from" and isinstance(v, str) else v) for k, v in kwargs.items()}
    assert kwargs.get("copy_files_from") in (None, 7, hf, str(tmp_path / "NOWHERE"))
    tensors = dict(TENSORS, **{"lm_head.weight": TENSORS["net.lm_head.weight"]})  # one more name
    src, info = _write_group(str(tmp_path), tensors=tensors)
    with pytest.raises(error, match=match):
        convert_checkpoints(src, info, N, **kwargs)
    assert not [f for f in os.listdir(tmp_path) if "all" in f or f.startswith(".")]


def test_cli_strip_prefix_and_copy_files_from(tmp_path, capsys):
    hf = _hf_folder(str(tmp_path / "hf"))
    src, info = _write_group(str(tmp_path))
    assert convert_main(["--src_checkpoint", src, "--src_param_split_info_json", info, "--group_size", str(N),
                         "--max_shard_size", "64", "--strip_prefix", "net.", "--copy_files_from", hf, "--quiet"]) == 0
    out = capsys.readouterr().out.strip()
    assert "config.json" in os.listdir(out) and "tokenizer.model" in os.listdir(out)
    index = json.loads(open(os.path.join(out, INDEX_NAME)).read())
    assert "lm_head.weight" in index["weight_map"] and "net.lm_head.weight" not in index["weight_map"]
    with pytest.raises(SystemExit) as err:
        convert_main(["--src_checkpoint", src, "--src_param_split_info_json", info, "--group_size", str(N),
                      "--copy_files_from", hf])
    assert err.value.code == 2 and "'copy_files_from' needs 'max_shard_size'" in capsys.readouterr().err


@pytest.mark.usefixtures("pynative_mode")
def test_save_full_checkpoint_hands_back_a_hugging_face_folder(tmp_path):
    """World 1: the names without the loss Cell's prefix, the companion files, the metadata."""
    from models import LossNet, TinyNet, init_weights, make_optimizer
    from mindone_zero import EMA, gather_full_params, prepare_train_network, save_full_checkpoint

    hf = _hf_folder(str(tmp_path / "hf"))
    net = init_weights(TinyNet())
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params()), ema=EMA(net, 0.9),
                                  params_split_info=str(tmp_path / "info"))
    full = gather_full_params(train, include_ema=True)
    prefix = "net."
    assert [k for k in full if not k.startswith("ema.")] and all(
        k.startswith(prefix) for k in full if not k.startswith("ema."))
    out = str(tmp_path / "export")
    assert save_full_checkpoint(train, out, True, max_shard_size="200B", strip_prefix=prefix, copy_files_from=hf) == out
    ema = "ema." + prefix
    want = {("ema." + k[len(ema):] if k.startswith(ema) else k[len(prefix):]): v for k, v in full.items()}
    assert len(want) == len(full) and any(k.startswith(ema) for k in full)
    _check_loads_as_transformers_does(out, list(want))
    assert set(COMPANIONS) <= set(os.listdir(out))
    with pytest.raises(ValueError, match="For 'save_full_checkpoint', the argument 'copy_files_from' needs "
                                         "'max_shard_size'"):
        save_full_checkpoint(train, str(tmp_path / "one.safetensors"), copy_files_from=hf)
    assert not os.path.exists(tmp_path / "one.safetensors")
