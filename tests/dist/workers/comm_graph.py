"""The CommPlan against the compiled graph (tests/dist/test_comm_graph.py), run inside the parity job.

``run_graph_case`` builds one train network of a case (one micro-step per optimizer step, so one call
is one optimizer step), calls it once in GRAPH_MODE with ``save_graphs`` limited to the final kernel
graphs (``MS_DEV_DUMP_IR_PASSES=graph_build``: a few files instead of a hundred), and writes
``graph_{name}_rank{r}.json``: the plan's entries and the compiled graph's collectives, each read back
as the native collective it stands for ([Note: native tags] in mindone_zero/core/comm.py).

``compiled_collectives`` reads the ``graph_build_*.ir`` files: every collective node of every kernel
graph (the branches of ``drop_overflow_update`` are graphs of their own; only the branch that steps
holds collectives), with its primitive's attributes and its input's dtype and shape.
"""
import glob
import os
import re
import shutil
import traceback
from collections import Counter

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn
from mindspore.communication import create_group

from mindone_zero import prepare_train_network
from mindone_zero.core.comm import NATIVE_ITEMSIZE, NATIVE_OP, NATIVE_SCALE, NATIVE_SHARE
from mindone_zero.train.comm_accounting import network_gathers
from lora_models import build_own_lora
from models import LossNet, SparseCELoss, TinyNet, init_weights, make_optimizer, micro_batch
from tools.lm_model import LMLoss, build_lm, init_lm_weights, reversal_batch

LM = {"vocab_size": 32, "d_model": 64, "n_layers": 1, "d_ff": 128, "max_len": 16, "n_heads": 4}
WIDE = 768  # a float16 Dense(768, 768): 1.2 MB gathered, over COALESCE_MAX_BYTES, so gathered per parameter
COLLECTIVE_OPS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll", "AllToAll")
ITEMSIZE = {"Float32": 4, "Float16": 2, "BFloat16": 2, "Int8": 1, "UInt8": 1, "Int32": 4, "Bool": 1, "Float64": 8}
_NODE = re.compile(r"^\s*%\d+\([^)]*\) = (?:PrimFunc_)?(" + "|".join(COLLECTIVE_OPS) + r")\(")
_INPUT = re.compile(r"^\s*: \(<Tensor\[(\w+)\], \(([\d, ]*)\)>")


class Wide(nn.Cell):
    """A float16 layer gathered per parameter (its weight over 1 MiB in float16), between a LayerNorm
    (so that its input needs a gradient, and its backward reads its weight: [Note: dropped
    re-gathers]) and a small float32 head: drift 1 of issue 47, a per-parameter mixed-precision gather."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm((WIDE,))
        self.wide = nn.Dense(WIDE, WIDE).to_float(ms.float16)
        self.head = nn.Dense(WIDE, 8)

    def construct(self, x):
        return self.head(self.wide(self.norm(x)).astype(ms.float32))


def _attr(attrs: str, name: str):
    m = re.search(rf"\b{name}: (?:\"([^\"]*)\"|I64\((\d+)\))", attrs)
    if m is None:
        return None
    return m.group(1) if m.group(1) is not None else int(m.group(2))


def compiled_collectives(folder: str) -> list:
    """``[kind, group, native bytes, IR op]`` of every collective node in the kernel graphs dumped
    under ``folder`` ([Note: native tags]). Raises AssertionError for a node it cannot read."""
    found = []
    for path in sorted(glob.glob(os.path.join(folder, "**", "graph_build_*.ir"), recursive=True)):
        with open(path) as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            m = _NODE.match(line)
            if m is None:
                continue
            attrs = line[line.find("primitive_attrs:"):]
            shape = _INPUT.match(lines[i + 1])
            native = _attr(attrs, NATIVE_OP)
            assert native is not None and shape is not None, f"{os.path.basename(path)}: {line.strip()[:300]}"
            dims = [int(d) for d in shape.group(2).replace(" ", "").split(",") if d]
            itemsize = _attr(attrs, NATIVE_ITEMSIZE) or ITEMSIZE[shape.group(1)]
            nbytes = (int(np.prod(dims, dtype=np.int64)) * itemsize * _attr(attrs, NATIVE_SCALE)
                      // _attr(attrs, NATIVE_SHARE))
            found.append([native, _attr(attrs, "group"), int(nbytes), m.group(1)])
    return found


def _hpz_group(rank: int, world: int) -> str:
    """This rank's half of the world as a group (as tests/dist/workers/zeropp_worker.py names it)."""
    half = world // 2
    members = list(range(half)) if rank < half else list(range(half, world))
    name = f"graph_hpz_{members[0]}"
    create_group(name, members)
    return name


def _network(case, rank, world):
    """(loss network, optimizer, one micro-batch's inputs) of ``case``."""
    net = case.get("net", "tiny")
    if net in ("lm", "lm2"):  # lm2: two blocks, which the default makes gather units
        loss = LMLoss(init_lm_weights(build_lm(dict(LM, n_layers=2) if net == "lm2" else LM), 0))
        arrays = reversal_batch(1, 0, 4 * world, 8, LM["vocab_size"])
        inputs = tuple(Tensor(a[rank * 4:(rank + 1) * 4]) for a in arrays)
    elif net == "lora":  # its base frozen (tests/lora_models.py)
        loss = LossNet(build_own_lora())
        ids, labels = micro_batch(0, rank, world, 0, 1)
        inputs = (Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32))
    elif net == "wide":
        loss = SparseCELoss(Wide())
        rng = np.random.default_rng(rank)
        inputs = (Tensor(rng.standard_normal((4, WIDE)).astype(np.float32)),
                  Tensor(rng.integers(0, 8, (4,)).astype(np.int32)))
    else:
        tiny = init_weights(TinyNet(with_scalar=net != "noscalar"))
        if net == "fp16":
            tiny.head.to_float(ms.float16)
        loss = LossNet(tiny)
        ids, labels = micro_batch(0, rank, world, 0, 1)
        inputs = (Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32))
    return loss, make_optimizer(loss.trainable_params(), case.get("optimizer", "adam")), inputs


def _gather_units(names, classes):
    """The case's ``gather_units``: "auto" as it is (the default), else the named classes or None."""
    if names == "auto":
        return "auto"
    return tuple(classes[u] for u in names) or None


def _build(case, rank, world, hybrid, out):
    loss, optimizer, inputs = _network(case, rank, world)
    zeropp = dict(case["zeropp"]) if case.get("zeropp") else None
    if case.get("hpz"):
        zeropp = dict(zeropp or {}, hpz_group=_hpz_group(rank, world))
    groups = dict(optimizer_parallel_group=hybrid[0], dp_group=hybrid[1]) if case.get("hybrid") else {}
    units = {"TinyNet": TinyNet, "Dense": nn.Dense}
    train = prepare_train_network(
        loss, optimizer, zero_stage=case["stage"], clip_grad=case.get("clip", False), clip_norm=2.0,
        optimizer_offload=case.get("offload", False), reshard_after_forward=case.get("reshard", True),
        pad_uneven_params=case.get("net") not in ("lm", "lm2", "wide"), zeropp=zeropp,
        gather_units=_gather_units(case.get("units", ()), units),
        params_split_info=os.path.join(out, f"graph_{case['name']}_info"), **groups)
    train.set_train(True)
    return train, inputs


def run_graph_case(case, out, rank, world, hybrid, keep_alive: list) -> dict:
    """Build ``case``'s train network, compile and run one step with the kernel graphs dumped, and
    return ``{"plan", "graph", "ops"}`` (or ``{"error"}``). Collective: every rank runs it."""
    ms.set_context(mode=ms.GRAPH_MODE)
    folder = os.path.join(out, f"ir_graph_{case['name']}_rank{rank}")
    passes = os.environ.get("MS_DEV_DUMP_IR_PASSES")
    try:
        train, inputs = _build(case, rank, world, hybrid, out)
        keep_alive.append(train)  # MindSpore keys parsed Cells by id
        os.environ["MS_DEV_DUMP_IR_PASSES"] = "graph_build"
        ms.set_context(save_graphs=1, save_graphs_path=folder)
        try:
            train(*inputs)
        finally:
            ms.set_context(save_graphs=False)
            if passes is None:
                os.environ.pop("MS_DEV_DUMP_IR_PASSES", None)
            else:
                os.environ["MS_DEV_DUMP_IR_PASSES"] = passes
        graph = compiled_collectives(folder)
        shutil.rmtree(folder, ignore_errors=True)
        records = [r for r in network_gathers(train.network) if r.gathers]
        return {"plan": [list(e) for e in train.comm_plan.entries], "graph": graph,
                "groups": {"gathering": len(records), "reducing": sum(1 for r in records if r.reduces),
                           "unit": sum(1 for r in records if r.kind == "unit"),
                           "unit_bytes": [r.gathered_nbytes for r in records if r.kind == "unit"]},
                "ops": dict(Counter(e[3] for e in graph)),
                "regathered": [g["name"] for g in train.param_gathers() if g["regathered"]]}
    except Exception:  # noqa: BLE001 - reported to the test, which fails with it; the job goes on
        return {"error": traceback.format_exc()}
