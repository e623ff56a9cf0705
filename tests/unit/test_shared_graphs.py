"""[Note: shared gather graphs] in one process: which ZeRO-3 gather callers share one gather Cell.
That shared gathers train bit for bit as separate ones is checked under msrun
(tests/dist/test_gather_units.py)."""
from types import SimpleNamespace

import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor, nn

from mindone_zero.core.comm_records import GatherRecord
from mindone_zero.core.partition import ShardSpec
from mindone_zero.zero3 import coalesce
from mindone_zero.zero3.coalesce import ZeroGatherGroup
from mindone_zero.zero3.param_wrapper import ZeroParamWrapper
from mindone_zero.zero3.shared_graphs import share_gather_graphs


class _StubComm(nn.Cell):
    """Stands in for GroupComm (one process, no communication): the group name is all the key reads."""

    def __init__(self, group=None):
        super().__init__()
        self.group = group or "world"


class _StubGather(nn.Cell):
    """Stands in for a wrapper's ``_GatherShard``: its graph key and whether it all-gathers."""

    def __init__(self, key, gathers=True):
        super().__init__()
        self.key, self.gathers = key, gathers

    def graph_key(self):
        return self.key


def _gather(name, shape, dtype=ms.float32):
    spec = ShardSpec(name, shape, 2, 0, True)
    record = GatherRecord("param", "world", 2, (name,), (spec.padded_shape,), (spec.shard_shape,), dtype, dtype)
    return SimpleNamespace(param_name=name, spec=spec, full_rows=shape[0], pad=spec.pad, group_name=None,
                           group_size=2, param_dtype=dtype, compute_dtype=dtype, cast_before_gather=False,
                           cast_after_gather=False, record=record)


def _wrapper(name, key, gathers=True, hpz=False):
    wrapper = ZeroParamWrapper(Parameter(Tensor(np.ones((4, 2), np.float32)), name=name))
    wrapper.gather = _StubGather(key, gathers)
    wrapper.hpz = hpz
    return wrapper


GROUPS, WRAPPERS = "abcde", "fghij"


class _Readers(nn.Cell):
    """Coalesced groups: a, b alike; c another shape; d, e alike to a but marked for recomputation.
    Wrappers: f, g alike; h another key; i alike but with hpZ; j alike but not gathering."""

    def __init__(self):
        super().__init__()
        for name, shape in (("a", (6, 4)), ("b", (6, 4)), ("c", (8, 4)), ("d", (6, 4)), ("e", (6, 4))):
            setattr(self, name, ZeroGatherGroup([_gather(name + ".weight", shape), _gather(name + ".bias", shape[:1])]))
        self.d.recompute(output_recompute=True)
        self.e.recompute(output_recompute=True)
        self.f, self.g, self.h = _wrapper("f", "k1"), _wrapper("g", "k1"), _wrapper("h", "k2")
        self.i, self.j = _wrapper("i", "k1", hpz=True), _wrapper("j", "k1", gathers=False)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_callers_alike_share_one_gather_in_graph_mode(monkeypatch, mode):
    """In GRAPH_MODE b shares a's gather, e shares d's (marked alike) and g shares f's; c (another
    shape), d (marked, a is not), h (another key), i (hpZ) and j (no all-gather) keep their own;
    each caller keeps its own parameter names. PYNATIVE_MODE shares nothing."""
    monkeypatch.setattr(coalesce, "GroupComm", _StubComm)
    old = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        net = _Readers()
        own = {name: getattr(net, name).gather for name in GROUPS + WRAPPERS}
        shared = share_gather_graphs(net)
    finally:
        ms.set_context(mode=old)
    after = {name: getattr(net, name).gather for name in GROUPS + WRAPPERS}
    assert len({id(g) for g in own.values()}) == 10
    if mode == ms.PYNATIVE_MODE:
        assert shared == 0 and after == own
        return
    assert shared == 3
    assert after == dict(own, b=own["a"], e=own["d"], g=own["f"])
    assert [net.b.param_names, net.e.param_names] == [("b.weight", "b.bias"), ("e.weight", "e.bias")]
    assert [net.f.param_name, net.g.param_name] == ["f", "g"]
