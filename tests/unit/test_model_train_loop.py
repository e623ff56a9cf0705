"""``ms.Model(train_net).train`` in one process (issue 20): callbacks see MindOne's outputs and
names; with optimizer_offload the wrapper refuses to run inside another graph (the one
``dataset_sink_mode=True`` builds on Ascend/GPU) before the first step. The multi-process loop with
MindOne's EvalSaveCallback pattern is tests/dist/test_model_train.py."""
import numpy as np
import pytest
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train.callback import Callback

from models import SparseCELoss, TinyNet, global_batch, init_weights
from mindone_zero import prepare_train_network

ms.set_device("CPU")

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")
STEPS = 4


def _dataset():
    batches = [global_batch(step) for step in range(STEPS)]
    ids = np.stack([b[0] for b in batches])
    labels = np.stack([b[1] for b in batches])
    return ds.NumpySlicesDataset({"ids": ids, "labels": labels}, shuffle=False)


def _train(offload, tmp_path):
    net = SparseCELoss(init_weights(TinyNet(with_scalar=False)))
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    return prepare_train_network(net, opt, scale_sense=nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 100),
                                 optimizer_offload=offload, params_split_info=str(tmp_path))


class _Record(Callback):
    def __init__(self, stop_at=None):
        super().__init__()
        self.rows, self.stop_at = [], stop_at

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        loss, overflow, scale = cb.net_outputs
        self.rows.append((float(loss.asnumpy()), bool(overflow.asnumpy()), float(scale.asnumpy()),
                          int(cb.train_network.optimizer.global_step.asnumpy().reshape(-1)[0])))
        if self.stop_at is not None and cb.cur_step_num >= self.stop_at:
            run_context.request_stop()


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
@pytest.mark.parametrize("offload", [False, True])
def test_model_train_equals_calling_the_wrapper(mode, offload, tmp_path):
    ms.set_context(mode=mode)
    direct = _train(offload, tmp_path / "a")
    expected = []
    for step in range(STEPS - 1):
        ids, labels = global_batch(step)
        loss, _, _ = direct(ms.Tensor(ids), ms.Tensor(labels))
        expected.append(float(loss.asnumpy()))
    record = _Record(stop_at=STEPS - 1)
    ms.Model(_train(offload, tmp_path / "b")).train(1, _dataset(), callbacks=[record], dataset_sink_mode=False)
    assert [r[0] for r in record.rows] == expected  # request_stop() ended it one step early
    assert [r[3] for r in record.rows] == [1, 2, 3]  # optimizer.global_step, read as MindOne's callbacks do


class _Outer(nn.Cell):
    """Calls the train network from its own graph, as Model's sink-mode data wrapper does."""

    def __init__(self, train):
        super().__init__(auto_prefix=False)
        self.train = train

    def construct(self, ids, labels):
        return self.train(ids, labels)


def test_offload_inside_another_graph_raises_naming_sink_mode(tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    train = _train(True, tmp_path)
    before = {p.name: p.asnumpy().copy() for p in train.network.trainable_params()}
    ids, labels = global_batch(0)
    with pytest.raises(RuntimeError, match="dataset_sink_mode=True"):
        _Outer(train)(ms.Tensor(ids), ms.Tensor(labels))
    assert all(np.array_equal(p.asnumpy(), before[p.name]) for p in train.network.trainable_params())
    loss, _, _ = train(ms.Tensor(ids), ms.Tensor(labels))  # called directly it still trains
    assert np.isfinite(float(loss.asnumpy()))
