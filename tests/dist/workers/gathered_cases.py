"""The parity job's ``gathered`` cases (tests/dist/test_gathered.py): ``gathered_parameters`` and
``gather_full_params`` of some parameters, on the LoRA model of tests/lora_models.py at stage 3.

``run_gathered_case(case, out, rank, world)`` trains two steps in the case's mode, then records what
each call gives on this rank, in one JSON (arrays as lists) and the adapter file rank 0 saves inside
the block. Collective: every rank runs it.
"""
import os
import traceback

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from lora_models import build_own_lora
from models import LossNet, make_optimizer, micro_batch
from mindone_zero import (gather_full_params, gathered_parameters, load_train_state, prepare_network,
                          prepare_train_network, save_full_checkpoint, save_train_state)
from mindone_zero.core.partition import split_array


def _train(case, out, rank, world, steps=2):
    net = build_own_lora()
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), "momentum"), zero_stage=3,
                                  pad_uneven_params=True, clip_grad=True,
                                  params_split_info=os.path.join(out, f"{case['name']}_info"))
    train.set_train(True)
    for step in range(steps):
        ids, labels = micro_batch(step, rank, world, 0, 1)
        train(Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32))
    return net, train


def _error(fn):
    try:
        fn()
    except (TypeError, ValueError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def _enter(params, **kwargs):
    with gathered_parameters(params, **kwargs):
        pass


def _inside(net, params, out, rank, mode):
    """Shapes and values inside a block over ``params``, the network's bytes there, the adapter saved on rank 0."""
    seen = {}
    with gathered_parameters(params):
        for p in net.get_parameters():
            seen[p.name] = p.asnumpy().tolist()
        held = sum(p.nbytes for p in net.get_parameters())
        if rank == 0:
            ms.save_checkpoint([{"name": p.name, "data": p} for p in params], os.path.join(out, f"adapter_{mode}.ckpt"))
        for p in params:  # dropped on exit: no modifier_rank
            p.set_data(Tensor(np.full(p.shape, 7.0, np.float32)))
    return seen, int(held)


def _modified(net, rank, world):
    """``modifier_rank=1``: rank 1's values become everyone's shards; the others' are ignored."""
    weight = net.q_proj.base_layer.weight
    full = np.arange(int(np.prod(weight.zero_spec.shape)), dtype=np.float32).reshape(weight.zero_spec.shape)
    with gathered_parameters([weight], modifier_rank=1):
        weight.set_data(Tensor(full if rank == 1 else -full))
    expected = split_array(full, world, weight.zero_spec.rank)
    return bool(np.array_equal(weight.asnumpy(), expected))


def run_gathered_case(case, out, rank, world) -> dict:
    """The case's findings on this rank, or ``{"error": traceback}`` (the test fails with it; the job goes on)."""
    try:
        return _findings(case, out, rank, world)
    except Exception:  # noqa: BLE001 - reported to the test
        return {"error": traceback.format_exc()}


def _findings(case, out, rank, world) -> dict:
    ms.set_context(mode=ms.GRAPH_MODE if case["mode"] == "graph" else ms.PYNATIVE_MODE)
    net, train = _train(case, out, rank, world)
    adapter = net.trainable_params()
    ids, labels = micro_batch(2, rank, world, 0, 1)
    batch = (Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32))
    loss_before = float(train.network(*batch).asnumpy())  # the compiled loss network, on the shards
    before = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    shard_bytes = sum(p.nbytes for p in net.get_parameters())
    seen, held = _inside(net, adapter + [net.embed.embedding_table], out, rank, case["mode"])
    after = {p.name: p.asnumpy() for p in net.get_parameters()}
    other = prepare_network(nn.Dense(4, 4), zero_stage=3)
    stage1 = nn.Dense(4, 2)
    errors_before = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    errors = {
        "two_networks": _error(lambda: _enter(adapter + other.trainable_params())),
        "rank_out_of_range": _error(lambda: _enter(adapter, modifier_rank=world)),
        "not_parameters": _error(lambda: _enter([Tensor(np.ones(2, np.float32))])),
    }
    unchanged = all(np.array_equal(p.asnumpy(), errors_before[p.name]) for p in net.get_parameters())
    with gathered_parameters(stage1.trainable_params()):  # nothing of it is sharded: passes through
        whole = [tuple(p.shape) for p in stage1.trainable_params()]
    loss_after = float(train.network(*batch).asnumpy())  # the same graph, on the shards given back
    full = gather_full_params(train, rank0_only=True, trainable_only=True)
    named = gather_full_params(train, names=["net.head.weight"])
    # the frozen base in checkpoints: a per-rank save (resumed in one process by the test) and the export
    save_train_state(train, os.path.join(out, f"ckpt_{case['mode']}"), 2)
    save_full_checkpoint(train, os.path.join(out, f"export_{case['mode']}.ckpt"))
    resumed_net, resumed = _train(dict(case, name=case["name"] + "_resumed"), out, rank, world, steps=0)
    load_train_state(resumed, os.path.join(out, f"ckpt_{case['mode']}"))
    same_resumed = all(np.array_equal(a.asnumpy(), b.asnumpy())
                       for a, b in zip(net.get_parameters(), resumed_net.get_parameters()))
    return {
        "shapes_inside": {k: list(np.shape(v)) for k, v in seen.items()},
        "inside": {k: v for k, v in seen.items()},
        "held_inside": held, "held_outside": int(shard_bytes),
        "full_bytes": {p.name: int(np.prod(p.zero_spec.shape)) * p.itemsize for p in net.get_parameters()},
        "shard_bytes": {p.name: int(p.nbytes) for p in net.get_parameters()},
        "listed": [p.name for p in adapter] + [net.embed.embedding_table.name],
        "resharded": all(np.array_equal(after[k], before[k]) for k in before),
        "same_loss_after": loss_after == loss_before,
        "resumed_equal": same_resumed,
        "errors": errors, "unchanged_after_errors": unchanged, "whole": [list(s) for s in whole],
        "modifier": _modified(net, rank, world),
        "full_trainable": {k: v.tolist() for k, v in full.items()},
        "named": {k: v.tolist() for k, v in named.items()},
    }
