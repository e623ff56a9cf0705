"""[Note: gather Cells built once] and [Note: shared gather graphs] in one process: which ZeRO-3
gather callers a ``GatherBuild`` gives one gather Cell, what it builds and how it marks it. Two ranks
are faked (the group size, and a stub for the collectives), so that the parameters split and their
gathers all-gather. That shared gathers train bit for bit as separate ones is checked under msrun
(tests/dist/test_gather_units.py), and that ``shard_network`` builds what it built before, gather
for gather, by tests/dist/test_zero3_network.py and test_zeropp.py."""
import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor, nn

from mindone_zero.core.ms_internals import in_recompute_scope
from mindone_zero.zero3 import gather_group, param_wrapper
from mindone_zero.zero3.coalesce import CoalescedPlan, ZeroGatherGroup
from mindone_zero.zero3.gather_build import GatherBuild
from mindone_zero.zero3.param_wrapper import (ParamGather, ZeroParamWrapper, cut_parameter, param_gather,
                                              zero_param_of)
from mindone_zero.zero3.zeropp import ZeroPPConfig


class _StubComm(nn.Cell):
    """Stands in for GroupComm (one process, no communication): the group name is all a key reads."""

    def __init__(self, group=None):
        super().__init__()
        self.group = group or "world"


@pytest.fixture
def built(monkeypatch):
    """Two ranks faked; returns the list every gather Cell built is appended to."""
    monkeypatch.setattr(param_wrapper, "group_size_and_rank", lambda group=None: (2, 0))
    monkeypatch.setattr(param_wrapper, "GroupComm", _StubComm)  # hpZ's secondary group
    monkeypatch.setattr(gather_group, "GroupComm", _StubComm)
    cells = []
    for plan_class in (ParamGather, CoalescedPlan):
        def counting(plan, build=plan_class.build):
            cells.append(build(plan))
            return cells[-1]
        monkeypatch.setattr(plan_class, "build", counting)
    return cells


def _param(name, shape, build, zeropp=None):
    param = Parameter(Tensor(np.ones(shape, np.float32)), name=name)
    cut_parameter(param, None, False, zeropp, build)
    return param


def _group(name, shape, build):
    params = [_param(name + ".weight", shape, build), _param(name + ".bias", shape[:1], build)]
    return ZeroGatherGroup([param_gather(p, None, None) for p in params], build=build), params


GROUPS, WRAPPERS = "abcde", "fghijklm"


class _Readers(nn.Cell):
    """Coalesced groups: a, b alike; c another shape; d, e alike to a but recomputed with themselves.
    Wrappers: f, g alike; h another shape; i alike but with hpZ in a recomputed region; j a
    parameter kept whole (no all-gather: built at once); k, l alike to f but with the collective
    marked for backward; m alike to f but its parameter was sharded outside the build (built at
    once)."""

    def __init__(self, build):
        super().__init__()
        self.params = []
        for name, shape in (("a", (6, 4)), ("b", (6, 4)), ("c", (8, 4)), ("d", (6, 4)), ("e", (6, 4))):
            group, params = _group(name, shape, build)
            setattr(self, name, group)
            self.params += params
        self.d.recompute(output_recompute=True)
        self.e.recompute(output_recompute=True)
        hpz = ZeroPPConfig(hpz_group="hpz_0")
        for name, shape, zeropp in (("f", (4, 2), None), ("g", (4, 2), None), ("h", (6, 2), None),
                                    ("i", (4, 2), hpz), ("k", (4, 2), None), ("l", (4, 2), None)):
            param = _param(name, shape, build, zeropp)
            setattr(self, name, ZeroParamWrapper(param))
            self.params.append(param)
        self.j = ZeroParamWrapper(_param("j", (3, 2), build))  # dim 0 does not divide by 2: kept whole
        self.m = ZeroParamWrapper(_param("m", (4, 2), None))
        self.i.recompute(output_recompute=True)
        self.regathered = frozenset({id(self.k), id(self.l)})  # their collectives marked for backward

    def callers(self):
        return [getattr(self, name) for name in GROUPS + WRAPPERS]


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_callers_alike_share_one_gather_built_once(built, mode):
    """In GRAPH_MODE b shares a's gather, e shares d's (marked alike), g shares f's and l shares k's;
    c (another shape), d (marked, a is not), h (another shape), i (hpZ), j (no all-gather), k (its
    collective marked, f's is not) and m (built at once, outside the build) keep their own. Every
    Cell built is called, and each caller keeps its own parameter names. PYNATIVE_MODE shares
    nothing."""
    old = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        build = GatherBuild()
        net = _Readers(build)
        assert [id(c) for c in built] == [id(net.j.gather), id(net.m.gather)]  # at once; the others wait
        assert [build.defers(c) for c in net.callers()] == [c not in (net.j, net.m) for c in net.callers()]
        shared = build.apply(build.plan(net.callers(), mode == ms.GRAPH_MODE, regathered=net.regathered))
        build.close(net.params)
    finally:
        ms.set_context(mode=old)
    gathers = {name: getattr(net, name).gather for name in GROUPS + WRAPPERS}
    assert len({id(g) for g in gathers.values()}) == len(built)  # nothing built and left idle
    assert all(zero_param_of(p).build is None for p in net.params)
    if mode == ms.PYNATIVE_MODE:
        assert shared == 0 and len(built) == 13
        return
    assert shared == 4 and len(built) == 9
    alike = {"b": "a", "e": "d", "g": "f", "l": "k"}
    for name, gather in gathers.items():
        first = alike.get(name, name)
        assert all((gather is gathers[other]) == (alike.get(other, other) == first) for other in gathers), name
    assert [net.b.param_names, net.e.param_names] == [("b.weight", "b.bias"), ("e.weight", "e.bias")]
    assert [net.f.param_name, net.g.param_name, net.l.param_name] == ["f", "g", "l"]
    assert not net.j.gather.gathers and not net.j.is_split
    assert net.l.gather_record.members == ("l",)
    # marks: the collective of k (and l), re-run in backward; d's gather recomputed with d
    assert net.k.gather.get_flags().get("output_recompute") and in_recompute_scope(net.k.gather.waiting)
    assert not in_recompute_scope(net.f.gather)
    assert in_recompute_scope(net.d.gather) and not net.d.gather.get_flags().get("output_recompute")
    # hpZ: built with its gather, in the recomputed region
    assert net.i.hpz and net.i.hpz_primary.base is net.i.gather and net.i.gather_record.hpz_size == 2
    assert in_recompute_scope(net.i.hpz_primary) and not net.f.hpz
