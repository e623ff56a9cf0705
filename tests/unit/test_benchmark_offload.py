"""tools/benchmark_offload.py without msrun: its config checks and the table from per-rank results."""
import re

import pytest
import yaml

from tools.benchmark_offload import DEFAULTS, load_offload_config, render, summarize

MB = 10 ** 6


def _rank(peak, file=0, host=0, seconds=(5.0, 1.0, 1.2, 1.1)):
    return {"peak_bytes": peak, "model_states": {"total": 100 * MB, "host": host, "file": file},
            "step_seconds": list(seconds), "losses": [1.0, 0.5]}


def test_file_rows_are_compared_with_no_offload_of_the_same_stage():
    results = {(3, "none"): [_rank(900 * MB), _rank(1000 * MB)],
               (3, "nvme"): [_rank(850 * MB, file=134 * MB, seconds=(5, 2, 2, 2)), _rank(870 * MB, file=134 * MB)]}
    rows = summarize(results)
    assert [r["peak"] for r in rows] == [1000 * MB, 870 * MB]
    assert rows[1]["saved"] == 130 * MB and rows[1]["saved_per_offloaded"] == pytest.approx(130 / 134)
    assert rows[0]["step_seconds"] == 1.1 and rows[1]["step_seconds"] == 2  # median without the first step
    assert rows[1]["step_ratio"] == pytest.approx(2 / 1.1)
    table = render(DEFAULTS, rows)
    assert "| 3 | none | 1000 | 100 | 0 | 0 | - | - | 1.100 | - |" in table
    assert "| 3 | nvme | 870 | 100 | 0 | 134 | 130 | 0.97 | 2.000 | 1.82x |" in table


def test_bad_config_names_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    for section, text in (({"layres": 8}, "'offload_memory.layres' must be one of"),
                          ({"settings": [[3, "disk"]]}, "'offload_memory.settings' must be [stage, offload] pairs")):
        path.write_text(yaml.safe_dump({"offload_memory": section}))
        with pytest.raises(ValueError, match=re.escape(text)):
            load_offload_config(str(path))
