"""[Note: coalesced gathers] in one process: which wrappers coalesce. The buffer layout is tested in
test_packing.py ([Note: packed layout])."""
from types import SimpleNamespace

import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor, nn

from mindone_zero.core.partition import ShardSpec
from mindone_zero.zero3 import coalesce
from mindone_zero.zero3.coalesce import COALESCE_MAX_BYTES, ZeroGatherGroup, build_gather_group, share_gather_graphs
from mindone_zero.zero3.param_wrapper import ZeroParamWrapper, zeropp_scope
from mindone_zero.zero3.zeropp import ZeroPPConfig


def _wrapper(name="w", shape=(6, 4), gathers=True, dtype=ms.float32, zeropp=None, hpz=False):
    spec = ShardSpec(name, shape, 2, 0, True)
    gather = SimpleNamespace(gathers=gathers, zeropp=zeropp, spec=spec, param_dtype=dtype, compute_dtype=dtype,
                             cast_before_gather=False, group_name=None, group_size=2)
    return SimpleNamespace(gather=gather, hpz=hpz)


@pytest.mark.parametrize("wrappers", [
    [],
    [_wrapper()],  # a single parameter keeps the per-parameter path (no concat, no split)
    [_wrapper(), _wrapper("b", gathers=False)],
    [_wrapper(), _wrapper("b", zeropp=object())],
    [_wrapper(), _wrapper("b", hpz=True)],
    [_wrapper(), _wrapper("b", dtype=ms.float16)],
    [_wrapper(), _wrapper("big", shape=(COALESCE_MAX_BYTES // 4 + 2, 1))],
])
def test_wrappers_that_cannot_share_a_collective_are_not_coalesced(wrappers):
    assert build_gather_group(wrappers) is None


def test_wrappers_built_in_zeropp_scope_carry_the_options_from_the_start():
    """[Note: ZeRO++ at build]: the gather is built with the options (so no group is built to be
    switched off); outside the scope, and after it, wrappers have none."""
    config = ZeroPPConfig(quantize_weights=True)
    with zeropp_scope(config):
        inside = ZeroParamWrapper(Parameter(Tensor(np.ones((4, 2), np.float32)), name="inside"))
    after = ZeroParamWrapper(Parameter(Tensor(np.ones((4, 2), np.float32)), name="after"))
    assert inside.gather.zeropp is config
    assert after.gather.zeropp is None


class _StubComm(nn.Cell):
    """Stands in for GroupComm (one process, no communication): the group name is all the key reads."""

    def __init__(self, group=None):
        super().__init__()
        self.group = group or "world"


def _gather(name, shape, dtype=ms.float32):
    spec = ShardSpec(name, shape, 2, 0, True)
    return SimpleNamespace(param_name=name, spec=spec, full_rows=shape[0], pad=spec.pad, group_name=None,
                           group_size=2, param_dtype=dtype, compute_dtype=dtype, cast_before_gather=False,
                           cast_after_gather=False)


class _Readers(nn.Cell):
    """Five coalesced groups: a, b alike; c another shape; d, e alike to a but marked for recomputation."""

    def __init__(self):
        super().__init__()
        for name, shape in (("a", (6, 4)), ("b", (6, 4)), ("c", (8, 4)), ("d", (6, 4)), ("e", (6, 4))):
            setattr(self, name, ZeroGatherGroup([_gather(name + ".weight", shape), _gather(name + ".bias", shape[:1])]))
        self.d.recompute(output_recompute=True)
        self.e.recompute(output_recompute=True)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_identical_groups_marked_alike_share_one_gather_in_graph_mode(monkeypatch, mode):
    """[Note: shared gather graphs]: in GRAPH_MODE a, b share a's gather and e shares d's (marked
    alike); c (another shape) and d (marked, a is not) keep their own; each group keeps its own
    parameter names. PYNATIVE_MODE shares nothing."""
    monkeypatch.setattr(coalesce, "GroupComm", _StubComm)
    old = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        net = _Readers()
        own = {name: getattr(net, name).gather for name in "abcde"}
        shared = share_gather_graphs(net)
    finally:
        ms.set_context(mode=old)
    after = {name: getattr(net, name).gather for name in "abcde"}
    if mode == ms.PYNATIVE_MODE:
        assert shared == 0 and after == own
        return
    assert shared == 2
    assert after == dict(own, b=own["a"], e=own["d"])
    assert len({id(g) for g in own.values()}) == 5
    assert [net.b.param_names, net.e.param_names] == [("b.weight", "b.bias"), ("e.weight", "e.bias")]
