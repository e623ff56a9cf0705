"""tools/dev/compile_census.py: its arithmetic on written logs, and its argument errors. Its probe on a
real run (pytest and an msrun job) is tests/dist/test_compile_census_job.py."""
import json

import pytest

from tools.dev import compile_census


def _log(folder, pid, compiles, exit_line):
    lines = [f"compile\t{name}\t{cpu}" for name, cpu in compiles]
    if exit_line is not None:
        lines.append(f"exit\t{exit_line[0]}\t{exit_line[1]}")
    (folder / f"{pid}.tsv").write_text("\n".join(lines) + "\n")


def test_census_of_written_logs(tmp_path):
    rank = "/r/tests/dist/workers/parity_worker.py --out /tmp/x/parity_N20 --cases []"
    _log(tmp_path, 11, [("TrainOneStepWrapper", 2.0), ("jit:after_grad", 0.5), ("TrainOneStepWrapper", 3.0)],
         (9.0, rank))
    _log(tmp_path, 12, [("TrainOneStepWrapper", 2.5)], (6.0, rank))
    _log(tmp_path, 13, [], (1.5, "/bin/msrun --worker_num=2 --log_dir=/tmp/x/parity_N20/msrun_logs --join=True w.py"))
    _log(tmp_path, 14, [("TrainOneStepWrapper", 1.0)], None)  # left without an exit line
    census = compile_census.summarize(compile_census.read_logs(tmp_path), wall_s=10.0, cpu_s=20.0, floor_s=0.5)
    assert census["train_steps"] == 4 and census["train_step_cpu_s"] == pytest.approx(8.5)
    assert census["train_step_mean_s"] == pytest.approx(8.5 / 4)
    assert census["other_compiles"] == {"jit:after_grad": 0.5} and census["rest_cpu_s"] == pytest.approx(11.0)
    assert census["unlogged_cpu_s"] == pytest.approx(20.0 - 16.5)
    assert census["msrun_launches"] == 1 and census["cores_used"] == pytest.approx(2.0)
    # the floor: the train steps' 8.5 s replaced by 4 x 0.5 s, at the run's 2 cores
    assert census["floor_cpu_s"] == pytest.approx(13.5) and census["floor_wall_s"] == pytest.approx(6.75)
    jobs = census["jobs"]
    assert list(jobs) == ["parity_worker.py parity_N20", "msrun parity_N20", "(no exit line)"]
    assert jobs["parity_worker.py parity_N20"] == {"processes": 2, "cpu": 15.0, "compile": 8.0, "train_steps": 3}
    assert "| parity_worker.py parity_N20 | 2 | 15.0 | 8.0 | 3 |" in compile_census.render(census, top=5)


@pytest.mark.parametrize("argv, named", [(["--floor_s", "-1"], "--floor_s"), (["--floor_s", "nan"], "--floor_s"),
                                         (["--top", "0"], "--top")])
def test_bad_arguments_exit_before_any_work(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        compile_census.main(argv + ["--out", str(tmp_path / "out")])
    assert err.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
