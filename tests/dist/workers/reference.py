"""Single process, no communication: TinyNet trained on the whole global batch.

The reference for parity: plain ``ms.value_and_grad`` + clipping by the global norm + the
optimizer, sharing none of mindone_zero's code.
Usage: reference.py SPECS_JSON, a list of {"path", "steps", "clip", "optimizer", "skipped", "net"}
(all computed in one process to pay MindSpore's import once). A skipped step trains on nothing
(what a dropped overflow step must amount to); net is "full" or "noscalar".
"""
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from models import LossNet, TinyNet, global_batch, init_weights, make_optimizer  # noqa: E402

CLIP_NORM = 2.0


def main(out, steps, clip, opt_name, skipped=(), net_kind="full"):
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = init_weights(TinyNet(with_scalar=net_kind == "full"))
    loss_net = LossNet(net)
    weights = net.trainable_params()
    opt = make_optimizer(weights, opt_name)
    grad_fn = ms.value_and_grad(loss_net, None, weights)
    losses, norms = [], []
    one = Tensor(1.0, ms.float32)
    for step in range(steps):
        if step in skipped:
            continue
        ids, labels = global_batch(step)
        loss, grads = grad_fn(Tensor(ids), Tensor(labels), one)
        norms.append(float(np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))))
        if clip:  # ops.clip_by_global_norm turns 0-d gradients into shape (1,), so scale by hand
            factor = CLIP_NORM / max(norms[-1], CLIP_NORM)
            grads = tuple(g * factor for g in grads)
        opt(grads)
        losses.append(float(loss.asnumpy()))
    np.savez(out, losses=np.array(losses), norms=np.array(norms), **{"param/" + p.name: p.asnumpy() for p in weights})


if __name__ == "__main__":
    for spec in json.loads(sys.argv[1]):
        main(spec["path"], spec["steps"], spec["clip"], spec["optimizer"], tuple(spec["skipped"]), spec["net"])
