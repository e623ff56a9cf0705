"""What ``shard_network`` makes lives as long as the network, and no module keeps state that grows.

The generic rewrite ([Note: generic rewrite] in mindone_zero/zero3/rewrite.py) generates methods,
dynamic classes and source files; the backward-read analysis parses methods. None of it may be
kept by a module: after networks are sharded, run in GRAPH_MODE and dropped, every module-level
container of the package has the size it had, the networks, their classes and the generated code
are collected, and their source folders are gone. A network built after one is freed, whose Cells
and generated functions take the freed ones' ids (MindSpore 2.10 keys what it parsed by id),
computes with its own code and values. ``PARALLEL_MODULES`` cannot change.
"""
import gc
import os
import sys
import weakref

import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

import parallel_modules as pm
from mindone_zero import PARALLEL_MODULES, prepare_network
from mindone_zero.zero3 import param_wrapper
from mindone_zero.zero3.state import gather_calls

ms.set_device("CPU")


def _module_containers() -> dict:
    """{module.name: size} of every module-level container and cache of the package."""
    sizes = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.split(".")[0] in ("mindone_zero", "parallel_modules"):
            continue
        for name, value in list(vars(mod).items()):
            if hasattr(value, "cache_info"):
                sizes[f"{mod_name}.{name}"] = value.cache_info().currsize
            elif isinstance(value, (dict, list, set)) and not name.startswith("__"):
                sizes[f"{mod_name}.{name}"] = len(value)
    return sizes


def _make_classes():
    """Fresh classes (new function objects, as a script that defines its model in a function has)."""

    class Inner(nn.Cell):
        def __init__(self, v, whole_shift=False):
            super().__init__()
            self.scale = Parameter(Tensor(np.full((4,), v, np.float32)), name="scale")
            self.shift = Parameter(Tensor(np.full((4,), 10 * v, np.float32)), name="shift")
            if whole_shift:
                self.shift.parallel_optimizer = False  # then _mix is not rewritten
            self.mul, self.add = ops.Mul(), ops.Add()  # direct reads: not recomputed whole in GRAPH_MODE

        def _mix(self, x):
            return self.add(x, self.shift)

        def construct(self, x):
            return self._mix(self.mul(x, self.scale))

    class Net(nn.Cell):
        def __init__(self, v, whole_shift=False):
            super().__init__()
            self.inner = Inner(v, whole_shift)
            self.proj = nn.Dense(4, 4, weight_init="ones", bias_init="zeros")
            self.bias = Parameter(Tensor(np.full((4,), 100 * v, np.float32)), name="bias")

        def construct(self, x):
            return self.proj(self.inner(x)) - self.bias

    return Net


def _expected(v):
    return 4 * (v + 10 * v) - 100 * v  # proj sums the 4 features (ones, no bias)


def _generated(net) -> list:
    """The rewritten Cells of ``net`` and the functions generated for them."""
    out = []
    for _, cell in net.cells_and_names():
        cls = type(cell)
        if "zero3_original_class" in cls.__dict__:
            out.append(cell)
            out += [f for k, f in cls.__dict__.items() if callable(f) and k in ("construct", "_mix")]
    return out


def _shard_and_run(v, whole_shift=False):
    net = pm.shard_network(_make_classes()(float(v), whole_shift))
    out = net(Tensor(np.ones((2, 4), np.float32))).asnumpy()
    np.testing.assert_allclose(out, _expected(v), rtol=1e-6)
    return net


def test_sharded_networks_leave_no_module_state_and_are_collected(graph_mode, data_parallel):
    _shard_and_run(1)  # imports and first-use state settle here; the network is dropped at once
    gc.collect()
    before = _module_containers()
    refs, folders = [], set()
    for v in (2, 3, 4):
        net = prepare_network(_make_classes()(float(v)), zero_stage=3) if v == 4 else _shard_and_run(v)
        net(Tensor(np.ones((2, 4), np.float32)))
        funcs = [f for f in _generated(net) if not isinstance(f, nn.Cell)]
        mine = {os.path.dirname(f.__code__.co_filename) for f in funcs}
        assert funcs and all(os.path.isdir(f) for f in mine)  # the generated source, there while the network is
        folders |= mine
        refs += [weakref.ref(o) for o in [net, type(net), type(net).zero3_original_class] + _generated(net)]
        del net, funcs
    gc.collect()
    after = _module_containers()
    grew = {k: (before.get(k), n) for k, n in after.items() if n != before.get(k)}
    assert not grew, f"module-level state changed size with the networks (before, after): {grew}"
    alive = [r() for r in refs if r() is not None]
    assert not alive, f"kept after the networks were dropped: {alive}"
    assert not [f for f in folders if os.path.exists(f)], "source folders outlived their networks"


def test_the_backward_read_analysis_keeps_nothing(monkeypatch, graph_mode):
    """Cut for 2 ranks (nothing runs), so that every gather is marked and its readers' code is parsed
    ([Note: dropped re-gathers]); the parses belong to one walk."""
    monkeypatch.setattr(param_wrapper, "group_size_and_rank", lambda group: (2, 0))
    gather_calls(pm.shard_network(_make_classes()(1.0)))
    gc.collect()
    before, refs = _module_containers(), []
    for v in (2, 3):
        net = pm.shard_network(_make_classes()(float(v)))
        calls = gather_calls(net)
        assert any(c.marked for c in calls) and any(c.records[0].regather for c in calls)
        refs += [weakref.ref(type(net).zero3_original_class), weakref.ref(net)]
        del net, calls
    gc.collect()
    after = _module_containers()
    assert after == before, {k: (before.get(k), n) for k, n in after.items() if n != before.get(k)}
    assert not [r() for r in refs if r() is not None]


def test_a_network_that_takes_a_freed_networks_ids_runs_its_own_code(graph_mode):
    seen_cells, seen_funcs, reused = set(), set(), 0
    for v in range(1, 17):
        net = _shard_and_run(v, whole_shift=v % 3 == 0)  # alternates the generated code of Inner
        cells = {id(c) for c in _generated(net) if isinstance(c, nn.Cell)}
        funcs = {id(f) for f in _generated(net) if not isinstance(f, nn.Cell)}
        reused += bool(cells & seen_cells) and bool(funcs & seen_funcs)
        seen_cells |= cells
        seen_funcs |= funcs
        del net
        gc.collect()
        if reused >= 2:
            break
    assert reused, "no network took a freed one's ids: the check above checked nothing"


def test_parallel_modules_cannot_change_and_extends_per_call():
    before = dict(PARALLEL_MODULES)
    with pytest.raises(TypeError, match="'parallel_modules'"):
        PARALLEL_MODULES[nn.LayerNorm] = pm.Dense
    with pytest.raises(TypeError, match="'parallel_modules'"):
        del PARALLEL_MODULES[nn.Dense]
    assert dict(PARALLEL_MODULES) == before and PARALLEL_MODULES.copy() == before
    own = PARALLEL_MODULES.copy()
    own[nn.Dense] = pm.Linear  # a copy is a dict of one's own
    assert PARALLEL_MODULES[nn.Dense] is pm.Dense
    net = pm.shard_network(nn.SequentialCell([nn.Dense(4, 4)]), parallel_modules=PARALLEL_MODULES)
    assert type(net[0]) is pm.Dense  # MindOne passes PARALLEL_MODULES itself
