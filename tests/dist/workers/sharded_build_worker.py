"""msrun worker: networks built without their data (``no_init_parameters``) against the same
networks built eagerly, in MindOne's order and with ``prepare_network`` first (issue 35, item 1).

Usage (under msrun): sharded_build_worker.py --out DIR --cases JSON
Each case dict: ``name``, ``stage``, ``pad`` (pad_uneven_params, and shard_ema at stages 1-2),
``order`` ("mindone": optimizer and EMA on the full network, then ``prepare_train_network``;
"prepare_first": ``prepare_network``, then the optimizer and EMA, then ``prepare_train_network``),
``context`` ("sharded_init", the default, or MindSpore's "no_init_parameters").
The eager reference of a (stage, pad) is built once, in MindOne's order, with the same seed. Writes
DIR/{name}_rank{r}.json: the parameters of the train network that differ from the reference's
(bit for bit), the ones still built without data, the shard shapes held, the losses of 5 steps of
each and whether they are equal.
"""
import json
import logging
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor
from mindspore.nn.utils import no_init_parameters

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from msrun_harness import worker_args  # noqa: E402
from models import SparseCELoss, TinyNet, make_optimizer, micro_batch  # noqa: E402

from mindone_zero import EMA, prepare_network, prepare_train_network, sharded_init  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.core.materialize import host_value, is_unmaterialized  # noqa: E402

SEED, STEPS = 7, 5
KEEP_ALIVE = []  # MindSpore 2.10 caches parsed Cells by id: keep every case's Cells alive


class Warnings(logging.Handler):
    """The library's warnings while a case is built."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
        logging.getLogger("mindone_zero").addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())


def build(stage, pad, order, delayed, out):
    ms.set_seed(SEED)
    if delayed:
        with (sharded_init() if delayed == "sharded_init" else no_init_parameters()):
            net = TinyNet(with_scalar=False)
    else:
        net = TinyNet(with_scalar=False)
    loss = SparseCELoss(net)
    if order == "prepare_first":
        loss = prepare_network(loss, zero_stage=stage, pad_uneven_params=pad)
    opt = make_optimizer(loss.trainable_params(), "adamw")
    ema = EMA(loss, ema_decay=0.9)
    train = prepare_train_network(loss, opt, ema=ema, zero_stage=stage, pad_uneven_params=pad,
                                  shard_ema=pad and stage in (1, 2), params_split_info=out)
    KEEP_ALIVE.append(train)
    return train


def values(train):
    return {p.name: np.array(host_value(p), copy=True) for p in train.get_parameters()}  # CPU: asnumpy is a view


def run_steps(train, rank, world):
    losses = []
    for step in range(STEPS):
        ids, labels = micro_batch(step, rank, world, 0, 1)
        loss, _, _ = train(Tensor(ids), Tensor(labels))
        losses.append(float(loss.asnumpy()))
    return losses


def main():
    out, cases = worker_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    rank, world = init_data_parallel()
    refs = {}
    for case in cases:
        stage, pad = case["stage"], case["pad"]
        info = os.path.join(out, f"info_{case['name']}")
        if (stage, pad) not in refs:
            ref = build(stage, pad, "mindone", False, info + "_ref")
            refs[(stage, pad)] = (ref, values(ref), run_steps(ref, rank, world), values(ref))
        ref, ref_start, ref_losses, ref_end = refs[(stage, pad)]
        warned = Warnings()
        train = build(stage, pad, case["order"], case.get("context", "sharded_init"), info)
        logging.getLogger("mindone_zero").removeHandler(warned)
        lazy = sorted(p.name for p in train.get_parameters() if is_unmaterialized(p))
        start = values(train)
        shapes = {p.name: list(p.shape) for p in train.network.get_parameters()}
        losses = run_steps(train, rank, world)
        end = values(train)

        def differ(a, b):
            return sorted(k for k in set(a) | set(b) if k not in a or k not in b or a[k].dtype != b[k].dtype
                          or not np.array_equal(a[k], b[k]))

        result = {"start_differ": differ(ref_start, start), "end_differ": differ(ref_end, end),
                  "names": sorted(start), "lazy_after_prepare": lazy, "shapes": shapes,
                  "losses": losses, "ref_losses": ref_losses, "warnings": warned.messages}
        with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
            json.dump(result, f)
        print(f"rank {rank}: {case['name']} done", flush=True)


if __name__ == "__main__":
    main()
