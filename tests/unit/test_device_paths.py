"""The code paths taken when the device target is not CPU (issue 21, review items 2a, 2c, 2d, 2g),
tested in one CPU process by faking the target ([Note: device targets] in mindone_zero/core/backend.py):
each decision per faked target, and, where the path itself runs on CPU, its numbers."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from models import LossNet, TinyNet, init_weights, make_optimizer, micro_batch
from mindone_zero import prepare_train_network
from mindone_zero.core import backend
from mindone_zero.offload import host_step

ms.set_device("CPU")

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")
KEEP_ALIVE = []  # MindSpore caches compiled Cells by id: keep every case's Cells alive
TARGETS = ["CPU", "GPU", "Ascend"]


@pytest.fixture
def fake_target(monkeypatch):
    """``fake_target(name, soc_features=(), overflow_mode=None)`` makes backend.py see that device."""

    def fake(name, soc_features=(), overflow_mode=None):
        monkeypatch.setattr(backend, "device_target", lambda: name)
        monkeypatch.setattr(backend, "ascend_soc_supports", lambda f: name == "Ascend" and f in soc_features)
        if overflow_mode is None:
            monkeypatch.delenv(backend.OVERFLOW_MODE_ENV, raising=False)
        else:
            monkeypatch.setenv(backend.OVERFLOW_MODE_ENV, overflow_mode)

    return fake


# ------------------------------------------------------------------ 2a: offload write-back
@pytest.mark.parametrize("target", TARGETS)
def test_host_update_lands_in_place_on_cpu_only(target, fake_target):
    """Before any graph runs the two asnumpy() calls share memory on every target; only CPU
    may skip the write-back."""
    param = Parameter(Tensor(np.arange(6, dtype=np.float32)), name="w")
    fake_target(target)
    assert host_step._updates_in_place(param) == (target == "CPU")


def _offload_run(mode, steps=3):
    ms.set_context(mode=mode)
    net = init_weights(TinyNet(with_scalar=False))
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), "adamw"),
                                  clip_grad=True, clip_norm=2.0, optimizer_offload=True)
    train.set_train(True)
    KEEP_ALIVE.append(train)
    losses = []
    for step in range(steps):
        ids, labels = micro_batch(step, 0, 1, 0, 1)
        losses.append(float(train(Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32))[0].asnumpy()))
    return np.array(losses), {p.name: p.asnumpy().copy() for p in net.trainable_params()}, train


def _as_on_a_device(monkeypatch):
    """Make ``Parameter.asnumpy()`` return a copy, as it does of device memory on Ascend and GPU."""
    view = Parameter.asnumpy
    monkeypatch.setattr(Parameter, "asnumpy", lambda self: view(self).copy())


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
def test_forced_write_back_gives_the_same_numbers(mode, monkeypatch):
    """The Ascend/GPU path forced on CPU, with ``asnumpy()`` returning copies as it does there: the
    host result copied back after each update gives the same losses and weights, bit for bit, as
    the in-place path; without the write-back the weights would never change."""
    in_place = _offload_run(mode)
    assert all(in_place[2].zero_helper.host_offload.in_place)
    _as_on_a_device(monkeypatch)
    monkeypatch.setattr(host_step, "host_updates_in_place", lambda: False)
    written = _offload_run(mode)
    assert not any(written[2].zero_helper.host_offload.in_place)
    np.testing.assert_array_equal(written[0], in_place[0])
    for name, value in in_place[1].items():
        np.testing.assert_array_equal(written[1][name], value, err_msg=name)


def test_without_the_write_back_a_device_run_would_not_train(monkeypatch):
    """Review item 2a: the old build-time check alone (``in_place`` True) with device-like copies."""
    _as_on_a_device(monkeypatch)
    monkeypatch.setattr(host_step, "_updates_in_place", lambda param: True)
    _, trained, _ = _offload_run(ms.GRAPH_MODE)
    initial = {p.name: p.asnumpy() for p in LossNet(init_weights(TinyNet(with_scalar=False))).trainable_params()}
    assert sorted(trained) == sorted(initial)
    for name, value in initial.items():
        np.testing.assert_array_equal(trained[name], value, err_msg=name)


class _AddInPlace(nn.Cell):
    def __init__(self, param):
        super().__init__()
        self.param = param

    def construct(self, x):
        return ops.assign_add(self.param, x)


def test_write_back_keeps_the_buffer_a_compiled_graph_holds():
    """Why ``ops.assign`` and not ``set_data``: after ``set_data`` a jitted Cell compiled before it
    (PYNATIVE_MODE) keeps updating the Parameter's old buffer; after the write-back it does not."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    one = Tensor(np.ones(3, np.float32))
    param = Parameter(Tensor(np.zeros(3, np.float32)), name="w_write_back")
    add = _AddInPlace(param)
    add.construct = ms.jit(add.construct)
    KEEP_ALIVE.append(add)
    add(one)
    host_step._write_back(param, np.full(3, 10.0, np.float32))
    add(one)
    np.testing.assert_array_equal(param.asnumpy(), np.full(3, 11.0, np.float32))
    # the failure the write-back avoids, shown on the same Cell
    param.set_data(Tensor(np.full(3, 100.0, np.float32)))
    add(one)
    np.testing.assert_array_equal(param.asnumpy(), np.full(3, 100.0, np.float32))


# ------------------------------------------------------------------ 2g: overflow in saturation mode
# (target, SoC features, MS_ASCEND_CHECK_OVERFLOW_MODE) -> float-status ops, MindSpore's rule in
# nn/wrap/loss_scale.py (get_overflow_status)
OVERFLOW_CASES = [
    ("CPU", (), None, False),
    ("CPU", (), "SATURATION_MODE", False),
    ("GPU", (), "SATURATION_MODE", False),
    ("Ascend", ("amp_loss_scale_train_classic_target",), None, True),  # 910A: saturation only
    ("Ascend", ("train_hq_dtype_line",), None, False),  # 910B: INFNAN by default
    ("Ascend", ("train_hq_dtype_line",), "INFNAN_MODE", False),
    ("Ascend", ("train_hq_dtype_line",), "SATURATION_MODE", True),
]


@pytest.mark.parametrize("target, features, mode, expected", OVERFLOW_CASES)
def test_overflow_reads_float_status_where_mindspore_does(target, features, mode, expected, fake_target):
    fake_target(target, features, mode)
    assert backend.overflow_uses_float_status() is expected


@pytest.mark.parametrize("target, features, mode, expected", OVERFLOW_CASES[::3])
def test_train_step_builds_the_float_status_check(target, features, mode, expected, fake_target):
    """The wrapper takes the decision at build time (the status ops have no CPU kernel, so the
    graph itself runs only on Ascend: tools/device_check.py)."""
    fake_target(target, features, mode)
    net = init_weights(TinyNet(with_scalar=False))
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), "adamw"))
    assert (train.float_status is not None) is expected


# ------------------------------------------------------------------ 2c, 2d: AlltoAll, int8, bfloat16
# target -> (qgZ all-to-all native, int8 values' carrier, bfloat16 carrier); [Note: device targets]
COMM_CASES = {
    "Ascend": (True, ms.int8, None),
    "GPU": (False, ms.float16, ms.float32),
    "CPU": (False, ms.float16, ms.float32),
}


@pytest.mark.parametrize("target", TARGETS)
def test_collective_choices_per_target(target, fake_target):
    from mindone_zero.core.comm import GroupComm, backend_has_native

    fake_target(target)
    native_a2a, carrier, bf16 = COMM_CASES[target]
    assert (backend.native_all_to_all(), backend.int8_carrier(), backend.bf16_collective_carrier()) == COMM_CASES[target]
    comm = GroupComm()  # communication not initialised: a group of one, nothing is sent
    assert (comm._native_a2a, comm.carrier, comm.bf16_carrier) == (native_a2a, carrier, bf16)
    assert backend_has_native("reduce_scatter", "devchk_sub_0_1") is (target != "CPU")
    for dtype, cast in ((ms.bfloat16, bf16 is not None), (ms.float16, False), (ms.float32, False)):
        assert comm._carried(Tensor(np.zeros(2, np.float32), dtype)) is cast, dtype


def test_bf16_carrier_is_exact_for_copies():
    """bfloat16 -> float32 -> bfloat16 (the GPU path of a gather or broadcast) returns every bfloat16
    bit pattern's value unchanged, the largest and smallest included; float16 would not."""
    bits = np.arange(0, 2 ** 16, dtype=np.uint32)
    values = (bits << 16).view(np.float32)
    finite = values[np.isfinite(values)]
    x = Tensor(finite, ms.float32).astype(ms.bfloat16)
    back = x.astype(ms.float32).astype(ms.bfloat16).astype(ms.float32).asnumpy()
    np.testing.assert_array_equal(back, finite)
    via_fp16 = x.astype(ms.float16).astype(ms.float32).asnumpy()
    assert not np.array_equal(via_fp16, finite)
