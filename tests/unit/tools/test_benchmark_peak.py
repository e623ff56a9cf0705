"""tools/bench/benchmark_peak.py without msrun: its config checks and the table from per-rank results."""
import pytest

from tools.bench.benchmark_peak import PAGE, PEAK_DEFAULTS, load_peak_config, render, summarize

MB = 10 ** 6


def _rank(growth, ag_volume, loss=0.5):
    return {"growth_bytes": growth, "peak_bytes": growth + 400 * MB, "before_build_bytes": 300 * MB,
            "model_states": {"total": 7},
            "comm": {"all_gather": {"volume": ag_volume}}, "losses": [1.0, loss], "source": "process_rss"}


def test_rows_take_the_largest_rank_and_divide_by_stage0(tmp_path):
    cfg = dict(PEAK_DEFAULTS, layers=2, width=10, world_size=4)
    phi = 2 * 110 * 4
    results = {(0, True): [_rank(1000 * MB, 0), _rank(1200 * MB, 0)],
               (3, False): [_rank(500 * MB, 0.75 * phi), _rank(480 * MB, 0.75 * phi)],
               (3, True): [_rank(400 * MB, 1.5 * phi), _rank(300 * MB, 1.5 * phi)]}
    rows = summarize(cfg, results)
    assert [r["growth"] for r in rows] == [1200 * MB, 500 * MB, 400 * MB]
    assert [round(r["ratio"], 4) for r in rows] == [1.0, round(500 / 1200, 4), round(400 / 1200, 4)]
    assert [r["from_build"] for r in rows] == [1300 * MB, 600 * MB, 500 * MB]
    assert [round(r["ratio_build"], 4) for r in rows] == [1.0, round(600 / 1300, 4), round(500 / 1300, 4)]
    assert [r["all_gather_phi"] for r in rows] == [0, 0.75, 1.5]
    # estimates: 220 params; stage 3 states 16 * 220 / 4 = 880; free + (4 + 4) * 110, keep + 4 * 165 + 4 * 110
    assert rows[2]["states_estimate"] == 880 and rows[2]["peak_estimate"] == 880 + 880
    assert rows[1]["peak_estimate"] == 880 + 660 + 440
    table = render({"config": cfg, "rows": rows})
    assert "| 3 | 400 | 0.33 | 500 | 0.38 |" in table and "| 0 | 1200 | 1.00 | 1300 | 1.00 |" in table
    assert "| 3 (keep) | 500 | 0.42 | 600 | 0.46 |" in table
    assert "| 3 | 0 | 0 | 0 | 1.50 | 0.500000 |" in table  # measured states, estimates (MB: tiny here), Φ, loss
    intro = PAGE.intro({"config": cfg, "rows": rows})
    assert len(intro) == 2 and "stage 3 peaked lowest, at 0.33 of stage 0's 1200 MB" in intro[1]
    assert "measured at or below the estimate" in intro[1]  # 7 B measured against estimates of 880 B and more


@pytest.mark.parametrize("section,text", [
    ({"layres": 8}, "'peak_memory.layres' must be one of"),
    ({"width": 0}, "'peak_memory.width' must be an integer >= 1, but got 0"),
    ({"settings": [[3, True]]}, "'peak_memory.settings' must be [stage, bool] pairs including [0, true]"),
    ({"settings": [[0, True], [3, 2]]}, "but got [[0, True], [3, 2]]"),
])
def test_bad_config_names_the_key(tmp_path, section, text):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"peak_memory": section}))
    with pytest.raises(ValueError) as info:
        load_peak_config(str(path))
    assert text in str(info.value)
