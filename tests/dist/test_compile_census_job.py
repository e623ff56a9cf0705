"""tools/dev/compile_census.py's probe on a real run: a pytest run that compiles one train step itself
and launches an msrun job (N=2) whose ranks compile one each, each step called twice. The census
must find the three compiles (not the calls that find the graph compiled), in the processes that
made them, and the one launch."""
import json

import pytest

from tools.dev import compile_census

WORLD = 2
_WORKER = '''
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindone_zero import prepare_train_network
from mindone_zero.core.comm import init_data_parallel


def one_step():
    net = nn.Dense(4, 2)
    train = prepare_train_network(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    train.set_train(True)
    for _ in range(2):  # the second call finds the graph compiled: not a compile
        train(Tensor(np.ones((2, 4), np.float32)), Tensor(np.zeros((2, 2), np.float32)))


if __name__ == "__main__":
    init_data_parallel()
    ms.set_context(mode=ms.GRAPH_MODE)
    one_step()
'''
_TEST = '''
import mindspore as ms

from tools.dev.launch import run_msrun
from census_worker import one_step


def test_a_step_here_and_a_job(tmp_path):
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    one_step()
    run_msrun(__file__.replace("test_census_run.py", "census_worker.py"), {world}, tmp_path / "census_job", timeout=300)
'''


def test_census_finds_each_compile_in_the_process_that_made_it(tmp_path, capsys):
    (tmp_path / "census_worker.py").write_text(_WORKER)
    (tmp_path / "test_census_run.py").write_text(_TEST.format(world=WORLD))
    out = tmp_path / "census"
    code = compile_census.main(["--out", str(out), "--floor_s", "0.1", "--", str(tmp_path / "test_census_run.py"),
                                "-q", "-n", "0", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)])
    assert code == 0
    census = json.loads((out / "census.json").read_text())
    assert census["pytest_exit"] == 0 and census["msrun_launches"] == 1
    assert census["train_steps"] == 1 + WORLD and census["train_step_cpu_s"] > 0
    jobs = census["jobs"]
    assert jobs["census_worker.py census_job"]["processes"] == WORLD
    assert jobs["census_worker.py census_job"]["train_steps"] == WORLD
    assert jobs["pytest"]["train_steps"] == 1 and jobs["pytest"]["cpu"] > jobs["pytest"]["compile"] > 0
    assert jobs["msrun census_job"]["processes"] == 1
    assert census["floor_cpu_s"] == pytest.approx(census["cpu_s"] - census["train_step_cpu_s"] + (1 + WORLD) * 0.1)
    assert f"train-step compiles: {1 + WORLD}," in capsys.readouterr().out
