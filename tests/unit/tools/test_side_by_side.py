"""tools/bench/side_by_side.py: the table of two commits' timings (medians over rounds, ratio after /
before), and its argument checks. The runs themselves are benchmark.py's and benchmark_compile.py's."""
import pytest

from tools.bench import side_by_side


def _round(step0, step3, first0, first3):
    return {"step": {"0": step0, "3": step3}, "first": {"0": (first0, step0), "3": (first3, step3)}}


def test_the_table_gives_medians_over_rounds_and_their_ratios():
    before = [_round(0.010, 0.020, 2.0, 4.0), _round(0.012, 0.022, 2.2, 4.4), _round(0.011, 0.021, 2.1, 4.2)]
    after = [_round(0.011, 0.042, 2.1, 8.4), _round(0.011, 0.042, 2.1, 8.4), _round(0.011, 0.042, 2.1, 8.4)]
    rows = side_by_side.table(before, after, [0, 3]).splitlines()[2:]
    assert rows[0] == "| 0 | 11.0 | 11.0 | 1.000 | 2.10 | 2.10 | 1.000 | 1.000 |"
    assert rows[1] == "| 3 | 21.0 | 42.0 | 2.000 | 4.20 | 8.40 | 2.000 | 2.000 |"


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--stages", "1", "3"]])
def test_bad_arguments_stop_before_any_run(argv, tmp_path):
    with pytest.raises(SystemExit):
        side_by_side.main(argv + ["--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_the_graph_table_gives_counted_sizes_and_their_ratios():
    before = {"0": {"type_inference_nodes": 400, "kernel_nodes": 100}, "3": {"type_inference_nodes": 900,
                                                                            "kernel_nodes": 300}}
    after = {"0": {"type_inference_nodes": 400, "kernel_nodes": 100}, "3": {"type_inference_nodes": 810,
                                                                           "kernel_nodes": None}}
    rows = side_by_side.graphs_table(before, after, [0, 3]).splitlines()[2:]
    assert rows == ["| 0 | 400 | 400 | 1.000 | 100 | 100 | 1.000 |", "| 3 | 900 | 810 | 0.900 | 300 | None | - |"]
