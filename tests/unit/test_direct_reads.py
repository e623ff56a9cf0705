"""[Note: direct reads] (mindone_zero/zero3/direct_reads.py): which code hands its gathered
parameters straight to the consuming op (re-gathering alone frees them) and which transforms them
first (the reader is recomputed whole); the ZeRO-3 layers' own code is direct."""
import ast
import textwrap

import pytest
from mindspore import mint, nn

from mindone_zero.zero3.direct_reads import gather_call_test, indirect_uses, source_indirect_reads, unit_read_test
from parallel_modules import Conv2d, Dense, Embedding, Linear


def _uses(code, attrs=("w_zero_gather", "b_zero_gather", "zero_gather_group")):
    tree = ast.parse(textwrap.dedent(code)).body[0]
    return indirect_uses(tree, gather_call_test("self", attrs))


@pytest.mark.parametrize("code", [
    "def construct(self, x):\n    return self.matmul(x, self.w_zero_gather(self.w, x))",
    "def construct(self, x):\n    w = self.w_zero_gather(self.w, x)\n    return ops.matmul(x, w)",
    "def construct(self, x):\n    w, b = self.zero_gather_group(self.w, self.b)\n    return self.bias_add(self.matmul(x, w), b)",
    "def construct(self, x):\n    w, b = self.zero_gather_group.waiting_for(x, self.w, self.b)\n"
    "    return self.bias_add(self.matmul(x, w), b)",
    "def construct(self, x):\n    return ops.dense(x, weight=self.w_zero_gather(self.w, x))",
    # nn.LayerNorm's own code: the cast is followed to the op that consumes it
    "def construct(self, x):\n    y, _, _ = self.layer_norm(x, self.w_zero_gather(self.w, x).astype(x.dtype),"
    " ops.cast(self.b_zero_gather(self.b, x), x.dtype))\n    return y",
    "def construct(self, ids):\n    return self.gather(self.w_zero_gather(self.w, ids), ids, 0)",
])
def test_direct(code):
    assert _uses(code) == []


@pytest.mark.parametrize("code, expected", [
    ("def construct(self, x):\n    return ops.matmul(x, self.w_zero_gather(self.w, x).T)", "self.w_zero_gather(self.w, x).T"),
    ("def construct(self, x):\n    w = self.w_zero_gather(self.w, x)\n    return ops.matmul(x, ops.transpose(w, (1, 0)))",
     "ops.transpose(w, (1, 0))"),
    ("def construct(self, x):\n    w = self.w_zero_gather(self.w, x)\n    return ops.matmul(x, w * 2)", "w * 2"),
    ("def construct(self, x):\n    q, k = ops.split(self.w_zero_gather(self.w, x), 2)\n    return q", "ops.split("),
    ("def construct(self, x):\n    return self.w_zero_gather(self.w, x)", "return self.w_zero_gather(self.w, x)"),
    ("def construct(self, x):\n    w = self.w_zero_gather(self.w, x).reshape(4, -1)\n    return ops.matmul(x, w)",
     "self.w_zero_gather(self.w, x).reshape"),
    ("def construct(self, x):\n    w = self.zero_gather_group(self.w, self.b)\n    return ops.matmul(x, w[0])", "w[0]"),
    ("def construct(self, x):\n    w = self.zero_gather_group.waiting_for(x, self.w, self.b)\n    return ops.matmul(x, w[0])",
     "w[0]"),
])
def test_indirect(code, expected):
    found = _uses(code)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_unit_tuple_passed_on_or_subscripted_is_direct_anything_else_is_not():
    tree = ast.parse(textwrap.dedent("""
        def construct(self, x, *, zero3_unit):
            h = self.norm(x, zero3_unit=zero3_unit)
            h = self.mm(h, zero3_unit[0])
            return h + zero3_unit[1].T, len(zero3_unit)
    """)).body[0]
    assert indirect_uses(tree, unit_read_test) == ["zero3_unit[1].T", "len(zero3_unit)"]


class _MindOneStyle(nn.Cell):
    """A user's ZeRO-3 class in MindOne's style: it calls the gather wrapper itself."""

    def __init__(self, direct):
        super().__init__()
        self.direct = direct
        self.param_wrapper_w = nn.Identity()

    def construct(self, x):
        if self.direct:
            return ops_matmul(x, self.param_wrapper_w(x))
        return ops_matmul(x, self.param_wrapper_w(x).T)


def ops_matmul(a, b):
    return a @ b


def test_source_of_a_foreign_cell():
    # both branches are in one construct: the syntax check finds the indirect one whatever runs
    found = source_indirect_reads(_MindOneStyle(True), ["param_wrapper_w"])
    assert found == ["self.param_wrapper_w(x).T"]
    missing = source_indirect_reads(_MindOneStyle(True), ["param_wrapper_w", "param_wrapper_b"])
    assert missing and "does not itself call ['param_wrapper_b']" in missing[0]


@pytest.mark.parametrize("layer", [
    lambda: Dense(nn.Dense(4, 6), 3), lambda: Dense(nn.Dense(4, 6, has_bias=False), 3),
    lambda: Linear(mint.nn.Linear(4, 6), 3), lambda: Embedding(nn.Embedding(8, 4), 3),
    lambda: Embedding(mint.nn.Embedding(8, 4), 3), lambda: Conv2d(nn.Conv2d(2, 4, 3, has_bias=True), 3),
    lambda: Conv2d(mint.nn.Conv2d(2, 4, 3), 3),
])
def test_the_zero3_layers_read_directly(layer):
    assert layer().zero3_indirect_reads_of_code() == []


@pytest.mark.parametrize("layer", [lambda: Dense(nn.Dense(4, 6), 3), lambda: Linear(mint.nn.Linear(4, 6), 3)])
def test_the_zero3_layers_call_their_coalesced_group_directly(layer):
    """With N >= 2 these layers gather through ``self.zero_gather_group.waiting_for(x, ...)``
    ([Note: gather order]); the source check sees that call as the group's."""
    assert source_indirect_reads(layer(), ["zero_gather_group"]) == []
