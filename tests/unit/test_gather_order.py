"""Review item 2f / Build 4: each stage-3 gather of a ``parallel_modules`` layer waits for the
layer's input ([Note: gather order] in mindone_zero/zero3/param_wrapper.py), and so does each gather
the generic rewrite puts in a ``construct``.

Evidence from the compiled graph (one process, GRAPH_MODE, ``save_graphs``): in the final IR
(``graph_build_*.ir``) every
``<attr>_zero_gather-ZeroParamWrapper/gather-GatherGroup/waiting-_GroupWaiting/Depend`` node (the tie
sits in the Cell with the custom bprop, so autodiff builds no gradient graph for it) takes the
shard's Load and the layer's input, e.g. for a Dense after a Tanh:

    %0 = PrimFunc_Tanh(%para1_x)
    %1 = Load(%para2_layer.weight, UMonad[U])   # weight_zero_gather-ZeroParamWrapper/.../Load
    %2 = Depend(%1, %0)                         # .../gather-GatherGroup/waiting-_GroupWaiting/Depend
    %3 = PrimFunc_MatMul(%0, %2, ...)

With N >= 2 the all-gather takes %2 as its input, so it cannot start before the Tanh. (A group of
one gathers nothing, so here the Depend feeds the MatMul directly.) At N=2 the all-gathers
themselves are checked, coalesced groups and gather units included, by
tests/dist/test_gather_units.py::test_every_gather_waits_for_the_layer_input_at_n2. The numbers
are unchanged: the parity tests of tests/dist, bitwise ones included, run with the dependency in
place, and the last test here checks the gradients for every kind of ``after``.
"""
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from mindone_zero.zero3.param_wrapper import ZeroParamWrapper
from parallel_modules import Conv2d, Dense, Embedding, shard_network

ms.set_device("CPU")

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")
TIE_SCOPE = "ZeroParamWrapper/gather-GatherGroup/waiting-_GroupWaiting/Depend"
KEEP_ALIVE = []


class _After(nn.Cell):
    """``layer(marker(x))``: the marker op's node is the layer's input in the IR."""

    def __init__(self, layer, marker):
        super().__init__()
        self.layer, self.marker = layer, marker

    def construct(self, x):
        return self.layer(self.marker(x))


CASES = {
    "dense": (lambda: Dense(nn.Dense(4, 6), zero_stage=3), ops.Tanh(), np.ones((2, 4), np.float32), "Tanh",
              ("weight", "bias")),
    "conv2d": (lambda: Conv2d(nn.Conv2d(1, 3, 3, has_bias=True), zero_stage=3), ops.Tanh(),
               np.ones((1, 1, 5, 5), np.float32), "Tanh", ("weight", "bias")),
    "embedding": (lambda: Embedding(nn.Embedding(11, 6), zero_stage=3), ops.Abs(), np.ones((2, 3), np.int32), "Abs",
                  ("embedding_table",)),
    # the generic rewrite ([Note: generic rewrite]): construct's first input
    "layernorm_rewrite": (lambda: shard_network(nn.LayerNorm((6,))), ops.Tanh(), np.ones((2, 6), np.float32), "Tanh",
                          ("gamma", "beta")),
}


def _final_ir(path) -> str:
    (ir,) = sorted(path.glob("graph_build_*.ir"))
    return ir.read_text()


def _depend_inputs(ir: str, attr: str):
    """(first, second) operand names of the Depend in ``<attr>_zero_gather``'s scope."""
    lines = ir.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*%\d+\(\S+\) = Depend\((%\d+), (%\d+)\)", line)
        if m and any(f"/{attr}_zero_gather-{TIE_SCOPE}" in t for t in lines[i + 1:i + 4]):
            return m.group(1), m.group(2)
    raise AssertionError(f"no Depend in {attr}_zero_gather's scope")


def _definition(ir: str, node: str) -> str:
    m = re.search(rf"^\s*{node}\(\S+\) = (\S+?)\(", ir, re.M)
    assert m, node
    return m.group(1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_gather_depends_on_the_layer_input(case, tmp_path):
    build, marker, x, marker_name, attrs = CASES[case]
    ms.set_context(mode=ms.GRAPH_MODE, save_graphs=True, save_graphs_path=str(tmp_path))
    try:
        net = _After(build(), marker)
        KEEP_ALIVE.append(net)
        net(Tensor(x))
    finally:
        ms.set_context(save_graphs=False)
    ir = _final_ir(tmp_path)
    for attr in attrs:
        shard, after = _depend_inputs(ir, attr)
        assert _definition(ir, shard) == "Load", (attr, shard)
        assert _definition(ir, after) == f"PrimFunc_{marker_name}", (attr, after)


def test_without_after_there_is_no_dependency(tmp_path):
    """The check above can fail: a wrapper called without ``after`` has no Depend in its scope."""
    layer = Dense(nn.Dense(4, 6), zero_stage=3)

    class Plain(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def construct(self, x):
            return ops.matmul(ops.tanh(x), self.layer.weight_zero_gather(self.layer.weight).T)

    ms.set_context(mode=ms.GRAPH_MODE, save_graphs=True, save_graphs_path=str(tmp_path))
    try:
        net = Plain()
        KEEP_ALIVE.append(net)
        net(Tensor(np.ones((2, 4), np.float32)))
    finally:
        ms.set_context(save_graphs=False)
    with pytest.raises(AssertionError, match="no Depend"):
        _depend_inputs(_final_ir(tmp_path), "weight")


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
@pytest.mark.parametrize("kind", ["tensor", "none", "tuple", "list", "number"])
def test_any_construct_input_can_be_after_and_the_gradients_are_unchanged(mode, kind):
    """The rewrite passes a ``construct``'s first input as ``after``, whatever it is; its gradient
    is zeros (``after_grad``), so x's gradient is the wrapper's full tensor and the weight's is x."""
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), name="w")
            self.w_zero_gather = ZeroParamWrapper(self.w, zero_stage=3)

        def construct(self, x):
            after = {"tensor": x, "none": None, "tuple": (x, 1), "list": [x], "number": 3}[kind]
            return (self.w_zero_gather(self.w, after) * x).sum()

    ms.set_context(mode=mode)
    try:
        net = Net()
        KEEP_ALIVE.append(net)
        x = Tensor(np.full((2, 3), 2.0, np.float32))
        (dx,), (dw,) = ops.GradOperation(get_all=True, get_by_list=True)(net, net.trainable_params())(x)
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    np.testing.assert_array_equal(dx.asnumpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(dw.asnumpy(), np.full((2, 3), 2.0, np.float32))
