"""tools/bench/benchmark_scale.py: the pretrained file it writes (each format, read back), its table,
and its argument checks (before any work)."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from mindone_zero.checkpoint.hf_index import INDEX_NAME
from mindone_zero.checkpoint.readers import open_checkpoint
from tools.bench import benchmark_scale as bs


@pytest.mark.parametrize("fmt", ["safetensors", "ckpt", "hf"])
def test_pretrained_file_holds_every_tensor(tmp_path, fmt):
    path = bs.write_pretrained(tmp_path / "pre", fmt, layers=3, width=8)
    want = dict(bs._tensors(3, 8))
    if fmt == "hf":
        index = json.loads((path / INDEX_NAME).read_text())
        assert sorted(index["weight_map"]) == sorted(want)
        got = {}
        for name in sorted(set(index["weight_map"].values())):
            got.update(load_file(str(path / name)))
    else:
        f = open_checkpoint(str(path))
        got = {name: f.read(name) for name in want}
    assert {k: v.shape for k, v in got.items()} == want
    assert all(v.dtype == np.float32 and np.isfinite(v).all() and v.std() > 0 for v in got.values())


def _way(growths, held, frozen=None):
    phases = [{"name": n, "growth": g} for n, g in growths.items()]
    ranks = [{"phases": phases, "held_after_steps": held, "peak": held + 100},
             {"phases": phases, "held_after_steps": held // 2, "peak": held // 2 + 100}]
    for rank in ranks:
        rank.update(frozen or {})
    return ranks


def test_table_in_multiples_of_the_model_and_of_the_largest_tensor():
    m, largest = 1000, 100
    results = {
        "mindone": _way({"build": 1000, "load pretrained": 2000, "optimizer + prepare_train_network": 80,
                         "3 train steps": 1200, "export": 640}, 1950),
        "sharded": _way({"build": 0, "prepare_network": 330, "load pretrained": 10,
                         "optimizer + prepare_train_network": 20, "3 train steps": 1500, "export": 150}, 1900),
        "sharded_mindone_order": _way({"build": 0, "optimizer + prepare_train_network": 300, "load pretrained": 10,
                                       "3 train steps": 1500, "export": 150}, 1900),
        "lora": _way({"build": 0, "prepare_network": 330, "load pretrained": 10, "optimizer + prepare_train_network": 5,
                      "3 train steps": 400, "export": 20}, 500, {"frozen_held": 260, "frozen_full": 1000}),
    }
    table = bs.render(results, m, largest, world=4)
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" (")[0] for r in rows] == ["| build", "| prepare_network", "| load pretrained",
                                                "| optimizer + prepare_train_network", "| 3 train steps",
                                                "| export", "| export, rank 0", "| held after the steps",
                                                "| peak of the whole run", "| frozen bytes held per rank"]
    assert "| load pretrained (max over ranks, x M) | 2.00 | 0.01 | 0.01 | 0.01 | <= 0.35 |" in rows
    assert "| prepare_network (max over ranks, x M) | - | 0.33 | - | 0.33 | <= 0.35 |" in rows
    assert "| export, rank 0 (x the largest tensor) | 6.40 | 1.50 | 1.50 | 0.20 | <= 2.0 |" in rows
    assert "| held after the steps (x M) | 1.95 | 1.90 | 1.90 | 0.50 | - |" in rows
    assert "| peak of the whole run (max over ranks, x M) | 2.05 | 2.00 | 2.00 | 0.60 | - |" in rows
    assert "| frozen bytes held per rank (x their full bytes / N) | - | - | - | 1.04 | <= 1.05 |" in rows


@pytest.mark.parametrize("arg", ["--layers", "--width", "--world", "--steps", "--timeout"])
def test_bad_sizes_exit_before_any_work(tmp_path, arg, capsys):
    with pytest.raises(SystemExit) as err:
        bs.main([arg, "0", "--out", str(tmp_path / "out"), "--docs", ""])
    assert err.value.code == 2 and f"'{arg}' must be >= 1, but got 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_page_opens_with_the_model_states_a_rank_holds_after_the_steps():
    m = 1000
    results = {
        "mindone": _way({"build": 1000, "3 train steps": 700, "export": 10}, 1500),
        "sharded": _way({"build": 0, "prepare_network": 300, "3 train steps": 1200, "export": 10}, 1420),
        "sharded_mindone_order": _way({"build": 0, "3 train steps": 1210, "export": 10}, 1410),
        "lora": _way({"build": 0, "3 train steps": 300, "export": 10}, 400, {"frozen_held": 250, "frozen_full": 1000}),
    }
    data = {"world": 4, "format": "safetensors", "model_bytes": m, "largest": 100, "ways": results}
    assert bs.states_per_rank(4) == 1.0 and bs.states_per_rank(8) == 0.5
    what, expect, lora = bs.PAGE.intro(data)
    assert "The LoRA fine-tune (rank 8 on every layer, the base frozen)" in lora
    assert "(4 + 4 + 8) / 4 / 4 = 1.00 M per rank" in expect
    assert "so holding 1.42 M is expected" in expect  # the sharded ways' largest, MindOne's left out
    assert "the steps' growth (1.21 M at most)" in expect
    assert bs.render_page(data).startswith("Pretrained file format: safetensors.")
