"""One-process tests of ``parallel_modules``: layer Cells, the generic rewrite and its errors.

Without an initialised communication backend the group has one rank, so every split parameter
is its own single block and the gathers are local: these tests check structure, the rewritten
code (in GRAPH_MODE and PYNATIVE_MODE) and numerics against the unwrapped layers. The
collectives themselves are tested under msrun in tests/dist/test_zero3_network.py.
"""
import inspect

import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, mint, nn, ops

import parallel_modules as pm
import zero3_models as zm
from mindone_zero.zero3.gather_group import GatherGroup
from mindone_zero.zero3.param_wrapper import shard_parameter

ms.set_device("CPU")


@pytest.fixture
def mode(request):
    previous = ms.get_context("mode")
    ms.set_context(mode=request.param)
    yield request.param
    ms.set_context(mode=previous)


GRAPH_AND_PYNATIVE = pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], indirect=True,
                                             ids=["graph", "pynative"])
PYNATIVE = pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE], indirect=True, ids=["pynative"])


def _copy_weights(src, dst):
    for (_, a), (_, b) in zip(src.parameters_and_names(), dst.parameters_and_names()):
        b.set_data(a.copy())


class _SumLoss(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, *inputs):
        return self.net(*inputs).astype(ms.float32).sum()


def _grads(net, *inputs):
    loss = _SumLoss(net)
    fn = ms.value_and_grad(loss, None, loss.trainable_params())
    return [g.asnumpy() for g in fn(*inputs)[1]]


@GRAPH_AND_PYNATIVE
def test_shard_network_matches_unsharded(mode):
    ref, net = zm.build(), zm.build()
    names = [p.name for _, p in net.parameters_and_names()]
    net = pm.shard_network(net, parallel_modules={zm.Shift: zm.ShiftZero3})
    assert [p.name for _, p in net.parameters_and_names()] == names
    ids, img, _ = zm.make_batch(3, 0)
    np.testing.assert_allclose(net(ids, img).asnumpy(), ref(ids, img).asnumpy(), rtol=1e-6, atol=1e-6)
    for a, b in zip(_grads(net, ids, img), _grads(ref, ids, img)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_shard_network_structure():
    net = pm.shard_network(zm.build(), parallel_modules={zm.Shift: zm.ShiftZero3})
    assert isinstance(net.embed, pm.Embedding) and isinstance(net.conv, pm.Conv2d)
    assert isinstance(net.body[0], pm.Dense) and net.body.cell_list[0] is net.body[0]
    assert isinstance(net.blocks[1], pm.Linear) and isinstance(net.blocks[2], zm.ShiftZero3)
    # Generic path: same instance, dynamic subclass of its own class.
    for cell, original in ((net.body[1], nn.LayerNorm), (net.body[2], zm.Scale), (net.blocks[0], zm.MyDense),
                           (net, zm.Zero3TestNet)):
        assert type(cell).zero3_original_class is original and isinstance(cell, original)
    # construct's gathers wait for its input ([Note: gather order])
    assert "gamma_zero_gather(self.gamma, input_x)" in inspect.getsource(type(net.body[1]).construct)
    specs = {p.name: getattr(p, "zero_spec", None) for _, p in net.parameters_and_names()}
    assert specs["frozen"].split  # a frozen floating parameter follows the split rule ([Note: split rule])
    assert not specs["temperature"].split and not specs["keep"].split
    assert all(s.split for n, s in specs.items() if n not in ("temperature", "keep"))
    assert specs["embed.embedding_table"].shape == (zm.VOCAB, zm.EMB)


@PYNATIVE
def test_every_split_parameter_is_gathered(mode, monkeypatch):
    gathered = []
    original = GatherGroup.construct

    def spy(self, xs):
        gathered.extend(self.param_names)
        return original(self, xs)

    monkeypatch.setattr(GatherGroup, "construct", spy)
    net = pm.shard_network(zm.build(), parallel_modules={zm.Shift: zm.ShiftZero3})
    ids, img, _ = zm.make_batch(3, 0)
    net(ids, img)
    split = {p.name for _, p in net.parameters_and_names() if getattr(p, "zero_spec", None) and p.zero_spec.split}
    assert set(gathered) == split
    # The Embedding table is read by the Embedding and by the tied output layer.
    assert gathered.count("embed.embedding_table") == 2


def _layer_cases():
    ms.set_seed(1)
    return [
        (nn.Dense(4, 7, activation=nn.PReLU()), (np.ones((2, 3, 4), np.float32),)),
        (nn.Dense(4, 7, has_bias=False, activation="relu"), (np.ones((2, 4), np.float32),)),
        (mint.nn.Linear(4, 7), (np.ones((2, 4), np.float32),)),
        (nn.Conv1d(2, 3, 3, has_bias=True), (np.ones((1, 2, 6), np.float32),)),
        (nn.Conv2d(2, 3, 3, has_bias=True, pad_mode="pad", padding=1), (np.ones((1, 2, 5, 5), np.float32),)),
        (nn.Conv3d(2, 3, 3, has_bias=True), (np.ones((1, 2, 4, 4, 4), np.float32),)),
        (nn.Embedding(11, 5), (np.array([[1, 10, 3]], np.int32),)),
        (nn.Embedding(11, 5, use_one_hot=True), (np.array([[1, 10, 3]], np.int32),)),
    ]


@PYNATIVE
@pytest.mark.parametrize("stage", [0, 3])
@pytest.mark.parametrize("index", range(8))
def test_layer_cells_match_originals(mode, index, stage):
    layer, inputs = _layer_cases()[index]
    inputs = [Tensor(x) for x in inputs]
    ref = _layer_cases()[index][0]
    _copy_weights(layer, ref)
    params = {name: p for name, p in layer.parameters_and_names()}
    wrapped = pm.PARALLEL_MODULES[type(layer)](layer, stage)
    assert {name: p for name, p in wrapped.parameters_and_names()} == params  # same objects, same names
    # Below stage 3 nothing is sharded (no zero_spec); at stage 3 the layer's own parameters are
    # (a child's, like PReLU's, are left to shard_network's generic path).
    own = [getattr(wrapped, a) for a in wrapped.zero3_param_attrs if getattr(wrapped, a) is not None]
    assert own and all(hasattr(p, "zero_spec") == (stage == 3) for p in own)
    np.testing.assert_allclose(wrapped(*inputs).asnumpy(), ref(*inputs).asnumpy(), rtol=1e-6, atol=1e-6)
    for a, b in zip(_grads(wrapped, *inputs), _grads(ref, *inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer", [
    lambda: mint.nn.Conv1d(2, 3, 3), lambda: mint.nn.Conv2d(2, 3, 3, bias=False), lambda: mint.nn.Conv3d(2, 3, 3),
    lambda: mint.nn.Embedding(11, 4),
])
def test_mint_layer_cells_build(layer):
    # mint Conv/Embedding kernels do not exist on CPU (MindSpore 2.10): structure only.
    original = layer()
    params = dict(original.parameters_and_names())
    wrapped = pm.PARALLEL_MODULES[type(original)](original, 3)
    assert dict(wrapped.parameters_and_names()) == params and wrapped.is_mint
    assert all(isinstance(getattr(wrapped, name + "_zero_gather"), pm.ZeroParamWrapper) for name in params)


def test_layer_cell_errors():
    with pytest.raises(TypeError, match="'net' must be one of"):
        pm.Dense(nn.Conv2d(1, 1, 1))
    for bad in (5, -1, True, "3"):
        with pytest.raises(ValueError, match=rf"'zero_stage' must be one of \[0, 1, 2, 3\], but got {bad!r}"):
            pm.Dense(nn.Dense(2, 3), zero_stage=bad)
    with pytest.raises(TypeError, match="'optimizer_parallel_group' must be None or a str, but got 7"):
        pm.Dense(nn.Dense(2, 3), 3, 7)
    with pytest.raises(TypeError, match="'optimizer_parallel_group' and 'op_group' are aliases"):
        pm.Dense(nn.Dense(2, 3), 3, "a", op_group="b")
    with pytest.raises(TypeError, match="'cell_type' must be None or a float dtype, but got mindspore.int32"):
        pm.Dense(nn.Dense(2, 3), 3, None, ms.int32)
    with pytest.raises(ValueError, match="max_norm"):
        pm.Embedding(mint.nn.Embedding(11, 4, max_norm=1.0), 3)
    pm.Embedding(mint.nn.Embedding(11, 4, max_norm=1.0), 0)  # a no-op below stage 3: max_norm is kept
    dense = nn.Dense(2, 3)
    with pytest.raises(ValueError, match="zero_stage"):
        pm.Dense(dense, 4)
    assert not hasattr(dense.weight, "zero_spec") and dense.weight.shape == (3, 2)  # nothing modified


@PYNATIVE
def test_to_float_gathers_in_compute_dtype(mode):
    dense = nn.Dense(4, 3).to_float(ms.float16)
    wrapped = pm.Dense(dense, 3)
    assert wrapped.weight_zero_gather.gather.compute_dtype == ms.float16 and wrapped.get_flags()["fp16"]
    x = Tensor(np.ones((2, 4), np.float32))
    assert wrapped(x).dtype == ms.float16
    grads = _grads(wrapped, x)
    assert all(g.dtype == np.float32 for g in grads)


def test_shard_parameter_rules():
    trainable = Parameter(Tensor(np.ones((3, 2), np.float32)), name="t")
    scalar = Parameter(Tensor(1.0, ms.float32), name="s")
    opted = Parameter(Tensor(np.ones(3, np.float32)), name="o")
    opted.parallel_optimizer = False
    frozen = Parameter(Tensor(np.ones(3, np.float32)), name="f", requires_grad=False)
    counter = Parameter(Tensor(np.zeros(3, np.int32)), name="c", requires_grad=False)
    spec = shard_parameter(trainable)
    assert spec.split and trainable.zero_spec is spec and shard_parameter(trainable) is spec
    assert not shard_parameter(scalar).split and not shard_parameter(opted).split
    assert shard_parameter(frozen).split and frozen.zero_spec.split  # a frozen weight: the same rule
    assert not shard_parameter(counter).split and not hasattr(counter, "zero_spec")  # not floating
    with pytest.raises(TypeError, match="'param' must be a Parameter"):
        shard_parameter(Tensor(np.ones(2, np.float32)))
    with pytest.raises(TypeError, match="'compute_dtype' must be None or a float dtype"):
        pm.ZeroParamWrapper(trainable, compute_dtype=ms.int32)


class _Child(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.arange(6, dtype=np.float32).reshape(3, 2)), name="w")
        self.b = None

    def construct(self, x):
        return x * self.w

    def helper(self, x):
        return x + self.w.sum()


class _Reader(nn.Cell):
    """Reads a child's parameter, calls a child's helper, asks `is None`, uses `.shape`."""

    def __init__(self):
        super().__init__()
        self.child = _Child()
        self.v = Parameter(Tensor(np.ones(2, np.float32)), name="v")

    def construct(self, x):
        y = self.child(x) + self.child.w * self.v
        if self.child.b is None:
            y = self.child.helper(y)
        return y.reshape(self.child.w.shape) + getattr(self, "v")


@GRAPH_AND_PYNATIVE
def test_generic_reads_through_children_and_helpers(mode):
    ref, net = _Reader(), _Reader()
    net = pm.shard_network(net)
    x = Tensor(np.ones((3, 2), np.float32))
    np.testing.assert_allclose(net(x).asnumpy(), ref(x).asnumpy())
    for a, b in zip(_grads(net, x), _grads(ref, x)):
        np.testing.assert_allclose(a, b)
    src = inspect.getsource(type(net).construct)
    assert "self.child__w_zero_gather(self.child.w, x)" in src and "self.v_zero_gather(self.v, x)" in src
    assert "(3, 2)" in src and "self.child.b is None" in src
    assert "self.w_zero_gather(self.w)" in inspect.getsource(type(net.child).helper)  # not construct: no input to wait for


class _ShapeOnly(nn.Cell):
    """Reads a child's parameter only for its shape: still rewritten (the shard's shape differs)."""

    def __init__(self):
        super().__init__()
        self.child = _Child()

    def construct(self, x):
        return self.child(x.reshape(self.child.w.shape))


@PYNATIVE
def test_shape_only_read_is_rewritten(mode):
    net = pm.shard_network(_ShapeOnly())
    assert "x.reshape((3, 2))" in inspect.getsource(type(net).construct)
    x = Tensor(np.ones(6, np.float32))
    np.testing.assert_allclose(net(x).asnumpy(), np.arange(6, dtype=np.float32).reshape(3, 2))


def _make_closure_cell(factor):
    class Closure(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.ones(4, np.float32)), name="w")

        def construct(self, x):
            return x * self.w * factor

    return Closure()


@GRAPH_AND_PYNATIVE
def test_closure_variables_survive_rewrite(mode):
    net = pm.shard_network(_make_closure_cell(3.0))
    np.testing.assert_allclose(net(Tensor(np.ones(4, np.float32))).asnumpy(), np.full(4, 3.0, np.float32))


class _HandWritten(nn.Cell):
    """Gathers its parameter itself without the marker: the rewrite must not gather twice."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(3, np.float32)), name="w")
        self.w_gather = pm.ZeroParamWrapper(self.w)

    def construct(self, x):
        return x * self.w_gather(self.w)


@PYNATIVE
def test_hand_written_gather_is_left_alone(mode):
    net = pm.shard_network(_HandWritten())
    assert "zero3_original_class" not in type(net).__dict__
    np.testing.assert_allclose(net(Tensor(np.ones(3, np.float32))).asnumpy(), np.ones(3, np.float32))


class _Shared(nn.Cell):
    def __init__(self):
        super().__init__()
        dense = nn.Dense(3, 3)
        self.a = dense
        self.b = dense

    def construct(self, x):
        return self.b(self.a(x))


def test_replacement_keeps_sharing_and_top_cell():
    net = pm.shard_network(_Shared())
    assert isinstance(net.a, pm.Dense) and net.a is net.b
    top = pm.shard_network(nn.Dense(3, 7))
    assert isinstance(top, pm.Dense) and top.weight.name == "weight"


class _TupleReader(nn.Cell):
    def __init__(self):
        super().__init__()
        self.ws = ParameterTuple([Parameter(Tensor(np.ones(2, np.float32)), name="w0")])

    def construct(self, x):
        for w in self.ws:
            x = x * w
        return x


class _Store(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(2, np.float32)), name="w")

    def construct(self, x):
        self.w = x
        return x


class _Assign(_Store):
    def construct(self, x):
        ops.assign(self.w, x)
        return x


class _Dynamic(_Store):
    def __init__(self):
        super().__init__()
        self.key = "w"

    def construct(self, x):
        return x * getattr(self, self.key)


class _LoopAlias(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([zm.Scale(2), zm.Scale(2)])

    def construct(self, x):
        for layer in self.layers:
            x = x * layer.scale
        return x


def _decorate(fn):
    return fn


class _Decorated(_Store):
    @_decorate
    def construct(self, x):
        return x * self.w


@pytest.mark.parametrize("cell, message", [
    (_TupleReader, "container holding sharded parameters"),
    (_Store, "stores to or deletes the sharded parameter 'w'"),
    (_Assign, r"updates the sharded parameter 'w' in place \(assign\)"),
    (_Dynamic, r"no construct .* reads as self.<attribute>: \['w'\]"),
    (_LoopAlias, "cannot be resolved statically"),
    (_Decorated, "decorated method"),
])
def test_unsupported_uses_raise_before_any_change(cell, message):
    net = cell()
    shapes = [p.shape for p in net.get_parameters()]
    with pytest.raises(ValueError, match=message):
        pm.shard_network(net)
    assert [p.shape for p in net.get_parameters()] == shapes
    assert not any(hasattr(p, "zero_spec") for p in net.get_parameters())
    assert all("zero3_original_class" not in type(c).__dict__ for _, c in net.cells_and_names())


def test_shard_network_argument_errors():
    with pytest.raises(TypeError, match="'network' must be a Cell, but got <class 'int'>"):
        pm.shard_network(3)
    with pytest.raises(TypeError, match="'group' must be None or a str, but got 3"):
        pm.shard_network(zm.Scale(2), group=3)
    with pytest.raises(TypeError, match="'parallel_modules' must map Cell classes"):
        pm.shard_network(zm.Scale(2), parallel_modules={1: 2})
    net = pm.shard_network(zm.Scale(2))
    with pytest.raises(ValueError, match="already sharded"):
        pm.shard_network(net)


# -- MindOne's signatures ------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [pm.Dense, pm.Linear, pm.Conv1d, pm.Conv2d, pm.Conv3d, pm.Embedding])
def test_layer_cells_take_mindones_signature(cls):
    params = inspect.signature(cls).parameters
    assert list(params)[:4] == ["net", "zero_stage", "optimizer_parallel_group", "cell_type"]
    assert [params[n].default for n in list(params)[1:4]] == [0, None, None]
    assert params["op_group"].kind is inspect.Parameter.KEYWORD_ONLY


def test_layer_cell_group_positional_and_alias():
    a = pm.Dense(nn.Dense(2, 3), 3, None, ms.float16)
    assert a.weight_zero_gather.gather.compute_dtype == ms.float16 and a.zero_stage == 3
    b = pm.Dense(nn.Dense(2, 3), 3, op_group=None)
    assert b.weight_zero_gather.sharded and b.optimizer_parallel_group is None


@GRAPH_AND_PYNATIVE
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_layer_cells_below_stage_3_compute_what_net_computes(mode, stage):
    ms.set_seed(3)
    dense = nn.Dense(4, 5, activation="tanh").to_float(ms.float16)
    ref = nn.Dense(4, 5, activation="tanh").to_float(ms.float16)
    _copy_weights(dense, ref)
    wrapped = pm.Dense(dense, stage)
    assert not wrapped.weight_zero_gather.sharded and not wrapped.weight_zero_gather.is_split
    assert not any(hasattr(p, "zero_spec") for p in wrapped.get_parameters())
    x = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(wrapped(x).asnumpy(), ref(x).asnumpy())
    for a, b in zip(_grads(wrapped, x), _grads(ref, x)):
        np.testing.assert_array_equal(a, b)


def test_zero_param_wrapper_both_forms():
    def param():
        return Parameter(Tensor(np.ones((3, 2), np.float32)), name="p")

    ours = pm.ZeroParamWrapper(param(), None, ms.float16)
    theirs = pm.ZeroParamWrapper(param(), 3, None, ms.float16)
    keywords = pm.ZeroParamWrapper(param(), zero_stage=3, optimizer_parallel_group=None, cell_type=ms.float16)
    for w in (ours, theirs, keywords):
        assert w.sharded and w.zero_stage == 3 and w.cell_type == ms.float16 and w.optimizer_parallel_group is None
        assert w.gather.compute_dtype == ms.float16 and w.need_rewrite is False and w.is_split
    p = param()
    below = pm.ZeroParamWrapper(p, 2, None, ms.float16)
    assert not below.sharded and not below.need_rewrite and not hasattr(p, "zero_spec")
    out = below(Tensor(np.full((3, 2), 2.0, np.float32)))
    assert out.dtype == ms.float32 and float(out.sum().asnumpy()) == 12.0  # identity, no cast


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((5,), {}, ValueError, r"'zero_stage' must be one of \[0, 1, 2, 3\], but got 5"),
    ((3, 7), {}, TypeError, "'optimizer_parallel_group' must be None or a str, but got 7"),
    ((7,), {}, ValueError, "but got 7"),
    ((None, ms.int32), {}, TypeError, "'compute_dtype' must be None or a float dtype"),
    ((3, None, ms.int32), {}, TypeError, "'cell_type' must be None or a float dtype"),
    ((), {"group": "a", "optimizer_parallel_group": "b"}, TypeError,
     "'group' and 'optimizer_parallel_group' are aliases"),
    ((None,), {"group": None}, TypeError, "multiple values for the argument 'group'"),
    ((3, None, None, 1), {}, TypeError, "at most"),
    ((), {"stage": 3}, TypeError, "unexpected keyword argument 'stage'"),
])
def test_zero_param_wrapper_errors(args, kwargs, error, message):
    p = Parameter(Tensor(np.ones((3, 2), np.float32)), name="p")
    with pytest.raises(error, match=message):
        pm.ZeroParamWrapper(p, *args, **kwargs)
    assert not hasattr(p, "zero_spec")


class _Recorder(nn.Cell):
    """A user replacement class with MindOne's signature that records how it was called."""

    calls = []

    def __init__(self, net, zero_stage=0, optimizer_parallel_group=None, cell_type=None):
        super().__init__(auto_prefix=False)
        type(self).calls.append((net, zero_stage, optimizer_parallel_group, cell_type))
        self.net = net
        self.w_gather = pm.ZeroParamWrapper(net.scale, zero_stage, optimizer_parallel_group, cell_type)

    def construct(self, x):
        return x * self.w_gather(self.net.scale)


class _SubScale(zm.Scale):
    pass


class _Holder(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = zm.Scale(3).to_float(ms.float16)
        self.b = _SubScale(3)
        self.c = nn.Dense(3, 3)

    def construct(self, x):
        return self.c(self.b(self.a(x)))


@PYNATIVE
def test_shard_network_calls_replacements_as_mindone(mode):
    _Recorder.calls = []
    ref, net = _Holder(), _Holder()
    _copy_weights(ref, net)
    a, b = net.a, net.b
    net = pm.shard_network(net, special_cases_parallel_module={zm.Scale: _Recorder, nn.Dense: _Recorder})
    # Positional (cell, 3, group); cell_type left to to_float, applied since the new Cell lacked it.
    assert [(c[0], c[1:]) for c in _Recorder.calls] == [(a, (3, None, None)), (b, (3, None, None))]
    assert isinstance(net.a, _Recorder) and isinstance(net.b, _Recorder) and net.a.net is a
    assert net.a.get_flags()["fp16"] and "fp16" not in net.b.get_flags()
    assert isinstance(net.c, pm.Dense)  # the exact-type match wins over a special case
    x = Tensor(np.ones((2, 3), np.float32))
    np.testing.assert_allclose(net(x).asnumpy(), ref(x).asnumpy(), rtol=1e-3)
    with pytest.raises(TypeError, match="'special_cases_parallel_module' must be None or a dict"):
        pm.shard_network(_Holder(), special_cases_parallel_module=[zm.Scale])


class _Pair(nn.Cell):
    """A Scale and a Dense: mapped whole to a MindOne-style class that holds it."""

    def __init__(self):
        super().__init__()
        self.scale = zm.Scale(3)
        self.inner = nn.Dense(3, 3)

    def construct(self, x):
        return self.inner(self.scale(x))


class _PairZero(nn.Cell):
    """Holds its original (``self.net = net``), gathers only the Scale it reads itself, and builds a
    Dense of its own."""

    built = []

    def __init__(self, net, zero_stage=0, optimizer_parallel_group=None, cell_type=None):
        super().__init__(auto_prefix=False)
        type(self).built.append(type(net.inner))
        self.net = net
        self.w_gather = pm.ZeroParamWrapper(net.scale.scale, zero_stage, optimizer_parallel_group, cell_type)
        self.own = nn.Dense(3, 3)

    def construct(self, x):
        return self.net.inner(x * self.w_gather(self.net.scale.scale)) + 0 * self.own(x)


@PYNATIVE
def test_matched_cells_inside_a_replaced_cell_are_replaced_first(mode):
    """The places to replace are read from the network as built: a Dense inside a mapped Cell is
    replaced before the Cell's replacement is built (which holds its original), and a Dense the
    replacement builds is its own (MindOne does not descend into a replacement)."""
    _PairZero.built = []
    ref, net = _Pair(), _Pair()
    _copy_weights(ref, net)
    net = pm.shard_network(nn.SequentialCell([net]), special_cases_parallel_module={_Pair: _PairZero})
    assert _PairZero.built == [pm.Dense]  # built from a Cell whose Dense was replaced already
    assert isinstance(net[0], _PairZero) and isinstance(net[0].net.inner, pm.Dense)
    assert type(net[0].own) is nn.Dense and getattr(net[0].own.weight, "zero_spec", None) is None
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_allclose(net(x).asnumpy(), ref(x).asnumpy(), rtol=1e-6)


def test_shard_network_marks_which_parameters_are_shards():
    """After ``shard_network`` (as after ``prepare_train_network``) ``parallel_optimizer`` says
    whether the parameter holds a shard; the user's opt-out is kept for a later preparation."""
    net = nn.SequentialCell([nn.Dense(4, 4), zm.Scale(4), nn.Dense(4, 2)])
    net[1].scale.parallel_optimizer = False
    net[2].bias.requires_grad = False
    net = pm.shard_network(net)
    flags = {p.name: p.parallel_optimizer for p in net.get_parameters()}
    assert flags == {"0.weight": True, "0.bias": True, "1.scale": False, "2.weight": True, "2.bias": True}
    assert net[1].scale.zero_opt_out is True and net[0].weight.zero_opt_out is False


@PYNATIVE
def test_mindone_style_user_class(mode):
    """``ShiftZero3`` is MindOne's Dense pattern (cuts when ``need_rewrite``); the parameter is cut
    once, by our wrapper, keeps its name, and the network computes the unsharded result. (Over
    N > 1 ranks a second cut would fail: tests/dist/test_zero3_network.py.)"""
    ref, net = zm.build(), zm.build()
    net = pm.shard_network(net, parallel_modules={zm.Shift: zm.ShiftZero3})
    shift = net.blocks[2]
    assert isinstance(shift, zm.ShiftZero3) and not shift.param_wrapper_o.need_rewrite
    assert shift.offset.name == "blocks.2.offset" and shift.offset.zero_spec.split
    ids, img, _ = zm.make_batch(3, 0)
    np.testing.assert_allclose(net(ids, img).asnumpy(), ref(ids, img).asnumpy(), rtol=1e-6, atol=1e-6)
    assert isinstance(zm.ShiftZero3(zm.Shift(2)).param_wrapper_o, nn.Identity)  # stage 0: MindOne's no-op
