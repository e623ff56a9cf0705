"""Parameters built without their data ([Note: delayed initialisation] in
mindone_zero/core/materialize.py): ``sharded_init`` gives the eager build's values whatever happens
between build and materialization; what each MindSpore initializer draws; blocks without a full copy
where the initializer allows; the initializer a ``clone`` loses is found again."""
import copy
import logging
import pickle
import threading

import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor, nn
from mindspore.common import initializer as inits
from mindspore.nn.utils import no_init_parameters

from mindone_zero import sharded_init
from mindone_zero.core import materialize as mat
from mindone_zero.core.partition import ShardSpec, split_array
from mindone_zero.memory.measure import memory_in_use

SHAPE = (6, 5)
# every initializer MindSpore 2.10 registers, with the arguments it needs
INITIALIZERS = {
    "zeros": inits.Zero(), "ones": inits.One(), "constant": inits.Constant(0.5), "normal": inits.Normal(0.2),
    "uniform": inits.Uniform(0.3), "truncated_normal": inits.TruncatedNormal(0.1), "he_uniform": inits.HeUniform(),
    "he_normal": inits.HeNormal(), "xavier_uniform": inits.XavierUniform(), "xavier_normal": inits.XavierNormal(),
    "orthogonal": inits.Orthogonal(), "identity": inits.Identity(), "sparse": inits.Sparse(0.3),
    "variance_scaling": inits.VarianceScaling(scale=2.0, distribution="untruncated_normal"),
}


class Params(nn.Cell):
    """One parameter per initializer, then a Dense and a parameter made from numpy."""

    def __init__(self):
        super().__init__()
        for name, init in INITIALIZERS.items():
            setattr(self, name, Parameter(inits.initializer(init, SHAPE, ms.float32), name=name))
        self.dense = nn.Dense(4, 3)
        self.literal = Parameter(Tensor(np.arange(3, dtype=np.float32)), name="literal")


def _eager(seed=5):
    np.random.seed(seed)
    net = Params()
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}, np.random.get_state()


def _same_state(a, b):
    return a[2] == b[2] and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("name", sorted(INITIALIZERS))
def test_draws_of_says_what_the_initializer_draws(name):
    init = INITIALIZERS[name]
    np.random.seed(3)
    before = np.random.get_state()
    inits.initializer(init, SHAPE, ms.float32).init_data()
    after = np.random.get_state()
    np.random.seed(3)
    np.random.randint(low=1, high=(1 << 63), dtype=np.int64)
    one = np.random.get_state()
    draws = mat.draws_of(init)
    if draws == 0:
        assert _same_state(before, after)
    elif draws == 1:
        assert _same_state(one, after)
    else:  # unknown initializers are replayed in full by sharded_init
        assert draws is None and name in ("sparse", "variance_scaling")


def test_sharded_init_gives_eager_values_and_state():
    eager, eager_state = _eager()
    np.random.seed(5)
    with sharded_init():
        net = Params()
    assert _same_state(np.random.get_state(), eager_state)  # later draws see the eager stream too
    lazy = {p.name for p in net.get_parameters() if mat.is_unmaterialized(p)}
    assert lazy == set(eager) - {"literal"}  # made from numpy: materialized as usual
    np.random.standard_normal(100)  # something draws in between (an optimizer, an EMA, a data set)
    nn.AdamWeightDecay(net.trainable_params())  # clones every parameter: their init_mode loses its initializer
    for p in reversed(list(net.get_parameters())):  # and the order differs from the build's
        mat.materialize(p)
    for p in net.get_parameters():
        assert not mat.is_unmaterialized(p)
        np.testing.assert_array_equal(p.asnumpy(), eager[p.name], err_msg=p.name)


def test_sharded_init_restores_mindspore_after_an_error():
    original = Parameter.__dict__["_get_parameter_new_args"]
    with pytest.raises(RuntimeError, match="boom"):
        with sharded_init():
            raise RuntimeError("boom")
    assert Parameter.__dict__["_get_parameter_new_args"] is original
    assert getattr(Parameter, "init_param", True) is True
    assert not mat.is_unmaterialized(nn.Dense(2, 2).weight)


def test_block_of_equals_a_cut_of_the_eager_value():
    eager, _ = _eager()
    np.random.seed(5)
    with sharded_init():
        net = Params()
    for p in net.get_parameters():
        spec = ShardSpec(p.name, tuple(p.shape), 4, 1, True)
        block = mat.block_of(p, spec)
        np.testing.assert_array_equal(block, split_array(eager[p.name], 4, 1), err_msg=p.name)
        assert mat.is_unmaterialized(p) == (p.name != "literal")  # reading a block does not fill the parameter


def test_zero_block_needs_no_full_tensor(monkeypatch):
    with sharded_init():
        p = Parameter(inits.initializer("zeros", (1000, 8), ms.float16), name="m")
    monkeypatch.setattr(mat, "host_value", lambda param: pytest.fail("a Zero block ran the full initializer"))
    block = mat.block_of(p, ShardSpec("m", (1000, 8), 3, 2, True))
    assert block.shape == (334, 8) and block.dtype == np.float16 and not block.any()


def test_a_clone_loses_the_initializer_and_it_is_found_again():
    with no_init_parameters():
        dense = nn.Dense(4, 3)
    nn.Momentum(dense.trainable_params(), 0.1, 0.9)  # MindOne's order: the optimizer on the unmaterialized network
    assert dense.weight.init_mode.init is None  # what made MindSpore's init_data raise
    assert isinstance(mat.initializer_of(dense.weight), inits.HeUniform)
    mat.restore_initializer(dense.weight)
    dense.weight.init_data()  # MindSpore's own path (a graph compile) works again
    assert not mat.is_unmaterialized(dense.weight)


def test_no_init_parameters_warns_and_names_the_fix(caplog):
    mat._warned.clear()
    with no_init_parameters():
        dense = nn.Dense(4, 3)
        norm = nn.LayerNorm((3,))
    with caplog.at_level(logging.WARNING, logger=mat.__name__):
        mat.host_value(norm.gamma)  # ones: nothing random, nothing to say
        assert not caplog.records
        mat.host_value(dense.weight)
    assert len(caplog.records) == 1 and "mindone_zero.sharded_init()" in caplog.records[0].getMessage()
    assert "'weight'" in caplog.records[0].getMessage()


def test_an_initializer_replaced_after_sharded_init_warns_naming_what_happened(caplog):
    """mindone.transformers' ``_init_weights`` replaces each weight's initializer with
    ``set_data(initializer(...))`` after the layer made it: the new initializer has no recorded
    state, so it draws when materialized, and the warning says so rather than blaming
    ``no_init_parameters``."""
    mat._warned.clear()
    with sharded_init():
        dense = nn.Dense(4, 3)
        dense.weight.set_data(inits.initializer(inits.Normal(0.02), dense.weight.shape, dense.weight.dtype))
    with caplog.at_level(logging.WARNING, logger=mat.__name__):
        mat.host_value(dense.weight)
    message = caplog.records[0].getMessage()
    assert len(caplog.records) == 1 and ("was built under mindone_zero.sharded_init(), but its initializer was "
                                         "replaced afterwards") in message
    assert "no_init_parameters" not in message and "'weight'" in message


def test_bfloat16_parameters():
    np.random.seed(2)
    eager = Parameter(inits.initializer("normal", (4, 3), ms.bfloat16), name="w").astype(ms.float32).asnumpy()
    np.random.seed(2)
    with sharded_init():
        p = Parameter(inits.initializer("normal", (4, 3), ms.bfloat16), name="w")
    spec = ShardSpec("w", (4, 3), 2, 0, True)
    mat.set_value(p, mat.block_of(p, spec))
    assert p.dtype == ms.bfloat16 and not mat.is_unmaterialized(p)
    np.testing.assert_array_equal(p.astype(ms.float32).asnumpy(), eager[:2])


def test_copies_stay_unmaterialized_without_drawing():
    """An optimizer or EMA built on a ``sharded_init`` network clones every parameter: the copies
    stay unmaterialized (no memory, no random draws) and the sources keep their initializers."""
    np.random.seed(5)
    eager = nn.SequentialCell([nn.Dense(512, 512) for _ in range(4)])
    np.random.seed(5)
    with sharded_init():
        net = nn.SequentialCell([nn.Dense(512, 512) for _ in range(4)])
    state = np.random.get_state()
    before = memory_in_use()
    optimizer = nn.AdamWeightDecay(net.trainable_params())
    same = ms.ParameterTuple(net.trainable_params()).clone(prefix="ema", init="same")
    assert memory_in_use() - before < 2 ** 20  # the model is 4 MiB; MindSpore's copies would run every initializer
    assert _same_state(np.random.get_state(), state)
    assert all(mat.is_unmaterialized(p) for p in list(optimizer.moments1) + list(optimizer.moments2) + list(same))
    assert all(p.init_mode.init is not None for p in net.trainable_params())
    for p, e, copy in zip(net.trainable_params(), eager.trainable_params(), same):
        np.testing.assert_array_equal(mat.host_value(copy), e.asnumpy())  # a 'same' copy: the source's values
        mat.materialize(p)
        np.testing.assert_array_equal(p.asnumpy(), e.asnumpy())
    assert not mat.block_of(optimizer.moments1[0], ShardSpec("m", (512, 512), 2, 1, True)).any()


def _plain_class():
    return type(Parameter(Tensor(np.zeros(1, np.float32)), name="plain"))


def test_sharded_init_leaves_parameter_and_tensor_as_it_found_them():
    """No patch outlives the block: after it (also a nested one, or one that raised) ``Parameter``,
    MindSpore's Parameter class and ``Tensor`` hold what they held before. Inside, only the one
    attribute ``parameters_without_data`` names is replaced."""
    plain = _plain_class()
    before = [dict(vars(cls)) for cls in (Parameter, plain, Tensor)]
    with sharded_init():
        changed = [name for name in set(vars(Parameter)) | set(before[0])
                   if vars(Parameter).get(name) is not before[0].get(name)]
        with sharded_init():
            nn.Dense(2, 2)
        nn.Dense(2, 2)
    assert changed == ["_get_parameter_new_args"]
    with pytest.raises(RuntimeError, match="boom"):
        with sharded_init():
            raise RuntimeError("boom")
    assert [dict(vars(cls)) for cls in (Parameter, plain, Tensor)] == before


def test_parameters_built_outside_a_block_are_untouched():
    """Built eagerly, under ``no_init_parameters``, or in another thread while a block is open: a
    plain MindSpore Parameter, which copies as MindSpore copies it."""
    plain = _plain_class()
    with no_init_parameters():
        lazy = nn.Dense(4, 3)
    ready, built = threading.Event(), {}

    def other_thread():
        ready.wait(60)
        built["dense"] = nn.Dense(4, 3)

    thread = threading.Thread(target=other_thread)
    thread.start()
    with sharded_init():
        mine = nn.Dense(4, 3)
        ready.set()
        thread.join(60)
    eager = nn.Dense(4, 3)
    assert mat.is_unmaterialized(mine.weight) and type(mine.weight) is not plain
    assert not mat.is_unmaterialized(built["dense"].weight)
    for p in (lazy.weight, built["dense"].weight, eager.weight):
        assert type(p) is plain and type(p).__reduce_ex__ is Parameter.__reduce_ex__
    lazy.weight.clone()  # MindSpore's own copy: it loses the source's initializer (test above)
    assert lazy.weight.init_mode.init is None
    assert copy.deepcopy(eager.weight).asnumpy().tolist() == eager.weight.asnumpy().tolist()


@pytest.mark.parametrize("how", ["clone", "copy", "deepcopy", "pickle", "ParameterTuple.clone", "copy of a copy"])
def test_copies_made_after_the_block_stay_unmaterialized(how):
    np.random.seed(7)
    eager = nn.Dense(6, 4).weight.asnumpy()
    np.random.seed(7)
    with sharded_init():
        source = nn.Dense(6, 4).weight
    make = {
        "clone": lambda p: p.clone(), "copy": copy.copy, "deepcopy": copy.deepcopy,
        "pickle": lambda p: pickle.loads(pickle.dumps(p)),
        "ParameterTuple.clone": lambda p: ms.ParameterTuple([p]).clone(prefix="ema")[0],
        "copy of a copy": lambda p: copy.deepcopy(p.clone()).clone(),
    }[how]
    np.random.seed(0)
    state = np.random.get_state()
    duplicate = make(source)
    assert _same_state(np.random.get_state(), state)  # nothing ran an initializer
    assert mat.is_unmaterialized(duplicate) and mat.is_unmaterialized(source)
    np.testing.assert_array_equal(mat.host_value(duplicate), eager)
    mat.materialize(source)
    assert type(source) is _plain_class()  # materialized: a plain Parameter again, copied as MindSpore does
    np.testing.assert_array_equal(copy.deepcopy(source).asnumpy(), eager)
    np.testing.assert_array_equal(source.asnumpy(), eager)


class _Ordered(nn.Cell):
    """A parameter the generic rewrite gathers, before a layer that is replaced, in the network's order."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(inits.initializer(inits.Normal(0.2), (4,), ms.float32), name="w")
        self.dense = nn.Dense(4, 3)

    def construct(self, x):
        return self.dense(x * self.w)


def test_shard_network_materializes_in_the_networks_order():
    """Without ``sharded_init``'s per-parameter state a parameter built under ``no_init_parameters``
    draws when it is materialized; ``shard_network`` cuts every parameter first, in the network's
    order ([Note: delayed initialisation]), so the draws are those of the eager build."""
    from parallel_modules import shard_network

    np.random.seed(3)
    eager = {p.name: p.asnumpy().copy() for p in _Ordered().get_parameters()}
    np.random.seed(3)
    with no_init_parameters():
        net = _Ordered()
    net = shard_network(net)
    assert sorted(eager) == sorted(p.name for p in net.get_parameters())
    assert all(np.array_equal(p.asnumpy(), eager[p.name]) for p in net.get_parameters())
