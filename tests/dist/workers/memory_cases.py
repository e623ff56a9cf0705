"""The parity job's ``memory`` cases (tests/dist/test_memory_measure.py): measure_model_states of
TinyNet's train network at one ZeRO stage and layout, at N=2.

``run_memory_case(case, out, rank, world)`` builds TinyNet + Adam + EMA with 2 accumulation steps
(so accumulation buffers exist) in PYNATIVE_MODE and writes ``{name}_rank{r}.json``: the measured
bytes by kind and the stage in effect. Layouts: "padded" (pad_uneven_params=True, shard_ema=True:
every parameter split, the EMA 1/N from stage 1) and "mindone" (the defaults: only a dim 0 that
divides is split, the EMA whole below stage 3). Nothing is trained: the sizes are fixed at build time.
"""
import json
import os

import mindspore as ms

from models import LossNet, TinyNet, init_weights, make_optimizer
from mindone_zero import EMA, prepare_train_network
from mindone_zero.memory.measure import measure_model_states


def run_memory_case(case, out, rank, world) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the mode a process starts in, as this job's own process had
    padded = case["layout"] == "padded"
    net = init_weights(TinyNet())
    ema = EMA(net, ema_decay=0.9)
    opt = make_optimizer(net.trainable_params(), "adam")
    train = prepare_train_network(LossNet(net), opt, ema=ema, gradient_accumulation_steps=2, zero_stage=case["stage"],
                                  pad_uneven_params=padded, shard_ema=padded,
                                  params_split_info=os.path.join(out, f"{case['name']}_info"))
    result = {"memory": measure_model_states(train), "stage": int(train.zero_helper.zero_stage)}
    with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
        json.dump(result, f)
