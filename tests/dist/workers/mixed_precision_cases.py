"""The parity job's ``mixed_precision`` cases (tests/dist/test_mixed_precision.py): where a float16
model's fp32 copies live at each stage (docs/guides/mixed-precision.md), at N=2.

``run_mixed_precision_case(case, out, rank, world)`` builds a network whose Dense layers hold float16
parameters, AdamWeightDecay over them, and the train network at ``case["stage"]`` (with optimizer
offload if ``case["offload"]``), then runs two steps in GRAPH_MODE. It writes ``{name}_rank{r}.npz``:
the network's parameters (as float32 arrays, with their dtypes), the tensors the optimizer updates
(names, dtypes, values) before and after the steps, the dtypes of the optimizer's states, and
measure_model_states' bytes.
"""
import json
import os

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindone_zero import prepare_train_network
from mindone_zero.memory.measure import measure_model_states


class HalfNet(nn.Cell):
    """Two Dense layers with float16 parameters (dim 0 of each divides by 2), a float32 loss."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 6, dtype=ms.float16)
        self.fc2 = nn.Dense(6, 4, dtype=ms.float16)

    def construct(self, x, y):
        out = self.fc2(ms.ops.tanh(self.fc1(x.astype(ms.float16)))).astype(ms.float32)
        return ((out - y) ** 2).mean()


def _snapshot(tensors, prefix):
    out = {}
    for p in tensors:
        out[f"{prefix}{p.name}"] = p.asnumpy().astype(np.float32)
        out[f"{prefix}dtype:{p.name}"] = np.array(str(p.dtype))
    return out


def run_mixed_precision_case(case, out, rank, world, keep_alive: list) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 8)).astype(np.float32))
    y = Tensor(rng.standard_normal((4, 4)).astype(np.float32))
    ms.set_seed(0)
    net = HalfNet()
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2)
    train = prepare_train_network(net, optimizer, zero_stage=case["stage"], optimizer_offload=bool(case.get("offload")),
                                  params_split_info=os.path.join(out, f"{case['name']}_info"))
    keep_alive.append(train)  # MindSpore keys parsed Cells by id
    updated = list(train.zero_helper.opt_params)
    result = _snapshot(updated, "before:")
    for _ in range(2):
        train(x, y)
    result.update(_snapshot(updated, "after:"))
    result.update(_snapshot(train.network.trainable_params(), "net:"))
    result["memory"] = np.array(json.dumps(measure_model_states(train)))
    states = train.optimizer_shards.opt_states  # the optimizer's moments (OffloadedState with offload)
    result["states"] = np.array(json.dumps({a: sorted({str(v.dtype) for v in vs}) for a, vs in states.items()}))
    np.savez(os.path.join(out, f"{case['name']}_rank{rank}.npz"), **result)
