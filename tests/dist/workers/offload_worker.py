"""msrun worker for issue 24: optimizer offload against the device run, bit for bit, and resume.

Usage (under msrun): offload_worker.py --out DIR --cases JSON
Each case: {"name", "stage", "offload": None | "host" | "file", "steps",
            "resume_at" (optional: save_train_state after that many steps, then build a fresh
            train network from the initial weights, load_train_state and train on to "steps")}.
The model is ``GeluNet`` (GELU, widths 38 and 5, a bare parameter) with
AdamWeightDecay (decay on the weights), clipping and different data on every rank.
Writes DIR/{name}_rank{r}.npz: losses per step, the full (gathered) parameters and which are sharded.
"""
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from msrun_harness import worker_args  # noqa: E402
from models import GeluLoss, GeluNet, adamw_groups, gelu_batch, init_weights  # noqa: E402

from mindone_zero import prepare_train_network  # noqa: E402
from mindone_zero.checkpoint import gather_full_params, load_train_state, save_train_state  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402

KEEP_ALIVE = []  # MindSpore caches compiled Cells by id


def build(case, out):
    ms.set_context(mode=ms.GRAPH_MODE)
    net = init_weights(GeluNet())
    where = case.get("offload")
    offload = ({"device": "nvme", "path": os.path.join(out, "states"), "chunk_size": 40} if where == "file"
               else where == "host")
    train = prepare_train_network(GeluLoss(net), adamw_groups(net), zero_stage=case["stage"], clip_grad=True,
                                  clip_norm=0.5, optimizer_offload=offload,
                                  params_split_info=os.path.join(out, "info", case["name"]))
    train.set_train(True)
    KEEP_ALIVE.append(train)
    return train


def run_case(case, out, rank, world):
    train, losses = build(case, out), []
    for step in range(case["steps"]):
        if step == case.get("resume_at"):
            folder = os.path.join(out, "ckpt_" + case["name"])
            save_train_state(train, folder, step)
            train = build(case, out)
            assert load_train_state(train, folder, step) == step
        x, t = gelu_batch(step, rank, world)
        losses.append(float(train(Tensor(x), Tensor(t), Tensor(1.0, ms.float32))[0].asnumpy()))
    params = gather_full_params(train)
    np.savez(os.path.join(out, f"{case['name']}_rank{rank}.npz"), losses=np.array(losses),
             split=np.array([bool(s.split) for s in train.zero_plan.specs]), **{"param/" + k: v for k, v in params.items()})


def main():
    out, cases = worker_args()
    rank, world = init_data_parallel()
    for case in cases:
        run_case(case, out, rank, world)


if __name__ == "__main__":
    main()
