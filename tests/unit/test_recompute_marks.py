"""[Note: predicted recompute marks] and [Note: a frozen gather plan]: the marks ``plan_gathers``
predicts are the ones MindSpore makes when ``apply_gathers`` makes them, and planning changes no
Cell. In one process: two ranks are faked for the build (the group size, and a stub for the
communication Cells), so that parameters split and gathers all-gather; nothing runs. That the
marks train as before is checked under msrun (tests/dist/test_zero3_network.py, test_zeropp.py,
test_gather_units.py)."""
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from mindone_zero.core.ms_internals import has_config_recompute, in_recompute_scope, mark_recomputed_child
from mindone_zero.zero3 import gather_group, param_wrapper, shard
from mindone_zero.zero3.carry import spread_recompute_scope
from mindone_zero.zero3.recompute_marks import RecomputeMarks
from mindone_zero.zero3.zeropp import ZeroPPConfig
from parallel_modules import shard_network


class _Leaf(nn.Cell):
    def construct(self, x):
        return x


class _Node(nn.Cell):
    def __init__(self, *children):
        super().__init__()
        for i, child in enumerate(children):
            setattr(self, f"c{i}", child)

    def construct(self, x):
        return x


def _cells(top):
    """The Cells below ``top``, without the wrappers ``recompute()`` adds (MindSpore's, not marked by us)."""
    return [c for path, c in top.cells_and_names() if "_recompute_cell" not in path.split(".")]


def _predict(marks, what, cell):
    """What ``plan_gathers`` records of a mark: the marks kept beside the Cells, none made."""
    if what == "scope":
        marks.spread(cell)
    else:
        marks.recompute(cell)


def _make(what, cell):
    """The mark itself, as ``apply_gathers`` makes it."""
    if what == "scope":
        spread_recompute_scope(cell)
    elif what == "child":
        mark_recomputed_child(cell)
    else:
        cell.recompute(output_recompute=what == "output")


def test_marks_follow_mindspore():
    """Every mark is predicted first, with no Cell changed, and then made, as the plan and its apply
    do: children added after the user's recompute() (as the gathers are) get its scope by spreading;
    a Cell already configured stops a later mark from going below it; a Cell shared by two branches
    is marked once. The prediction equals MindSpore's own marks, Cell for Cell."""
    shared, deep, own = _Leaf(), _Leaf(), _Node(_Leaf())
    a, b = _Node(_Leaf(), _Node(deep), shared, own), _Node(_Leaf(), shared)
    top = _Node(a, b, _Node(_Leaf()))
    b.recompute()  # the user's, before the build
    b.added = _Node(_Leaf())  # added after it, unmarked: spreading marks it
    own.recompute()
    own.late = _Leaf()  # added after it, and not spread: a's mark stops at own, above it
    marks = RecomputeMarks()
    assert not marks.scoped(b.added) and marks.scoped(b.c0) and marks.configured(shared)
    steps = [("scope", top), ("scope", b), ("output", deep), ("whole", a), ("child", top.c2), ("scope", top.c2)]
    before = [(in_recompute_scope(c), has_config_recompute(c)) for c in _cells(top)]
    for what, cell in steps:
        _predict(marks, what, cell)
    predicted = [(marks.scoped(c), marks.configured(c)) for c in _cells(top)]
    assert [(in_recompute_scope(c), has_config_recompute(c)) for c in _cells(top)] == before  # nothing made yet
    assert predicted != before
    cells = _cells(top)
    for what, cell in steps:
        _make(what, cell)
    assert [(in_recompute_scope(c), has_config_recompute(c)) for c in cells] == predicted
    assert marks.scoped(b.added.c0) and marks.scoped(a.c1) and marks.scoped(top.c2.c0)
    assert not marks.scoped(top) and not marks.spread(top) and not marks.scoped(own.late)
    assert deep.get_flags().get("output_recompute")  # marked before a: a's mark stopped above it
    assert not a.c1.get_flags().get("output_recompute")


class _Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(8, 8), nn.Dense(8, 8)
        self.scale = Parameter(Tensor(np.ones(8, np.float32)), name="scale")

    def construct(self, x):
        return self.fc2(self.fc1(x)) * self.scale


class _Head(nn.Cell):
    """Reads its weight through a transpose: recomputed whole with reshard_after_forward."""

    def __init__(self):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones((4, 8), np.float32)), name="weight")

    def construct(self, x):
        return ops.matmul(x, ops.transpose(self.weight, (1, 0)))


class _Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.blocks = nn.CellList([_Block() for _ in range(3)])
        self.blocks[1].recompute()
        self.head = _Head()

    def construct(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class _StubComm(nn.Cell):
    def __init__(self, group=None):
        super().__init__()
        self.group = group or "world"


def _snapshot(network):
    return [(path, type(c), dict(c.get_flags()), c._scope, has_config_recompute(c), [(k, id(v)) for k, v in c._cells.items()])
            for path, c in network.cells_and_names()]


@pytest.mark.parametrize("kwargs", [{"gather_units": None}, {"gather_units": "auto"},
                                    {"zeropp": ZeroPPConfig(quantize_weights=True)}], ids=["per_cell", "units", "qwz"])
@pytest.mark.usefixtures("graph_mode")
def test_plan_changes_nothing_and_predicts_the_marks(monkeypatch, kwargs):
    monkeypatch.setattr(shard, "group_size_and_rank", lambda group=None: (2, 0))
    monkeypatch.setattr(param_wrapper, "group_size_and_rank", lambda group=None: (2, 0))
    monkeypatch.setattr(param_wrapper, "GroupComm", _StubComm)
    monkeypatch.setattr(gather_group, "GroupComm", _StubComm)
    seen = {}
    plan_gathers, apply_gathers = shard.plan_gathers, shard.apply_gathers

    def planning(network, options, build):
        before = _snapshot(network)
        seen["plan"] = plan = plan_gathers(network, options, build)
        assert _snapshot(network) == before  # planning changes no Cell
        seen["network"] = network
        return plan

    def applying(plan, build):
        marks = RecomputeMarks()
        for _, cell in plan.marks:  # each mark is MindSpore's Cell._recompute on the Cell
            marks.recompute(cell)
        cells = _cells(seen["network"])  # the gather Cells still to be built are not among them
        predicted = [(marks.scoped(c), marks.configured(c)) for c in cells]
        shared = apply_gathers(plan, build)
        assert [(in_recompute_scope(c), has_config_recompute(c)) for c in cells] == predicted
        for step in plan.builds:  # built as planned: hpZ and the recompute mark where predicted
            assert getattr(step.caller, "hpz", False) == (step.hpz_group is not None)
            assert (step.mark == "scope") == (in_recompute_scope(step.caller) and step.mark != "collective")
        seen["shared"] = shared
        return shared

    monkeypatch.setattr(shard, "plan_gathers", planning)
    monkeypatch.setattr(shard, "apply_gathers", applying)
    net = shard_network(_Net(), **kwargs)
    plan = seen["plan"]
    # blocks.0 and blocks.2 multiply by a gathered scale (not direct) and hold readers: re-gathered only;
    # blocks.1 is inside the user's region; the head transposes its weight: recomputed whole
    assert [(path, whole) for path, _, _, whole in plan.readers] == [("blocks.0", False), ("blocks.2", False),
                                                                    ("head", True)]
    assert [cell for what, cell in plan.marks if what == "whole"] == [net.head]
    marked = {what for what, _ in plan.marks} | {step.mark for step in plan.builds}
    regathered = "collective" if kwargs.get("gather_units", "auto") is None else "output"
    assert {"whole", regathered, "scope"} <= marked
    assert all(step.hpz_group is None for step in plan.builds) and not plan.zeropp
    assert seen["shared"] > 0  # callers alike share one gather Cell, as planned
