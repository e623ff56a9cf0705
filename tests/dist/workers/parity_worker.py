"""msrun worker: train TinyNet with prepare_train_network for each case, write per-rank results.

Usage (under msrun): parity_worker.py --out DIR --cases JSON
Each case: {"name", "mode": "graph"|"pynative", "stage", "accum", "clip", "steps", "optimizer",
            "overflow_step" (optional: rank 1 injects inf into its loss at that step),
            "dynamic_scale" (optional)}.
Writes DIR/{name}_rank{r}.npz (losses, overflow, scales, params) and DIR/{name}_rank{r}.json.
"""
import argparse
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn
from mindspore.communication import create_group, get_group_size, get_rank, init

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from models import FactoredOptimizer, LossNet, TinyNet, init_weights, make_optimizer, micro_batch  # noqa: E402

from mindone_zero import ZeroHelper, prepare_train_network  # noqa: E402
from mindone_zero.optimizer_states import find_optimizer_states  # noqa: E402

CLIP_NORM = 2.0


def run_case(case, out, rank, world):
    ms.set_context(mode=ms.GRAPH_MODE if case["mode"] == "graph" else ms.PYNATIVE_MODE)
    net = init_weights(TinyNet(with_scalar=case.get("net", "full") == "full"))
    loss_net = LossNet(net)
    opt = make_optimizer(net.trainable_params(), case.get("optimizer", "adam"))
    scale = nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000) if case.get("dynamic_scale") else 1.0
    accum = case["accum"]
    train = prepare_train_network(
        loss_net, opt, scale_sense=scale, zero_stage=case["stage"], gradient_accumulation_steps=accum,
        clip_grad=case["clip"], clip_norm=CLIP_NORM, params_split_info=os.path.join(out, case["name"] + "_info"),
    )
    train.set_train(True)
    losses, overflows, scales = [], [], []
    for step in range(case["steps"]):
        for micro in range(accum):
            ids, labels = micro_batch(step, rank, world, micro, accum)
            factor = np.inf if (step == case.get("overflow_step") and rank == 1) else 1.0
            loss, overflow, s = train(Tensor(ids), Tensor(labels), Tensor(factor, ms.float32))
            losses.append(float(loss.asnumpy()))
            overflows.append(bool(overflow.asnumpy()))
            scales.append(float(s.asnumpy()))
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    specs = {}
    for p in net.trainable_params():
        spec = getattr(p, "zero_spec", None)
        specs[p.name] = {"split": bool(spec.split), "shape": list(spec.shape)} if spec is not None else None
    helper = train.zero_helper
    # Stage 0 shards nothing, so the helper found no states; find them the same way it does.
    states = helper.opt_states or find_optimizer_states(train.optimizer, [s.shape for s in helper.specs])
    state_bytes = sum(v.nbytes for values in states.values() for v in values)
    master_bytes = sum(p.nbytes for p, q in zip(helper.opt_params, helper.params) if p is not q)
    np.savez(os.path.join(out, f"{case['name']}_rank{rank}.npz"), losses=np.array(losses),
             overflows=np.array(overflows), scales=np.array(scales), final_scale=float(train.scale_sense.asnumpy()),
             **{"param/" + k: v for k, v in params.items()})
    with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
        json.dump({"specs": specs, "state_bytes": int(state_bytes), "master_bytes": int(master_bytes),
                   "split": [bool(s) for s in helper.split]}, f)


def _error_of(fn):
    try:
        fn()
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def run_error_checks(out, rank, world):
    """Build-time errors that need a distributed job; writes errors_rank{r}.json."""
    create_group("zero_sub", list(range(world)))  # all ranks, but not the world group by name
    net = LossNet(init_weights(TinyNet()))
    results = {
        "no_dp_group": _error_of(lambda: prepare_train_network(
            net, make_optimizer(net.trainable_params()), zero_stage=1, optimizer_parallel_group="zero_sub")),
        "factored_stage1": _error_of(lambda: ZeroHelper(FactoredOptimizer(net.trainable_params()), zero_stage=1,
                                                         params_split_info=os.path.join(out, "errors_info"))),
        "factored_stage0": _error_of(lambda: ZeroHelper(FactoredOptimizer(net.trainable_params()), zero_stage=0)),
    }
    with open(os.path.join(out, f"errors_rank{rank}.json"), "w") as f:
        json.dump(results, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True)
    args = parser.parse_args()
    ms.set_device("CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    run_error_checks(args.out, rank, world)
    for case in json.loads(args.cases):
        run_case(case, args.out, rank, world)
        print(f"rank {rank}: case {case['name']} done", flush=True)


if __name__ == "__main__":
    main()
