"""Optimizer offload in one process (stage 0): the host update against MindSpore's own optimizers,
host memory and files, accumulation, clipping, EMA, loss scale and overflow; argument errors;
where the states are counted. Stages 1-3 at N=2 are in tests/dist/test_offload_dist.py."""
import errno
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from models import (GeluLoss, GeluNet, LossNet, TinyNet, adamw_groups, gelu_batch, init_weights, make_optimizer,
                    micro_batch)
from mindone_zero import EMA, prepare_train_network
from mindone_zero.memory.measure import KINDS, LOCATIONS, measure_model_states
from mindone_zero.offload import OffloadConfig, StepHyper, host_rule_for, host_step, set_fault_hook

ms.set_device("CPU")

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")
KEEP_ALIVE = []  # MindSpore caches compiled Cells by id: keep every case's Cells alive
RTOL = 1e-6


def _optimizer(net, name):
    """The tests' optimizers, plus learning-rate schedules and parameter groups (read per step)."""
    params = net.trainable_params()
    if name == "adamw_schedule":  # a LearningRateSchedule Cell, weight decay on the weights only
        groups = [{"params": [p for p in params if "weight" in p.name], "weight_decay": 0.01},
                  {"params": [p for p in params if "weight" not in p.name]}]
        return nn.AdamWeightDecay(groups, learning_rate=nn.CosineDecayLR(0.001, 0.01, 3))
    if name == "momentum_list":  # a list of per-step learning rates, weight decay
        # (not Nesterov: MindSpore 2.10's CPU ApplyMomentum ignores use_nesterov, see host_optimizer.py)
        return nn.Momentum(params, learning_rate=[0.01, 0.03, 0.02, 0.005], momentum=0.9, weight_decay=0.001)
    return make_optimizer(params, name)


def _run(optimizer, offload, mode=ms.GRAPH_MODE, steps=4, accum=2, clip=True, ema=False, overflow_step=None):
    ms.set_context(mode=mode)
    net = init_weights(TinyNet(with_scalar=not optimizer.startswith("adamw")))
    opt = _optimizer(net, optimizer)
    scale = nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000) if overflow_step is not None else 1.0
    train = prepare_train_network(LossNet(net), opt, scale_sense=scale, ema=EMA(net, ema_decay=0.9) if ema else None,
                                  gradient_accumulation_steps=accum, clip_grad=clip, clip_norm=2.0,
                                  optimizer_offload=offload)
    train.set_train(True)
    KEEP_ALIVE.append(train)
    losses = []
    for step in range(steps):
        for micro in range(accum):
            ids, labels = micro_batch(step, 0, 1, micro, accum)
            factor = np.inf if step == overflow_step and micro == 0 else 1.0
            loss, _, _ = train(Tensor(ids), Tensor(labels), Tensor(factor, ms.float32))
            losses.append(float(loss.asnumpy()))
    params = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    if ema:
        params.update({p.name: p.asnumpy().copy() for p in train.ema.ema_weight})
    return np.array(losses), params, train


def _assert_same(a, b):
    np.testing.assert_allclose(a[0], b[0], rtol=RTOL, atol=1e-7)
    assert sorted(a[1]) == sorted(b[1])
    for name, value in b[1].items():
        np.testing.assert_allclose(a[1][name], value, rtol=RTOL, atol=1e-7, err_msg=name)


# Momentum runs offloaded (memory and files) at stages 0-3 in the N=2 parity job (test_hybrid_fusion_offload.py)
@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "adamw_schedule", "momentum_list"])
def test_host_update_equals_device_optimizer(optimizer, tmp_path):
    device = _run(optimizer, False, steps=3)
    _assert_same(_run(optimizer, True, steps=3), device)
    files = {"device": "nvme", "path": str(tmp_path / "states"), "chunk_size": 64}  # many chunks per tensor
    result = _run(optimizer, files, steps=3)
    _assert_same(result, device)
    (folder,) = os.listdir(tmp_path / "states")  # one fresh folder per rank, removed when closed
    assert folder.startswith("rank0_") and os.listdir(tmp_path / "states" / folder)
    result[2].zero_helper.host_offload.close()
    assert os.listdir(tmp_path / "states") == []


class _Step(nn.Cell):
    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer

    def construct(self, grads):
        return self.optimizer(grads)


def _host_adamw(rule, hyper_lr, hyper_wd, weights, grads_per_step, chunk):
    """The host rule over ``chunk``-element chunks, from zero moments, one step per gradient list."""
    w = [x.copy().reshape(-1) for x in weights]
    m, v = [np.zeros_like(x) for x in w], [np.zeros_like(x) for x in w]
    hyper = StepHyper(hyper_lr, hyper_wd, 1.0)
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            g = g.reshape(-1)
            for s in range(0, g.size, chunk):
                states = {"moments1": m[i][s:s + chunk], "moments2": v[i][s:s + chunk]}
                rule.update(w[i][s:s + chunk], g[s:s + chunk], states, i, hyper)
    return w, m, v


def test_host_adamw_is_mindspore_cpu_kernel_bit_for_bit():
    """Issue 24: the host AdamWeightDecay gives MindSpore's CPU kernel's bits after 12 steps, whatever
    the chunking (10, 1000 elements; 16-element SIMD blocks cut anywhere), weight decay on and off;
    numpy's separately rounded operations do not (so this test can tell them apart)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(24)
    shapes = [(7,), (37, 13), (1001, 3)]
    weights = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [ms.Parameter(Tensor(w.copy()), name=f"p{i}") for i, w in enumerate(weights)]
    opt = nn.AdamWeightDecay([{"params": params[:2], "weight_decay": 0.01}, {"params": params[2:]}], 3e-3)
    step = _Step(opt)
    KEEP_ALIVE.append(step)
    grads_per_step = [[rng.standard_normal(s).astype(np.float32) * 0.1 for s in shapes] for _ in range(12)]
    for grads in grads_per_step:
        step(tuple(Tensor(g) for g in grads))
    device = [[p.asnumpy().reshape(-1) for p in params],
              [m.asnumpy().reshape(-1) for m in opt.moments1], [v.asnumpy().reshape(-1) for v in opt.moments2]]
    rule = host_rule_for(opt)
    assert rule.kernel == "nnacl"  # MindSpore's CPU wheel ships the kernel's library
    hyper = StepHyper.read(opt, rule)  # the optimizer's own per-parameter lr and weight decay
    assert hyper.weight_decay[2] == 0 < hyper.weight_decay[0]
    for chunk in (10, 1000):
        host = _host_adamw(rule, hyper.lr, hyper.weight_decay, weights, grads_per_step, chunk)
        for got, want in zip(host, device):
            for k in range(len(shapes)):
                assert np.array_equal(got[k], want[k]), (chunk, k, np.abs(got[k] - want[k]).max())
    numpy_rule = type(rule)(**dict(rule.__dict__, kernel="numpy"))
    w_np = _host_adamw(numpy_rule, hyper.lr, hyper.weight_decay, weights, grads_per_step, 1000)[0]
    assert sum(int((w_np[k] != device[0][k]).sum()) for k in range(len(shapes))) > 0
    for k in range(len(shapes)):  # the numpy fallback's tolerance
        np.testing.assert_allclose(w_np[k], device[0][k], rtol=1e-6, atol=1e-7)


def _gelu_run(offload, optimizer="adamw_groups", steps=12):
    """GeluNet with AdamWeightDecay (decay on weights) or a tests' optimizer, clipping, 12 steps."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = init_weights(GeluNet())
    opt = adamw_groups(net) if optimizer == "adamw_groups" else (
        make_optimizer(net.trainable_params(), optimizer, lr=3e-3 if optimizer == "adam" else 0.05))
    train = prepare_train_network(GeluLoss(net), opt, clip_grad=True, clip_norm=0.5, optimizer_offload=offload)
    train.set_train(True)
    KEEP_ALIVE.append(train)
    losses = []
    for s in range(steps):
        x, t = gelu_batch(s, 0, 1)
        losses.append(float(train(Tensor(x), Tensor(t), Tensor(1.0, ms.float32))[0].asnumpy()))
    return np.array(losses), {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def test_offloaded_adamw_run_equals_the_device_run_bit_for_bit(tmp_path):
    """Issue 24: a GELU network with uneven dims, 12 AdamWeightDecay steps with clipping: the host
    update (in memory; in files of 40-byte chunks) gives the device run's every loss and parameter bit."""
    device = _gelu_run(False)
    for offload in (True, {"device": "nvme", "path": str(tmp_path), "chunk_size": 40}):
        losses, params = _gelu_run(offload)
        assert np.array_equal(losses, device[0]), (losses - device[0])
        for name, value in device[1].items():
            assert np.array_equal(params[name], value), (name, np.abs(params[name] - value).max())


def test_host_step_drops_each_gradient_once_used():
    """[Note: host step memory]: the train graph's gradient Tensors are handed over in a list that
    the host step empties, so none outlives the update of its own tensor."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = init_weights(GeluNet())
    train = prepare_train_network(GeluLoss(net), adamw_groups(net), optimizer_offload=True)
    KEEP_ALIVE.append(train)
    host, seen = train.zero_helper.host_offload, []
    real_take = host_step._take

    def take(grads, i):
        seen.append((i, grads[i] is not None, sum(g is not None for g in grads)))
        return real_take(grads, i)

    host_step._take = take
    try:
        handed = []
        real_step = host.step
        host.step = lambda grads: (handed.append(grads), real_step(grads))[-1]
        x, t = gelu_batch(0, 0, 1)
        train(Tensor(x), Tensor(t), Tensor(1.0, ms.float32))
    finally:
        host_step._take = real_take
    n = len(host.opt_params)
    assert isinstance(handed[0], list) and len(handed[0]) == n and all(g is None for g in handed[0])
    assert seen == [(i, True, n - i) for i in range(n)]  # gradient i alive, the earlier ones gone


@pytest.mark.parametrize("optimizer", ["adam", "momentum", "sgd"])
def test_numpy_rules_on_the_gelu_network(optimizer):
    """The numpy rules on a second model (the tolerance of test_host_adamw_is_mindspore_cpu_kernel_bit_for_bit's numpy fallback): Adam within 1e-6 relative (measured:
    8e-8 on the losses, 8% of elements not bitwise), Momentum and SGD bit for bit."""
    device = _gelu_run(False, optimizer)
    losses, params = _gelu_run(True, optimizer)
    same = np.array_equal if optimizer != "adam" else (lambda a, b: np.allclose(a, b, rtol=RTOL, atol=1e-7))
    assert same(losses, device[0]), losses - device[0]
    for name, value in device[1].items():
        assert same(params[name], value), (name, np.abs(params[name] - value).max())


def test_ema_overflow_and_pynative_follow_the_device_run(tmp_path):
    """EMA after the host step, a dropped overflow step with a dynamic loss scale, PYNATIVE_MODE."""
    device = _run("adam", False, ema=True, overflow_step=1)
    files = {"device": "nvme", "path": str(tmp_path), "chunk_size": 100}
    _assert_same(_run("adam", files, ema=True, overflow_step=1), device)
    pynative = _run("momentum", False, mode=ms.PYNATIVE_MODE, steps=3)
    _assert_same(_run("momentum", True, mode=ms.PYNATIVE_MODE, steps=3), pynative)


def test_states_counted_where_they_live(tmp_path):
    net = init_weights(TinyNet())
    full = sum(int(np.prod(p.shape)) * 4 for p in net.trainable_params())
    on_device = measure_model_states(prepare_train_network(LossNet(net), make_optimizer(net.trainable_params())))
    for offload, where in ((True, "host"), ({"device": "nvme", "path": str(tmp_path)}, "file")):
        net = init_weights(TinyNet())
        train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params()), optimizer_offload=offload)
        KEEP_ALIVE.append(train)
        memory = measure_model_states(train)
        assert set(memory) == set(KINDS) | set(LOCATIONS) | {"total"}
        assert memory[where] == 2 * full and memory["optimizer_states"] == 0  # Adam: moment1, moment2
        assert sum(memory[k] for k in LOCATIONS) == 2 * full
        # the optimizer's own state Parameters are cut to one element each
        assert memory["total"] == on_device["total"] - 2 * full


@pytest.mark.parametrize("value,match", [
    ("cpu", "must be a bool or a dict"),
    ({"device": "gpu"}, "'device' 'cpu' or 'nvme'"),
    ({"device": "nvme"}, "must have a folder 'path'"),
    ({"device": "nvme", "path": "/x", "chunk_size": 0}, "'chunk_size' >= 4"),
    ({"device": "cpu", "size": 1}, "unknown keys \\['size'\\]"),
])
def test_bad_offload_argument_names_it(value, match):
    with pytest.raises(ValueError, match="'optimizer_offload'.*" + match):
        OffloadConfig.parse(value)


def test_unwritable_path_raises_before_any_work(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    target = str(blocked / "sub" / "states")  # under a file: cannot be created
    net = init_weights(TinyNet())
    opt = make_optimizer(net.trainable_params())
    with pytest.raises(ValueError, match=f"'optimizer_offload' has 'path' '{target}', which is not a writable"):
        prepare_train_network(LossNet(net), opt, optimizer_offload={"device": "nvme", "path": target})
    assert sorted(os.listdir(tmp_path)) == ["file"]
    assert all(p.shape == q.shape for p, q in zip(opt.moment1, net.trainable_params()))  # nothing was changed
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="not a writable folder"):
            OffloadConfig.parse({"device": "nvme", "path": str(ro / "x")})
        assert os.listdir(ro) == []


def test_host_rule_of_an_unsupported_optimizer_raises_naming_the_argument():
    # the entry points warn and train without offload instead (tests/unit/test_mindone_compat.py)
    net = init_weights(TinyNet())
    opt = nn.Adam(net.trainable_params(), use_amsgrad=True)
    with pytest.raises(ValueError, match="'optimizer_offload' needs an optimizer with a host update.*Adam"):
        host_rule_for(opt)


def test_full_disk_during_a_step_raises_a_clear_error(tmp_path):
    net = init_weights(TinyNet())
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params()),
                                  optimizer_offload={"device": "nvme", "path": str(tmp_path), "chunk_size": 64})
    KEEP_ALIVE.append(train)
    ids, labels = micro_batch(0, 0, 1, 0, 1)

    def disk_full(name, offset):
        if offset >= 64:
            raise OSError(errno.ENOSPC, "No space left on device")

    set_fault_hook(disk_full)
    try:
        with pytest.raises(OSError, match="writing the state file .* at byte 64 failed .*No space left on device.*"
                                          "resume from the last checkpoint") as info:
            train(Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32))
        assert info.value.errno == errno.ENOSPC
    finally:
        set_fault_hook(None)


def test_placement_estimate_moves_the_offloaded_bytes():
    from mindone_zero.memory.estimate import estimate_model_states_memory, estimate_model_states_placement

    p, n = 7.5e9, 64
    for stage in range(4):
        total = estimate_model_states_memory(p, n, stage)
        assert estimate_model_states_placement(p, n, stage) == {"device": total, "host": 0, "file": 0}
        moved = 12 * p / (n if stage >= 1 else 1)
        assert (estimate_model_states_placement(p, n, stage, optimizer_offload="cpu")
                == {"device": total - moved, "host": moved, "file": 0})
    # stage 3, fp32 Adam on 2 ranks, moments in files, no master copy: 8 of 16 bytes per parameter move
    got = estimate_model_states_placement(100, 2, 3, 4, 4, 8, "nvme")
    assert got == {"device": 400, "host": 0, "file": 400}
    with pytest.raises(ValueError, match="'optimizer_offload' must be one of"):
        estimate_model_states_placement(100, 2, 3, optimizer_offload=True)
    with pytest.raises(ValueError, match="'offloaded_bytes' must be at most 'optimizer_bytes'"):
        estimate_model_states_placement(100, 2, 3, optimizer_bytes=8, offloaded_bytes=12)
