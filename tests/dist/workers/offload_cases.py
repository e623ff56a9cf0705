"""The parity job's ``offload`` cases (tests/dist/test_offload_parity.py, issue 24): optimizer offload
against the device run, bit for bit, and resume, at N=2.

``run_offload_case(case, out, rank, world, keep_alive)``; a case: {"name", "stage", "offload": None |
"host" | "file", "steps", "resume_at" (optional: save_train_state after that many steps, then build a
fresh train network from the initial weights, load_train_state and train on to "steps")}.
The model is ``GeluNet`` (GELU, widths 38 and 5, a bare parameter) with AdamWeightDecay (decay on
the weights), clipping and different data on every rank. Writes ``{name}_rank{r}.npz``: losses per
step, the full (gathered) parameters and which are sharded.
"""
import os

import numpy as np
import mindspore as ms
from mindspore import Tensor

from models import GeluLoss, GeluNet, adamw_groups, gelu_batch, init_weights
from mindone_zero import prepare_train_network
from mindone_zero.checkpoint import gather_full_params, load_train_state, save_train_state


def _build(case, out, keep_alive: list):
    ms.set_context(mode=ms.GRAPH_MODE)
    net = init_weights(GeluNet())
    where = case.get("offload")
    offload = ({"device": "nvme", "path": os.path.join(out, case["name"] + "_states"), "chunk_size": 40}
               if where == "file" else where == "host")
    train = prepare_train_network(GeluLoss(net), adamw_groups(net), zero_stage=case["stage"], clip_grad=True,
                                  clip_norm=0.5, optimizer_offload=offload,
                                  params_split_info=os.path.join(out, case["name"] + "_info"))
    train.set_train(True)
    keep_alive.append(train)  # MindSpore keys parsed Cells by id
    return train


def run_offload_case(case, out, rank, world, keep_alive: list) -> None:
    train, losses = _build(case, out, keep_alive), []
    for step in range(case["steps"]):
        if step == case.get("resume_at"):
            folder = os.path.join(out, case["name"] + "_ckpt")
            save_train_state(train, folder, step)
            train = _build(case, out, keep_alive)
            assert load_train_state(train, folder, step) == step
        x, t = gelu_batch(step, rank, world)
        losses.append(float(train(Tensor(x), Tensor(t), Tensor(1.0, ms.float32))[0].asnumpy()))
    params = gather_full_params(train)
    np.savez(os.path.join(out, f"{case['name']}_rank{rank}.npz"), losses=np.array(losses),
             split=np.array([bool(s.split) for s in train.zero_plan.specs]),
             **{"param/" + k: v for k, v in params.items()})
