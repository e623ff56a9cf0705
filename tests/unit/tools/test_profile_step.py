"""tools/dev/profile_step.py without msrun: the settings it takes, the profiler table it reads, its report;
and tools/bench/benchmark_worker.py's pinning of a rank to one core."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.dev.profile_step import COLLECTIVES, main, parse_setting, read_op_types, render, split_collectives

ROOT = Path(__file__).resolve().parents[3]
HEADER = "op_type,type_occurrences,execution_frequency(per-step),total_compute_time,avg_time(ms),percent\n"


@pytest.mark.parametrize("text,expected", [
    ("0", (0, True, False)), ("2", (2, True, False)), ("3", (3, True, False)), ("3:keep", (3, False, False)),
    ("3:units", (3, True, True)), ("3:units,keep", (3, False, True)), ("3:keep,units", (3, False, True)),
])
def test_settings(text, expected):
    assert parse_setting(text) == expected


@pytest.mark.parametrize("text,fragment", [
    ("4", "each of '--settings' must be a stage 0-3"), ("3:fast", "but got '3:fast'"),
    ("3:keep,keep", "but got '3:keep,keep'"), ("", "but got ''"),
    ("2:keep", "the flags of '--settings' apply to stage 3 only, but got '2:keep'"),
])
def test_bad_settings(text, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_setting(text)


def test_bad_arguments_are_refused_before_any_job(tmp_path, capsys):
    for argv in (["--settings", "5"], ["--steps", "0"], ["--world_size", "0"]):
        with pytest.raises(SystemExit):
            main(argv + ["--out", str(tmp_path / "out")])
        assert "For 'profile_step'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _profile(folder: Path, rank: int, rows) -> None:
    path = folder / f"host_{rank}_ascend_ms" / "FRAMEWORK" / f"cpu_op_type_info_{rank}.csv"
    path.parent.mkdir(parents=True)
    path.write_text(HEADER + "".join(f"{k},{n},1,{ms},0,0\n" for k, n, ms in rows))


def test_kernel_types_per_step_and_the_report(tmp_path):
    _profile(tmp_path / "a", 0, [("AllReduce", 6, 8.0), ("MatMul", 40, 4.0), ("AllGather", 8, 2.0)])
    _profile(tmp_path / "a", 1, [("AllReduce", 6, 99.0)])  # another rank's file is not read
    ops = read_op_types(tmp_path / "a", 0, steps=2)
    assert ops == {"AllReduce": [4.0, 3.0], "MatMul": [2.0, 20.0], "AllGather": [1.0, 4.0]}
    assert split_collectives(ops) == (5.0, 2.0)
    assert {"AllReduce", "AllGather", "ReduceScatter"} <= set(COLLECTIVES)
    with pytest.raises(FileNotFoundError, match="no cpu_op_type_info_3.csv"):
        read_op_types(tmp_path / "a", 3, steps=2)
    results = {"0": {"ops": {"AllReduce": [1.0, 3.0], "MatMul": [2.0, 20.0]}, "step_times": [0.010, 0.012, 0.011],
                     "planned_collectives": 3},
               "3 (units, keep)": {"ops": ops, "step_times": [0.02], "planned_collectives": 7}}
    report = render("lm", 2, 2, results, top=2)
    assert "| | 0 | 3 (units, keep) |" in report
    assert "| step (profiled, median) | 11.0 ms | 20.0 ms |" in report
    assert "| kernels | 3.0 ms / 23 | 7.0 ms / 27 |" in report
    assert "| collectives | 1.0 ms / 3 | 5.0 ms / 7 |" in report
    assert "| collectives in the CommPlan | 3 | 7 |" in report
    assert "| AllReduce | 1.00 ms / 3 | 4.00 ms / 3 |" in report
    assert "| MatMul | 2.00 ms / 20 | 2.00 ms / 20 |" in report
    assert "| MatMul launches | 20 | 20 |" in report  # compute kernels, whatever their time
    assert "AllGather" not in report.split("CommPlan")[1]  # only the top 2 kernel types


def test_a_rank_is_pinned_to_one_core_with_all_its_threads():
    code = ("import os, threading\n"
            "from tools.bench.benchmark_worker import pin_to_core\n"
            "cores = sorted(os.sched_getaffinity(0))\n"
            "done = threading.Event()\n"  # a second thread, alive until the checks are over
            "t = threading.Thread(target=done.wait, args=(60,), daemon=True); t.start()\n"
            "core = pin_to_core(3)\n"
            "assert core == cores[3 % len(cores)], core\n"
            "for tid in os.listdir('/proc/self/task'):\n"
            "    assert os.sched_getaffinity(int(tid)) == {core}, tid\n"
            "done.set(); t.join()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
