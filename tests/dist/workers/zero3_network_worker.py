"""msrun worker: ``shard_network`` on ``Zero3TestNet`` against an unsharded copy, per rank.

For each case (GRAPH and PYNATIVE, float32 and a ``to_float(float16)`` variant) it writes
``<case>_rank<r>.json`` with what the test asserts:

* forward and loss difference to the unsharded network on this rank's batch;
* for every trainable parameter: the gradient of the sharded network on this rank's batch
  against ``split_array(mean over ranks of the unsharded gradients)`` (split parameters), or the
  unsharded gradient on this rank's batch (replicated ones); shapes and byte counts;
* parameter names before and after, and the type the user override produced.

Every rank builds every rank's batch from the seed, so the reference needs no communication.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import mindspore as ms
from mindspore.communication import get_group_size, get_rank, init

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zero3_models as zm  # noqa: E402

from mindone_zero.partition import split_array  # noqa: E402
from parallel_modules import shard_network  # noqa: E402

SEED = 7


def _grads(loss_net, batch):
    """(loss, logits, gradients of every trainable parameter) on one batch."""
    fn = ms.value_and_grad(loss_net, None, loss_net.trainable_params(), has_aux=True)
    (loss, out), grads = fn(*batch)
    return float(loss.asnumpy()), out.asnumpy().astype(np.float32), [g.asnumpy().astype(np.float32) for g in grads]


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


def run_case(mode, fp16, size, rank):
    ms.set_context(mode=mode)
    ref, net = zm.build(fp16), zm.build(fp16)
    names_before = [(path, p.name) for path, p in net.parameters_and_names()]
    net = shard_network(net, parallel_modules={zm.Shift: zm.ShiftZero3})
    names_after = [(path, p.name) for path, p in net.parameters_and_names()]
    report = {
        "names_equal": names_before == names_after,
        "override_type": type(net.blocks[2]).__name__,
    }
    batches = [zm.make_batch(SEED, r) for r in range(size)]
    ref_loss_net, loss_net = zm.Zero3LossNet(ref), zm.Zero3LossNet(net)
    ref_runs = [_grads(ref_loss_net, b) for b in batches]
    # Inference without a train wrapper: the sharded network called directly.
    ids, img, _ = batches[rank]
    report["forward_max_abs"] = float(np.abs(net(ids, img).asnumpy().astype(np.float32) - ref_runs[rank][1]).max())
    loss, out, grads = _grads(loss_net, batches[rank])
    report["loss"], report["ref_loss"] = loss, ref_runs[rank][0]
    report["train_forward_max_abs"] = float(np.abs(out - ref_runs[rank][1]).max())
    # After wrapping in the loss Cell the names carry its "net." prefix, as the gradients do;
    # they must still be the unsharded network's names (checkpoints written either way match).
    report["names_equal_wrapped"] = ([p.name for _, p in loss_net.parameters_and_names()]
                                     == [p.name for _, p in ref_loss_net.parameters_and_names()])
    report["params"] = {p.name: _param_report(p, size) for _, p in loss_net.parameters_and_names()}
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
    parser.add_argument("--cases", default="graph_fp32,graph_fp16,pynative_fp32,pynative_fp16")
    args = parser.parse_args()
    wanted = args.cases.split(",")
    ms.set_device("CPU")
    init()
    size, rank = get_group_size(), get_rank()
    for mode_name, mode in (("graph", ms.GRAPH_MODE), ("pynative", ms.PYNATIVE_MODE)):
        for fp16 in (False, True):
            case = f"{mode_name}_{'fp16' if fp16 else 'fp32'}"
            if case not in wanted:
                continue
            t0, c0 = time.time(), time.process_time()
            report = run_case(mode, fp16, size, rank)
            report.update(case=case, size=size, rank=rank, wall_s=time.time() - t0, cpu_s=time.process_time() - c0)
            path = os.path.join(args.out, f"{case}_rank{rank}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(report, f, indent=1)
            os.replace(path + ".tmp", path)
            print(f"rank {rank}: {case} done in {report['wall_s']:.1f}s (cpu {report['cpu_s']:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
