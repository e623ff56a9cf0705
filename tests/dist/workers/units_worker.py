"""msrun worker: ZeRO-3 gather units ([Note: gather units] in mindone_zero/zero3/units.py) against the
same training without units, per rank.

Each case trains one network twice with ``prepare_train_network`` at stage 3 (2 micro-steps per
optimizer step, gradient clipping, Adam): without ``gather_units`` and with them, from the same
weights on the same batches, and writes ``<case>_rank<r>.json``: the losses at every micro-step of
both runs, whether this rank's parameter shards are bit-identical after every step, and both
``CommPlan``s (entries, and the unit gathers' buffer bytes) for the collective counts. A case with
``"units": []`` trains without units both times: first with every coalesced group calling its own
gather Cell and each wrapper its own (``gather_build.share_key`` turned off), then as ``shard_network``
builds it, identical ones sharing one ([Note: shared gather graphs] in
mindone_zero/zero3/gather_build.py); its report adds the count of groups and wrappers and of the
distinct gather Cells they call, for each run.

The case ``{"kind": "gather_order"}`` trains nothing: it runs, in GRAPH_MODE with ``save_graphs``, a
Tanh and then a stage-3 ``parallel_modules.Dense`` (its coalesced group), a LayerNorm sharded by the
generic rewrite (its wrappers) and a gather unit of two Dense layers (and, as the control, a wrapper called without ``after``), and reports, for every
AllGather of each compiled graph, the op that defines its input and, when that is a Depend, the op
that defines the Depend's second operand ([Note: gather order] in mindone_zero/zero3/param_wrapper.py).

Usage (from tests/dist/test_gather_units.py): ``msrun ... units_worker.py --out DIR --cases JSON``
"""
import argparse
import glob
import json
import os
import re
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from mindone_zero import prepare_train_network  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.core.comm_plan import PlanContext  # noqa: E402
from mindone_zero.train.comm_accounting import step_plan  # noqa: E402
from mindone_zero.zero3 import gather_build  # noqa: E402
from mindone_zero.zero3.coalesce import ZeroGatherGroup  # noqa: E402
from mindone_zero.zero3.gather_group import GatherGroup  # noqa: E402
from mindone_zero.zero3.gather_kinds import gathers_split  # noqa: E402
from mindone_zero.zero3.state import options_of, unit_gathers  # noqa: E402
from parallel_modules import Dense, shard_network  # noqa: E402
from tools.lm_model import Block, LMLoss, TransformerLM, build_lm, init_lm_weights, reversal_batch  # noqa: E402

LM = {"vocab_size": 32, "d_model": 64, "n_layers": 1, "d_ff": 128, "max_len": 16, "n_heads": 4}
ACCUM, MICRO = 2, 2


class MLP(nn.Cell):
    """A Dense-holding Cell (the unit of the Dense stack): uneven shapes, a LayerNorm between."""

    def __init__(self, d_in, d_hidden, d_out, fp16):
        super().__init__()
        self.fc1 = nn.Dense(d_in, d_hidden)
        self.norm = nn.LayerNorm((d_hidden,))
        self.fc2 = nn.Dense(d_hidden, d_out)
        if fp16:  # the Dense layers compute in float16, the LayerNorm in float32: two gather settings
            self.fc1.to_float(ms.float16)
            self.fc2.to_float(ms.float16)

    def construct(self, x):
        return self.fc2(self.norm(self.fc1(x).astype(ms.float32))).astype(ms.float32)


class DenseStack(nn.Cell):
    def __init__(self, fp16):
        super().__init__()
        self.a = MLP(12, 7, 9, fp16)
        self.b = MLP(9, 15, 5, fp16)
        self.head = nn.Dense(5, 3)

    def construct(self, x, y):
        return ((self.head(self.b(self.a(x))) - y) ** 2).mean()


class Wide(nn.Cell):
    """A unit with one weight over 1 MiB (gathered alone) and small parameters (coalesced)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(520, 520)
        self.norm = nn.LayerNorm((520,))

    def construct(self, x, y):
        return ((self.norm(self.fc(x)) - y) ** 2).mean()


class WideLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.wide = Wide()

    def construct(self, x, y):
        return self.wide(x, y)


def _init(net, seed):
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.4).astype(np.float32), p.dtype))
    return net


def _build(case):
    if case["model"] == "lm":  # one block unless the case says "layers"
        return LMLoss(init_lm_weights(build_lm(dict(LM, n_layers=case.get("layers", 1))), 0))
    if case["model"] == "wide":
        return _init(WideLoss(), 0)
    return _init(DenseStack(case.get("fp16", False)), 0)


def _units(case):
    """The case's unit classes; "auto" for the library's default (the argument left out)."""
    if case["units"] == "auto":
        return "auto"
    names = {"Block": Block, "TransformerLM": TransformerLM, "MLP": MLP, "Wide": Wide}
    return tuple(names[n] for n in case["units"])


def _batches(case, step, rank, world):
    """This rank's micro-batches of optimizer step ``step``."""
    chunks = world * ACCUM
    if case["model"] == "lm":
        arrays = reversal_batch(1, step, MICRO * chunks, 8, LM["vocab_size"])
    elif case["model"] == "wide":
        rng = np.random.default_rng([4, step])
        arrays = (rng.standard_normal((MICRO * chunks, 520)).astype(np.float32),
                  rng.standard_normal((MICRO * chunks, 520)).astype(np.float32))
    else:
        rng = np.random.default_rng([3, step])
        arrays = (rng.standard_normal((MICRO * chunks, 12)).astype(np.float32),
                  rng.standard_normal((MICRO * chunks, 3)).astype(np.float32))
    ks = [rank * ACCUM + m for m in range(ACCUM)]
    return [tuple(Tensor(a[k * MICRO:(k + 1) * MICRO]) for a in arrays) for k in ks]


_BUILT = {}  # id(train network) -> gather Cells its prepare_train_network built


def _counting_builds():
    """Count the gather Cells built ([Note: gather Cells built once]): returns (list, undo)."""
    built, inits = [], {}
    for cls in (GatherGroup,):
        def init(self, *args, _init=cls.__init__, **kwargs):
            built.append(self)
            _init(self, *args, **kwargs)
        inits[cls], cls.__init__ = cls.__init__, init
    return built, lambda: [setattr(cls, "__init__", f) for cls, f in inits.items()]


_PLAIN = {}  # what _train gave without units, by what it depends on: each such run once per rank


def _train_plain(case, rank, world, out):
    """``_train(case, None, ...)``, run once for every case with the same model, mode, steps and
    ``reshard``: several cases compare with the same run without units."""
    key = (case["model"], case.get("layers"), case.get("mode"), case["steps"], case["reshard"], case.get("fp16"))
    if key not in _PLAIN:
        _PLAIN[key] = _train(case, None, rank, world, out)
    return _PLAIN[key]


def _train(case, units, rank, world, out):
    net = _build(case)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    built, undo = _counting_builds()
    try:
        # the Dense stack's shapes do not divide by 2 on purpose: it shards with the padded rule; the LM's do
        given = {} if units == "auto" else {"gather_units": units}  # "auto": the default, left out
        train = prepare_train_network(
            net, opt, zero_stage=3, gradient_accumulation_steps=ACCUM, clip_grad=True, clip_norm=0.5,
            reshard_after_forward=case["reshard"], pad_uneven_params=case["model"] == "dense",
            params_split_info=os.path.join(out, "split_info", case["name"] + str(bool(units))), **given)
    finally:
        undo()
    _BUILT[id(train)] = len(built)
    train.set_train(True)
    losses, shards = [], []
    for step in range(case["steps"]):
        for inputs in _batches(case, step, rank, world):
            loss, _, _ = train(*inputs)
            losses.append(float(loss.asnumpy()))
        shards.append([p.asnumpy().copy() for p in net.trainable_params()])
    unit_entries = []  # each unit part's own collectives for one micro-step, without its re-gather
    for u in unit_gathers(train.network):
        for g in u.groups():
            part = step_plan(None, [g.gather_record], PlanContext())
            unit_entries.append([list(e) for e in part.entries])
    return losses, shards, [list(e) for e in train.comm_plan.entries], unit_entries, train


def _gather_cells(train):
    """[coalesced groups, distinct gather Cells they call, gathering wrappers, distinct gather Cells
    they call, gather Cells built by ``prepare_train_network``] in ``train``'s network."""
    cells = [c for _, c in train.network.cells_and_names()]
    groups = [c for c in cells if isinstance(c, ZeroGatherGroup)]
    wrappers = [c for c in cells if gathers_split(c)]
    return [len(groups), len({id(g.gather) for g in groups}), len(wrappers), len({id(w.gather) for w in wrappers}),
            _BUILT[id(train)]]


def _train_unshared(case, rank, world, out):
    """``_train`` without units, each coalesced group and each wrapper calling its own gather Cell."""
    share = gather_build.share_key
    gather_build.share_key = lambda plan, mark, flags: None  # a key of None: not shared
    try:
        return _train(case, None, rank, world, out)
    finally:
        gather_build.share_key = share


class _After(nn.Cell):
    """``layer(tanh(x))``: the Tanh's node is the layer's input in the IR."""

    def __init__(self, layer):
        super().__init__()
        self.layer, self.tanh = layer, ops.Tanh()

    def construct(self, x):
        return self.layer(self.tanh(x))


class _TwoDense(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(6, 4), nn.Dense(4, 2)

    def construct(self, x):
        return self.fc2(self.fc1(x))


class _NoAfter(nn.Cell):
    """A Dense's weight wrapper called without ``after``: the control, its gather waits for nothing."""

    def __init__(self):
        super().__init__()
        self.layer = Dense(nn.Dense(4, 6), zero_stage=3)
        self.layer.gather_per_parameter()  # a coalescing layer builds no per-parameter wrapper

    def construct(self, x):
        return ops.matmul(x, self.layer.weight_zero_gather(self.layer.weight).T)


def _gather_inputs(ir: str):
    """[(op defining the AllGather's input, op defining that Depend's second operand or None)]."""
    defs = dict(re.findall(r"^\s*(%\d+)\(\S+\) = ([\w.]+)\(", ir, re.M))
    found = []
    for operand in re.findall(r"^\s*%\d+\(\S+\) = AllGather\((%\d+)\)", ir, re.M):
        depend = re.search(rf"^\s*{operand}\(\S+\) = Depend\((%\d+), (%\d+)\)", ir, re.M)
        found.append([defs.get(operand), defs.get(depend.group(2)) if depend else None])
    return found


def _gather_order(rank, out):
    nets = {"dense": lambda: Dense(nn.Dense(4, 6), zero_stage=3),
            "layernorm_rewrite": lambda: shard_network(nn.LayerNorm((6,))),
            "unit": lambda: shard_network(_TwoDense(), gather_units=(_TwoDense,)), "no_after": _NoAfter}
    inputs = {"dense": (2, 4), "layernorm_rewrite": (2, 6), "unit": (2, 6), "no_after": (2, 4)}
    report = {"case": "gather_order", "rank": rank}
    for name, build in nets.items():
        folder = os.path.join(out, f"ir_{name}_rank{rank}")
        ms.set_context(mode=ms.GRAPH_MODE, save_graphs=True, save_graphs_path=folder)
        try:
            _After(build())(Tensor(np.ones(inputs[name], np.float32)))
        finally:
            ms.set_context(save_graphs=False)
        (ir,) = sorted(glob.glob(os.path.join(folder, "**", "graph_build_*.ir"), recursive=True))
        with open(ir) as f:
            report[name] = _gather_inputs(f.read())
    return report


def run_case(case, rank, world, out):
    if case.get("kind") == "gather_order":
        return _gather_order(rank, out)
    ms.set_context(mode=ms.PYNATIVE_MODE if case.get("mode") == "pynative" else ms.GRAPH_MODE)
    if case["units"]:
        base_losses, base_shards, base_plan, _, base = _train_plain(case, rank, world, out)
        losses, shards, plan, unit_entries, train = _train(case, _units(case), rank, world, out)
    else:
        base_losses, base_shards, base_plan, _, base = _train_unshared(case, rank, world, out)
        losses, shards, plan, unit_entries, train = _train_plain(case, rank, world, out)
    same = [len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))
            for a, b in zip(base_shards, shards)]
    parts = [len(u.groups()) for u in unit_gathers(train.network)]
    return {"case": case["name"], "rank": rank, "world": world, "losses": losses, "base_losses": base_losses,
            "shards_equal_each_step": same, "plan": plan, "base_plan": base_plan, "unit_entries": unit_entries,
            "unit_parts": parts, "accum": ACCUM, "gather_cells": _gather_cells(train),
            "unit_classes": [c.__name__ for c in options_of(train.network)[0].gather_units or ()],
            "base_gather_cells": _gather_cells(base)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True)
    args = parser.parse_args()
    rank, world = init_data_parallel()
    for case in json.loads(args.cases):
        report = run_case(case, rank, world, args.out)
        path = os.path.join(args.out, f"{case['name']}_rank{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)
        print(f"rank {rank}: {case['name']} done", flush=True)


if __name__ == "__main__":
    main()
