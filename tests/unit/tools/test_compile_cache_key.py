"""tools/compile_cache.py: the cache subfolder changes with what decides the graphs, not with the rest
([Note: compile cache] in tools/compile_cache.py)."""
import copy
import os
from pathlib import Path

import pytest

from tools.compile_cache import cache_key, enable_compile_cache, source_digest
from tools.train_config import load_config

REPO = Path(__file__).resolve().parents[3]

CONFIG = REPO / "configs" / "train_lm.yaml"


def _with(cfg, section, key, value):
    cfg = copy.deepcopy(cfg)
    cfg[section][key] = value
    return cfg


def test_key_ignores_keys_that_change_no_graph():
    cfg = load_config(str(CONFIG), {})
    key = cache_key(cfg, 2)
    assert cache_key(copy.deepcopy(cfg), 2) == key
    for section, name, value in (("train", "steps", 7), ("train", "output_dir", "elsewhere"),
                                 ("train", "ckpt_interval", 0), ("data", "seed", 9), ("train", "init_seed", 3),
                                 ("train", "compile_cache", "other/folder")):
        assert cache_key(_with(cfg, section, name, value), 2) == key, name


@pytest.mark.parametrize("section,name,value", [
    ("model", "d_model", 32), ("model", "n_layers", 3), ("train", "zero_stage", 2),
    ("train", "gradient_accumulation_steps", 2), ("train", "clip_grad", False), ("train", "mode", "pynative"),
    ("train", "global_batch_size", 16), ("data", "eval_batch_size", 8), ("train", "gather_units", "Block"),
])
def test_key_changes_with_what_decides_the_graphs(section, name, value):
    cfg = load_config(str(CONFIG), {})
    assert cache_key(_with(cfg, section, name, value), 2) != cache_key(cfg, 2)


def test_key_changes_with_world_size_and_source(tmp_path):
    cfg = load_config(str(CONFIG), {})
    assert cache_key(cfg, 4) != cache_key(cfg, 2)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = source_digest(tmp_path, ("pkg",))
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert source_digest(tmp_path, ("pkg",)) != before


def test_enable_sets_mindspore_environment_to_the_keyed_folder(tmp_path, monkeypatch):
    # setenv, not delenv(raising=False): monkeypatch then undoes what enable_compile_cache sets, whether the
    # variables were set before or not ([Note: leak guard] in tests/leak_guard.py); and the folder replaces them
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "0")
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(tmp_path / "elsewhere"))
    cfg = load_config(str(CONFIG), {})
    folder = enable_compile_cache(tmp_path / "cache", cfg, 2)
    assert folder == (tmp_path / "cache" / cache_key(cfg, 2)).resolve() and folder.is_dir()
    assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "1"
    assert os.environ["MS_COMPILER_CACHE_PATH"] == str(folder)
