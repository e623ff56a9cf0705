"""tools/compile_census.py: its arithmetic on written logs, its probe on a real pytest run that
compiles one train step, and its argument errors."""
import json

import pytest

from tools import compile_census


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


_ONE_STEP = '''
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindone_zero import prepare_train_network


def test_one_train_step():
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    net = nn.Dense(4, 2)
    train = prepare_train_network(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    train.set_train(True)
    train(Tensor(np.ones((2, 4), np.float32)), Tensor(np.zeros((2, 2), np.float32)))
'''


def test_probe_counts_the_train_step_a_run_compiles(tmp_path, capsys):
    (tmp_path / "test_one.py").write_text(_ONE_STEP)
    out = tmp_path / "census"
    code = compile_census.main(["--out", str(out), "--floor_s", "0.1", "--",
                                str(tmp_path / "test_one.py"), "-q", "-n", "0", "-p", "no:cacheprovider"])
    assert code == 0
    census = json.loads((out / "census.json").read_text())
    assert census["pytest_exit"] == 0 and census["train_steps"] == 1 and census["train_step_cpu_s"] > 0
    # the pytest process itself left normally: its CPU and its compile are logged under its job
    (job,) = [j for name, j in census["jobs"].items() if "pytest" in name]
    assert job["train_steps"] == 1 and job["cpu"] > census["train_step_cpu_s"]
    assert census["floor_cpu_s"] == pytest.approx(census["cpu_s"] - census["train_step_cpu_s"] + 0.1)
    assert "train-step compiles: 1," in capsys.readouterr().out


@pytest.mark.parametrize("argv, named", [(["--floor_s", "-1"], "--floor_s"), (["--floor_s", "nan"], "--floor_s"),
                                         (["--top", "0"], "--top")])
def test_bad_arguments_exit_before_any_work(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        compile_census.main(argv + ["--out", str(tmp_path / "out")])
    assert err.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
