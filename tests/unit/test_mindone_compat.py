"""MindOne drop-in pieces that one process can check (issue 9): any EMA with MindOne's interface,
the wrapper's MindOne/MindSpore attributes, experimental optimizers, and the split rule's memory
of the user's ``parallel_optimizer = False``. The multi-process behaviour is in
tests/dist/test_mindone_dropin.py."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, mint, nn, ops

from models import LossNet, TinyNet, init_weights, micro_batch
from mindone_zero import EMA, prepare_ema, prepare_train_network
from mindone_zero.core.partition import is_split_candidate, mark_shard_flag, user_opted_out

ms.set_device("CPU")


class ForeignEMA(nn.Cell):
    """MindOne's EMA interface, none of mindone_zero's code."""

    def __init__(self, network, decay=0.5):
        super().__init__()
        self.net_weight = ParameterTuple(network.trainable_params())
        self.ema_weight = self.net_weight.clone(prefix="ema")
        self.updates = Parameter(Tensor(0.0, ms.float32), name="updates", requires_grad=False)
        self.decay = decay
        self.swaps = []

    def ema_update(self):
        done = ()
        for i in range(len(self.ema_weight)):
            e, w = self.ema_weight[i], self.net_weight[i]
            done += (ops.assign(e, e * self.decay + w * (1.0 - self.decay)),)
        return ops.depend(ops.assign_add(self.updates, Tensor(1.0, ms.float32)), done)

    def swap_before_eval(self):
        self.swaps.append("before")
        return True

    def swap_after_eval(self):
        self.swaps.append("after")
        return True


def _batch():
    ids, labels = micro_batch(0, 0, 1, 0, 1)
    return Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32)


@pytest.fixture
def net():
    return LossNet(init_weights(TinyNet(with_scalar=False)))


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_foreign_ema_is_updated_once_per_step(net, mode, tmp_path):
    ms.set_context(mode=mode)
    ema = prepare_ema(ForeignEMA(net))
    before = [e.asnumpy().copy() for e in ema.ema_weight]
    train = prepare_train_network(net, nn.SGD(net.trainable_params(), 0.1), ema=ema, updates=3,
                                  params_split_info=str(tmp_path))
    train(*_batch())
    assert float(ema.updates.asnumpy()) == 4.0  # 'updates' restored, then one update
    expected = [0.5 * b + 0.5 * w.asnumpy() for b, w in zip(before, ema.net_weight)]
    for e, x in zip(ema.ema_weight, expected):
        np.testing.assert_allclose(e.asnumpy(), x, rtol=1e-6)
    # bound at stage 0 too: its class is kept, its swaps are replaced by in-place ones
    assert isinstance(ema, ForeignEMA) and type(ema).__name__ == "ForeignEMA"
    weights = list(net.trainable_params())
    trained = [w.asnumpy().copy() for w in weights]
    ema.swap_before_eval()
    assert all(np.array_equal(w.asnumpy(), e.asnumpy()) for w, e in zip(weights, ema.ema_weight))
    ema.swap_after_eval()
    assert all(np.array_equal(w.asnumpy(), t) for w, t in zip(weights, trained))
    assert [id(w) for w in net.trainable_params()] == [id(w) for w in weights]
    assert ema.swaps == []  # the class's own set_data-style swaps never ran


class SetDataEMA(ForeignEMA):
    """Swaps the way MindOne's EMA (offloading=True) does: ``set_data`` of another tensor."""

    def swap_before_eval(self):
        self.cache = [Tensor(w.asnumpy()) for w in self.net_weight]
        for w, e in zip(self.net_weight, self.ema_weight):
            w.set_data(Tensor(e.asnumpy()))
        return True

    def swap_after_eval(self):
        for w, c in zip(self.net_weight, self.cache):
            w.set_data(c)
        return True


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
@pytest.mark.parametrize("ema_class", [EMA, SetDataEMA])
def test_training_moves_every_weight_after_a_swap(net, mode, ema_class, tmp_path):
    """[Note: in-place swaps]: with set_data swaps, PYNATIVE's jitted optimizer kept updating the
    old buffers, and every step after the first swap moved no weight."""
    ms.set_context(mode=mode)
    ema = ema_class(net) if ema_class is SetDataEMA else EMA(net, ema_decay=0.5)
    train = prepare_train_network(net, nn.Adam(net.trainable_params(), 0.01), ema=ema,
                                  params_split_info=str(tmp_path))
    weights = list(net.trainable_params())
    for round_ in range(3):
        train(*_batch())
        ema.swap_before_eval()
        ema.swap_after_eval()
        before = [w.asnumpy().copy() for w in weights]
        train(*_batch())
        unchanged = [w.name for w, b in zip(weights, before) if np.array_equal(w.asnumpy(), b)]
        assert unchanged == [], f"round {round_}: no update of {unchanged} after a swap"


def test_swap_after_eval_alone_changes_nothing(net):
    ema = EMA(net, ema_decay=0.5)
    for e in ema.ema_weight:
        e.set_data(Tensor(np.full(e.shape, 0.25, np.float32)))
    trained = [w.asnumpy().copy() for w in ema.net_weight]
    assert ema.swap_after_eval() is True  # MindOne's callback may call it without a swap before
    assert all(np.array_equal(w.asnumpy(), t) for w, t in zip(ema.net_weight, trained))


class _Lacking(ForeignEMA):
    ema_update = None


@pytest.mark.parametrize("ema, exc, words", [
    (lambda n: _Lacking(n), TypeError, ["'ema'", "_Lacking", "ema_update()"]),
    (lambda n: object(), TypeError, ["'ema'", "nn.Cell", "object"]),
])
def test_incompatible_ema_is_refused_naming_what_is_missing(net, ema, exc, words):
    for call in (lambda e: prepare_ema(e), lambda e: prepare_train_network(net, nn.SGD(net.trainable_params()), ema=e)):
        with pytest.raises(exc) as info:
            call(ema(net))
        for word in words:
            assert word in str(info.value)


def test_ema_of_other_length_is_refused(net):
    ema = ForeignEMA(net)
    ema.ema_weight = ParameterTuple(list(ema.ema_weight)[:-1])
    with pytest.raises(ValueError, match="one 'ema_weight' per 'net_weight'"):
        prepare_ema(ema)


def test_our_ema_swaps_and_restores_exactly(net):
    ema = EMA(net, ema_decay=0.5)
    for e in ema.ema_weight:
        e.set_data(Tensor(np.full(e.shape, 0.25, np.float32)))
    trained = [w.asnumpy().copy() for w in ema.net_weight]
    assert ema.swap_before_eval() is True
    assert all((w.asnumpy() == 0.25).all() for w in ema.net_weight)
    assert ema.swap_after_eval() is True
    assert all(np.array_equal(w.asnumpy(), t) for w, t in zip(ema.net_weight, trained))


def test_wrapper_has_mindone_attributes(net, tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    manager = nn.DynamicLossScaleUpdateCell(2.0 ** 8, 2, 100)
    train = prepare_train_network(net, nn.SGD(net.trainable_params(), 0.1), scale_sense=manager,
                                  gradient_accumulation_steps=2, verbose=True, params_split_info=str(tmp_path))
    assert train.loss_scaling_manager is manager
    assert train.zero_stage == 0 and train.verbose is True and train.accum_steps == 2
    assert train.accumulated_grads is train.accum_grads and train.cur_accum_step is train.accum_step
    assert train.reducer_flag is False and train.degree == 1 and train.mean is True
    assert callable(train.grad_reducer) and callable(train.run_optimizer)
    train.set_sense_scale(Tensor([64.0], ms.float32))
    _, _, scale = train(*_batch())
    assert float(scale.asnumpy()) == 64.0
    train.set_sense_scale(32.0)
    assert float(train.scale_sense.asnumpy()) == 32.0


@pytest.mark.parametrize("sens", [-1.0, "x", Tensor(np.ones(2, np.float32))])
def test_set_sense_scale_rejects(net, sens, tmp_path):
    train = prepare_train_network(net, nn.SGD(net.trainable_params()), params_split_info=str(tmp_path))
    with pytest.raises(TypeError, match="'sens' must be a positive float or a one-element Tensor"):
        train.set_sense_scale(sens)


@pytest.mark.parametrize("make", [
    lambda p: __import__("mindspore.experimental.optim", fromlist=["AdamW"]).AdamW(p, lr=0.01),
    lambda p: __import__("mindspore.experimental.optim", fromlist=["SGD"]).SGD(p, lr=0.1),
    lambda p: mint.optim.Adam(p, lr=0.01),
])
def test_experimental_optimizers_are_accepted(net, make, tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    train = prepare_train_network(net, make(net.trainable_params()), params_split_info=str(tmp_path))
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    loss, overflow, _ = train(*_batch())
    assert np.isfinite(loss.asnumpy()) and not bool(overflow.asnumpy())
    assert any(not np.array_equal(b, p.asnumpy()) for b, p in zip(before, net.trainable_params()))


def test_split_rule_remembers_the_users_opt_out():
    opted = Parameter(Tensor(np.ones((4, 2), np.float32)), name="opted")
    opted.parallel_optimizer = False
    plain = Parameter(Tensor(np.ones((4, 2), np.float32)), name="plain")
    scalar = Parameter(Tensor(1.0, ms.float32), name="scalar")
    frozen = Parameter(Tensor(np.ones((4, 2), np.float32)), name="frozen", requires_grad=False)
    assert [is_split_candidate(p) for p in (opted, plain, scalar, frozen)] == [False, True, False, False]
    mark_shard_flag(opted, True)  # the flag now says "holds a shard"; the user's choice is kept
    mark_shard_flag(plain, False)
    assert opted.parallel_optimizer is True and plain.parallel_optimizer is False
    assert not is_split_candidate(opted) and is_split_candidate(plain)


def test_parallel_optimizer_input_and_output_stay_apart():
    """The flag as output (holds a shard) never becomes the input of a later preparation."""
    p = Parameter(Tensor(np.ones((4, 2), np.float32)), name="p")
    mark_shard_flag(p, False)  # e.g. stage 0: not a shard, although the user did not opt out
    mark_shard_flag(p, True)
    assert p.parallel_optimizer is True and not user_opted_out(p) and is_split_candidate(p)
    mark_shard_flag(p, False)
    assert not user_opted_out(p)  # the output written last is not read back as an opt-out
    p.zero_opt_out = True  # the documented way to change the choice after a preparation
    assert user_opted_out(p) and not is_split_candidate(p)
