"""msrun worker for tests/dist/test_pretrained_parity.py: load_full_checkpoint vs MindOne's way, bad inputs.

Usage (under msrun): pretrained_worker.py --out DIR --cases JSON
A load case: {"name", "stage", "pad" (pad_uneven_params), "path" (the pretrained file or folder),
"ref" (the same values as a full fp32 .ckpt), "via": "train" (load into the train network from
prepare_train_network) | "net" (into the network from prepare_network, before the optimizer),
"hybrid" (optimizer groups of 2, world 4), "shard_ema", "strip" (a prefix the file names carry),
"train" (run 5 steps of each), "sharded" (ours built under ``sharded_init``: with "net" the order
``prepare_network`` first, with "train" MindOne's order, the optimizer and EMA on the full unmaterialized
network)}. Two train networks are built: MindOne's way (``ms.load_checkpoint``
+ ``load_param_into_net`` into the full network, then EMA, optimizer, ``prepare_train_network``)
and ours. Writes DIR/{name}_rank{r}.npz
(``ref/...`` and ``got/...``: every network Parameter, master shard and EMA weight this rank holds)
and DIR/{name}_rank{r}.json (losses of each, bytes read vs this rank's block bytes).
An "errors" case {"name", "checks": {check: [path, kwargs]}} loads each bad input into a stage-3
network from prepare_network and records the error, and whether anything changed.
"""
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from models import LossNet, TinyNet, init_weights, make_optimizer, micro_batch  # noqa: E402

from mindone_zero import (EMA, create_hybrid_groups, load_full_checkpoint, prepare_network,  # noqa: E402
                          prepare_train_network, sharded_init)
from mindone_zero.checkpoint import readers  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.core.partition import zero_spec_of  # noqa: E402
from mindone_zero.train.inventory import inventory  # noqa: E402

STEPS = 5
KEEP_ALIVE = []  # MindSpore caches compiled Cells by id: keep every train network alive
READ = {"bytes": 0}


def _counting_read_into(real):
    def read_into(f, view, offset, path, name):
        READ["bytes"] += len(view)
        return real(f, view, offset, path, name)

    return read_into


readers._read_into = _counting_read_into(readers._read_into)


def _groups(case):
    return create_hybrid_groups(2) if case.get("hybrid") else (None, None)


def _train(case, net):
    op_group, dp_group = _groups(case)
    loss_net = LossNet(net)
    ema = EMA(net, ema_decay=0.9)
    opt = make_optimizer(net.trainable_params(), "adam")
    train = prepare_train_network(loss_net, opt, ema=ema, zero_stage=case["stage"], optimizer_parallel_group=op_group,
                                  dp_group=dp_group, pad_uneven_params=case["pad"],
                                  shard_ema=case.get("shard_ema", False),
                                  params_split_info=os.path.join(OUT, "info", case["name"]))
    train.set_train(True)
    KEEP_ALIVE.append(train)
    return train


def mindone_way(case):
    net = init_weights(TinyNet(), seed=0)
    ms.load_param_into_net(net, ms.load_checkpoint(case["ref"]), strict_load=True)
    return _train(case, net)


def our_way(case):
    """(train network, bytes read by load_full_checkpoint, bytes of this rank's blocks in the file)."""
    if case.get("sharded"):  # built without data: only the load gives the parameters their values
        with sharded_init():
            net = TinyNet()
    else:
        net = init_weights(TinyNet(), seed=0)
    strip = case.get("strip")
    READ["bytes"] = 0
    if case["via"] == "net":
        op_group, _ = _groups(case)
        net = prepare_network(net, case["stage"], optimizer_parallel_group=op_group, pad_uneven_params=case["pad"])
        assert load_full_checkpoint(net, case["path"], strip_prefix=strip) == ([], [])
        read, want = READ["bytes"], _block_bytes(net, case)
        return _train(case, net), read, want
    train = _train(case, net)
    assert load_full_checkpoint(train, case["path"], strip_prefix=strip, add_prefix="net.") == ([], [])
    return train, READ["bytes"], None


def _block_bytes(net, case):
    """Bytes of the file's rows this rank holds (padding rows are not read)."""
    itemsize = 2 if case.get("bf16") else 4
    total = 0
    for p in net.get_parameters():
        spec = zero_spec_of(p)
        full = spec.shape if spec is not None else tuple(p.shape)
        rows = full[0] if full else 1
        if spec is not None and spec.split:
            start = min(spec.rank * spec.rows, full[0])
            rows = min(start + spec.rows, full[0]) - start
        total += rows * int(np.prod(full[1:], dtype=np.int64)) * itemsize
    return total


def held(train):
    return {f"{h.kind}/{h.param.name}": h.param.asnumpy().copy() for h in inventory(train)
            if h.kind in ("params", "master_shards", "ema")}


def losses(train, case, rank, world):
    out = []
    for step in range(STEPS if case.get("train") else 0):
        ids, labels = micro_batch(step, rank, world, 0, 1)
        loss, _, _ = train(Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32))
        out.append(float(loss.asnumpy()))
    return out


def run_load(case, rank, world):
    ref = mindone_way(case)
    got, read, want = our_way(case)
    values = {"ref/" + k: v for k, v in held(ref).items()}
    values.update({"got/" + k: v for k, v in held(got).items()})
    np.savez(os.path.join(OUT, f"{case['name']}_rank{rank}.npz"), **values)
    result = {"ref_losses": losses(ref, case, rank, world), "got_losses": losses(got, case, rank, world),
              "bytes_read": read, "block_bytes": want}
    with open(os.path.join(OUT, f"{case['name']}_rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _snapshot(net):
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def run_errors(case, rank, world):
    results = {}
    for check, (path, kwargs) in case["checks"].items():
        net = prepare_network(init_weights(TinyNet(), seed=0), 3, pad_uneven_params=True)
        if check == "one_rank":  # only rank 1 maps two names to one
            kwargs = {"name_map": (lambda n: "head.weight" if n.startswith("head.") else n) if rank == 1 else None}
        elif check == "name_map_dup":
            kwargs = {"name_map": lambda n: "head.weight" if n.startswith("head.") else n}
        before = _snapshot(net)
        error = None
        try:
            load_full_checkpoint(net, path, **kwargs)
        except Exception as err:  # noqa: BLE001 - recorded for the test
            error = f"{type(err).__name__}: {err}"
        after = _snapshot(net)
        unchanged = all(np.array_equal(before[k], after[k]) for k in before)
        results[check] = {"error": error, "unchanged": unchanged}
    with open(os.path.join(OUT, f"{case['name']}_rank{rank}.json"), "w") as f:
        json.dump(results, f)


def main():
    global OUT
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True)
    args = parser.parse_args()
    OUT = args.out
    rank, world = init_data_parallel()
    ms.set_context(mode=ms.GRAPH_MODE)
    for case in json.loads(args.cases):
        (run_errors if case["name"].startswith("errors") else run_load)(case, rank, world)
        print(f"rank {rank}: case {case['name']} done", flush=True)


OUT = None

if __name__ == "__main__":
    main()
