"""tools/bench/benchmark_offload.py without msrun: its config checks and the table from per-rank results."""
import re

import pytest
import yaml

from tools.bench.benchmark_offload import PAGE, DEFAULTS, load_offload_config, render, summarize

MB = 10 ** 6


def _rank(peak, file=0, host=0, seconds=(5.0, 1.0, 1.2, 1.1)):
    return {"peak_bytes": peak, "model_states": {"total": 100 * MB, "host": host, "file": file},
            "step_seconds": list(seconds), "losses": [1.0, 0.5]}


def test_offloaded_rows_are_compared_with_no_offload_of_the_same_model_and_stage():
    results = {("dense", 3, "none"): [_rank(900 * MB), _rank(1000 * MB)],
               ("dense", 3, "nvme"): [_rank(850 * MB, file=134 * MB, seconds=(5, 2, 2, 2)),
                                      _rank(870 * MB, file=134 * MB)],
               ("lm", 3, "none"): [_rank(2000 * MB)] * 2,
               ("lm", 3, "cpu"): [_rank(2100 * MB, host=150 * MB)] * 2}
    rows = summarize(results)
    assert [r["peak"] for r in rows] == [1000 * MB, 870 * MB, 2000 * MB, 2100 * MB]
    assert rows[1]["saved"] == 130 * MB and rows[1]["saved_per_offloaded"] == pytest.approx(130 / 134)
    assert rows[3]["saved"] == -100 * MB and rows[3]["saved_per_offloaded"] == pytest.approx(-100 / 150)
    assert rows[0]["step_seconds"] == 1.1 and rows[1]["step_seconds"] == 2  # median without the first step
    assert rows[1]["step_ratio"] == pytest.approx(2 / 1.1)
    table = render({"config": DEFAULTS, "rows": rows})
    assert "| dense, stage 3, none | 1000 | 100 | 0 | 0 | - | - |" in table
    assert "| dense, stage 3, nvme | 870 | 100 | 0 | 134 | 130 | 0.97 |" in table
    assert "| lm, stage 3, cpu | 2100 | 100 | 150 | 0 | -100 | -0.67 |" in table
    assert "| dense, stage 3, none | 1.100 | - | 0.500000 |" in table and "| dense, stage 3, nvme | 2.000 | 1.82x |" in table
    intro = PAGE.intro({"config": DEFAULTS, "rows": rows})
    assert "`nvme` saved 130 MB of the 134 MB it offloaded, at 1.82x the step time (dense, stage 3)" in intro[0]
    assert "offload costs little time" in intro[1]  # no offloaded row ran faster
    rows[1]["step_ratio"] = 0.6
    assert "faster than no offload, as it did here" in PAGE.intro({"config": DEFAULTS, "rows": rows})[1]
    assert "8 x Dense(2048, 2048) with GELU, MindSpore's default initialisation, prepare_train_network alone" in table


def test_the_shipped_config_has_both_models():
    cfg = load_offload_config("configs/benchmark_offload.yaml")
    assert [m["name"] for m in cfg["models"]] == ["dense", "lm"]
    assert cfg["models"][0]["init"] == "mindspore" and cfg["models"][0]["activation"] == "gelu"


def test_bad_config_names_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    for section, text in (({"layres": 8}, "'offload_memory.layres' must be one of"),
                          ({"settings": [[3, "disk"]]}, "'offload_memory.settings' must be [stage, offload] pairs"),
                          ({"models": [{"name": "x", "model": "cnn"}]}, "'offload_memory.models[0]' must be a dict"),
                          ({"models": [{"name": "x", "model": "dense", "layers": 2}]}, "(missing ['width', 'micro_batch'])"),
                          ({"models": [{"name": "x", "model": "dense", "layers": 2, "width": 4, "micro_batch": 2,
                                        "settings": [[5, "none"]]}]}, "'offload_memory.models[0].settings' must be")):
        path.write_text(yaml.safe_dump({"offload_memory": section}))
        with pytest.raises(ValueError, match=re.escape(text)):
            load_offload_config(str(path))
