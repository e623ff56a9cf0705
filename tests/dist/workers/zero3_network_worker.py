"""msrun worker: ``shard_network`` on ``Zero3TestNet`` against an unsharded copy, per rank.

For each case (GRAPH and PYNATIVE; float32, a ``to_float(float16)`` variant, and ``RecomputeNet``
whose Cells are marked with ``recompute()`` in both copies) it writes
``<case>_rank<r>.json`` with what the test asserts:

* forward and loss difference to the unsharded network on this rank's batch;
* for every trainable parameter: the gradient of the sharded network on this rank's batch
  against ``split_array(mean over ranks of the unsharded gradients)`` (split parameters), or the
  unsharded gradient on this rank's batch (replicated ones); shapes and byte counts;
* parameter names before and after, and the type the user override produced;
* the loss and gradients of the same network with coalesced gathers switched off (one collective
  per parameter), which must equal the coalesced ones bit for bit ([Note: coalesced gathers] in
  ``mindone_zero/zero3/coalesce.py``), and how many coalesced groups the network has;
* for ``pynative_recompute``, how many times each parameter's gather ran in one forward and
  backward (twice under a recomputed Cell: forward, then again when backward recomputes it).

Every rank builds every rank's batch from the seed, so the reference needs no communication.
"""
import argparse
import collections
import json
import os
import sys
import time

import numpy as np
import mindspore as ms

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/: the shared models
import zero3_models as zm  # noqa: E402

from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.core.partition import split_array  # noqa: E402
from parallel_modules import shard_network  # noqa: E402
from mindone_zero.zero3.gather_group import GatherGroup  # noqa: E402
from mindone_zero.zero3.coalesce import ZeroGatherGroup  # noqa: E402
from mindone_zero.zero3.state import coalesced_groups, regathered_param_names  # noqa: E402
from mindone_zero.zero3.gather_kinds import gathers_split  # noqa: E402

SEED = 7
# Cases that also run the network with one collective per parameter ([Note: coalesced gathers]): the
# re-gather under recompute in GRAPH, the cast-before-gather path in PYNATIVE (each costs a build).
UNCOALESCED_CASES = ("graph_recompute", "pynative_fp16")
CASES = [f"{mode}_{variant}" for mode in ("graph", "pynative") for variant in ("fp32", "fp16", "recompute")]


def _grad_runs(loss_net, batches):
    """[(loss, logits, gradients of every trainable parameter)] on each of ``batches``, by one gradient
    function: in GRAPH_MODE each ``value_and_grad`` compiles its graph again on its first call."""
    fn = ms.value_and_grad(loss_net, None, loss_net.trainable_params(), has_aux=True)
    runs = []
    for batch in batches:
        (loss, out), grads = fn(*batch)
        runs.append((float(loss.asnumpy()), out.asnumpy().astype(np.float32),
                     [g.asnumpy().astype(np.float32) for g in grads]))
    return runs


def _grads(loss_net, batch):
    """(loss, logits, gradients of every trainable parameter) on one batch."""
    return _grad_runs(loss_net, [batch])[0]


def _count_gathers(fn):
    """(fn(), {parameter name: how many times its gather ran}); PYNATIVE only (a Python spy)."""
    counts = collections.Counter()
    original = GatherGroup.construct

    def spy(self, xs):
        counts.update(self.param_names)
        return original(self, xs)

    GatherGroup.construct = spy
    try:
        return fn(), dict(counts)
    finally:
        GatherGroup.construct = original


def _param_report(param, size):
    spec = getattr(param, "zero_spec", None)
    full = tuple(spec.shape) if spec is not None else tuple(param.shape)
    itemsize = np.dtype(np.float16 if param.dtype == ms.float16 else np.float32).itemsize
    rows = -(-full[0] // size) if spec is not None and spec.split else None
    expected_shape = ((rows,) + full[1:]) if rows is not None else full
    return {
        "split": bool(spec.split) if spec is not None else None,
        "has_spec": spec is not None,
        "full_shape": list(full),
        "shape": list(param.shape),
        "expected_shape": list(expected_shape),
        "nbytes": int(param.nbytes),
        "expected_nbytes": int(np.prod(expected_shape, dtype=np.int64)) * itemsize,
    }


def _uncoalesced_equal(net, batch, loss, grads):
    """Whether ``net`` sharded with every coalesced gather switched off gives ``loss`` and ``grads`` bit for bit."""
    net = shard_network(net, parallel_modules={zm.Shift: zm.ShiftZero3}, pad_uneven_params=True)
    for cell in [c for _, c in net.cells_and_names() if getattr(c, "zero_coalesce", False)]:
        cell.gather_per_parameter()
    other_loss, _, other_grads = _grads(zm.Zero3LossNet(net), batch)
    return other_loss == loss and len(grads) == len(other_grads) and all(
        a.shape == b.shape and np.array_equal(a, b) for a, b in zip(grads, other_grads))


def _regather_marks(net):
    """[path, names, the Cell itself marked for recompute, its collective Cell marked with
    output_recompute] of every gathering wrapper and coalesced group of ``net``."""
    return [[path, list(getattr(cell, "param_names", (getattr(cell, "param_name", None),))),
             bool(cell._has_config_recompute), bool(cell.gather.get_flags().get("output_recompute"))]
            for path, cell in net.cells_and_names() if gathers_split(cell) or isinstance(cell, ZeroGatherGroup)]


def run_case(mode, fp16, size, rank, recompute=False):
    ms.set_context(mode=mode)
    build = zm.build_recompute if recompute else zm.build
    ref, net = build(fp16), build(fp16)
    # Parameter names (what checkpoints use). Attribute paths change under a MindOne-style class,
    # which holds the original as `self.net` (blocks.2.offset is reached as blocks.2.net.offset).
    names_before = [p.name for _, p in net.parameters_and_names()]
    net = shard_network(net, parallel_modules={zm.Shift: zm.ShiftZero3}, pad_uneven_params=True)
    names_after = [p.name for _, p in net.parameters_and_names()]
    report = {
        "names_equal": names_before == names_after,
        "override_type": None if recompute else type(net.blocks[2]).__name__,
    }
    batches = [zm.make_batch(SEED, r) for r in range(size)]
    ref_loss_net, loss_net = zm.Zero3LossNet(ref), zm.Zero3LossNet(net)
    ref_runs = _grad_runs(ref_loss_net, batches)
    # Inference without a train wrapper: the sharded network called directly.
    ids, img, _ = batches[rank]
    report["forward_max_abs"] = float(np.abs(net(ids, img).asnumpy().astype(np.float32) - ref_runs[rank][1]).max())
    if recompute and mode == ms.PYNATIVE_MODE:
        (loss, out, grads), report["gather_calls"] = _count_gathers(lambda: _grads(loss_net, batches[rank]))
    else:
        loss, out, grads = _grads(loss_net, batches[rank])
    report["loss"], report["ref_loss"] = loss, ref_runs[rank][0]
    report["train_forward_max_abs"] = float(np.abs(out - ref_runs[rank][1]).max())
    # After wrapping in the loss Cell the names carry its "net." prefix, as the gradients do;
    # they must still be the unsharded network's names (checkpoints written either way match),
    # except under a MindOne-style class: MindSpore renames by attribute path on wrapping, and
    # such a class holds the original as `self.net` (as MindOne's own layers do).
    report["names_differing_wrapped"] = [
        [a.name, b.name] for (_, a), (_, b) in zip(ref_loss_net.parameters_and_names(), loss_net.parameters_and_names())
        if a.name != b.name
    ]
    report["params"] = {p.name: _param_report(p, size) for _, p in loss_net.parameters_and_names()}
    report["coalesced_groups"] = len(coalesced_groups(net))
    report["regather_marks"] = _regather_marks(net)
    report["regathered"] = regathered_param_names(net)
    variant = "recompute" if recompute else "fp16" if fp16 else "fp32"
    case = f"{'graph' if mode == ms.GRAPH_MODE else 'pynative'}_{variant}"
    if case in UNCOALESCED_CASES:
        t0 = time.time()
        report["uncoalesced_equal"] = _uncoalesced_equal(build(fp16), batches[rank], loss, grads)
        report["uncoalesced_s"] = time.time() - t0
    report["grads"] = {}
    for i, param in enumerate(loss_net.trainable_params()):
        if param.zero_spec.split:
            expected = split_array(np.mean([run[2][i] for run in ref_runs], axis=0), size, rank)
        else:
            expected = ref_runs[rank][2][i]
        got = grads[i]
        report["grads"][param.name] = {
            "shape": list(got.shape),
            "expected_shape": list(expected.shape),
            "max_abs": float(np.abs(got - expected).max()) if got.shape == expected.shape else None,
            "scale": float(np.abs(expected).max()),
        }
    return report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    wanted = args.cases.split(",")
    # DATA_PARALLEL, as a training script sets it: MindOne-style classes (ShiftZero3) only cut then.
    rank, size = init_data_parallel()
    for mode_name, mode in (("graph", ms.GRAPH_MODE), ("pynative", ms.PYNATIVE_MODE)):
        for variant in ("fp32", "fp16", "recompute"):
            case = f"{mode_name}_{variant}"
            if case not in wanted:
                continue
            t0, c0 = time.time(), time.process_time()
            report = run_case(mode, variant == "fp16", size, rank, recompute=variant == "recompute")
            report.update(case=case, size=size, rank=rank, wall_s=time.time() - t0, cpu_s=time.process_time() - c0)
            path = os.path.join(args.out, f"{case}_rank{rank}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(report, f, indent=1)
            os.replace(path + ".tmp", path)
            print(f"rank {rank}: {case} done in {report['wall_s']:.1f}s (cpu {report['cpu_s']:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
