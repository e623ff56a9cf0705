"""msrun worker for ZeRO++ (tests/dist/test_zeropp.py): the demo LM at stage 3, GRAPH_MODE.

Cases (a JSON list from the test, run in order in one job; every rank writes
``<name>_rank<r>.json`` under --out):

* ``{"name", "model": "lm" | "lm_small" | "tiny", "steps", "zeropp": {...} | null, "hpz": bool,
  "reshard": bool (default true), "mode": "graph" (default) | "pynative", "lr": float (default 1e-3)}``: build the demo LM (``tools/lm_model.py``, the ``LM`` config
  below, or with ``LM_SMALL``'s changes) or ``tests/models.TinyNet`` (uneven
  shapes, Dense + Embedding + LayerNorm + Conv2d) at stage 3 and train ``steps`` optimizer steps
  (0: build only); ``hpz`` adds ``hpz_group`` = this rank's half of the world ({0..N/2-1} or
  {N/2..N-1}). Writes the loss of every step, a digest of every final full parameter (sha256 of
  its float32 bytes), the comm plan's entries, Φ (fp32 parameter bytes) and ``emulated``: the
  bytes of the int8 values and scales that ``quantize_blocks`` produces for every ZeRO++ gather
  on this rank's shard and gradient shapes (the tensors the CPU emulation moves, counted at 1 byte
  per int8 value, as natively), and of the float32 tensors of the parameters kept in full precision
  (computed from the gathers' own block layout, so not a measurement: tests/dist/test_comm_graph.py
  reads what the compiled graph sends), ``hpz_bytes`` (``memory_measure.hpz_secondary_bytes``) and
  ``quantized``: the full shapes of the parameters whose gathers quantize (by name).
* ``{"name": "errors"}``: bad ``zeropp`` values against a network that must stay unmodified.
"""
import hashlib
import json
import os
import time
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from mindspore.communication import create_group  # noqa: E402

from mindone_zero import create_hybrid_groups, gather_full_params, prepare_train_network  # noqa: E402
from mindone_zero.core.comm import init_data_parallel, world_group  # noqa: E402
from mindone_zero.memory.measure import hpz_secondary_bytes  # noqa: E402
from mindone_zero.core.quantize import quantize_blocks  # noqa: E402
from mindone_zero.zero3.state import zeropp_wrappers  # noqa: E402
from tests.models import LossNet, TinyNet, changed_params, init_weights, micro_batch, snapshot_params  # noqa: E402
from tests.msrun_harness import worker_args  # noqa: E402
from tools.lm_model import LMLoss, build_lm, init_lm_weights, reversal_batch  # noqa: E402

LM = {"vocab_size": 32, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128, "max_len": 16}  # train_lm.yaml
LM_SMALL = {"d_model": 32, "n_layers": 1}  # as tests/dist/test_train_tool.py: cheaper to compile and run
DIGITS, GLOBAL_BATCH = 8, 32
KEEP_ALIVE = []  # MindSpore keys parsed Cells by id: keep every case's Cells alive


def _loss_net(model):
    if model == "tiny":
        return LossNet(init_weights(TinyNet(with_scalar=False)))
    return LMLoss(init_lm_weights(build_lm(dict(LM, **LM_SMALL) if model == "lm_small" else LM), 0))


def _batch(model, step, rank, world):
    if model == "tiny":
        ids, labels = micro_batch(step, rank, world, 0, 1)
        return Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32)
    micro = GLOBAL_BATCH // world
    arrays = reversal_batch(1, step, GLOBAL_BATCH, DIGITS, LM["vocab_size"])
    return tuple(Tensor(a[rank * micro:(rank + 1) * micro]) for a in arrays)


def _build(model, zeropp, reshard, lr):
    loss_net = _loss_net(model)
    phi = sum(p.size * 4 for p in loss_net.trainable_params())
    optimizer = nn.AdamWeightDecay(loss_net.trainable_params(), learning_rate=lr, weight_decay=0.0)
    # TinyNet's shapes do not divide by 4 on purpose: it shards with the padded rule; the LM's do
    train = prepare_train_network(loss_net, optimizer, scale_sense=1024.0, clip_grad=True, clip_norm=1.0,
                                  zero_stage=3, zeropp=zeropp, reshard_after_forward=reshard,
                                  pad_uneven_params=model == "tiny")
    train.set_train(True)
    KEEP_ALIVE.append(train)
    return train, phi


def _emulated_bytes(train):
    """Native bytes of the tensors this rank's ZeRO++ gathers move, per kind: the quantized tensors
    ``quantize_blocks`` produces for the gathers' block layout, and the float32 tensors of the
    parameters kept in full precision ([Note: full-precision tensors] in zeropp.py)."""
    total = {"all_gather": 0, "all_to_all": 0, "reduce_scatter": 0}
    for wrapper in zeropp_wrappers(train.network).values():
        gather = wrapper.gather
        n = gather.group_size
        shard = Tensor(np.ones(gather.spec.shard_shape, np.float32))
        if gather.quantize_weights:
            q, s = quantize_blocks(shard.reshape(-1), gather.block, gather.blocks)
            total["all_gather"] += n * (q.size + 4 * s.size)  # the gathered result holds every rank's
        else:
            total["all_gather"] += n * shard.size * 4
        if gather.quantize_grads:
            full = Tensor(np.ones((n, shard.size), np.float32))
            q, s = quantize_blocks(full, gather.block, gather.blocks)
            total["all_to_all"] += q.size + 4 * s.size  # this rank's (N destinations, blocks) input
        else:
            total["reduce_scatter"] += n * shard.size * 4  # the padded full gradient
    return total


def _split_shapes(train):
    """Full shape of every split parameter of the ZeRO++ gathers, by name."""
    return {name: list(w.gather.spec.shape) for name, w in zeropp_wrappers(train.network).items() if w.gather.gathers}


def _quantized_shapes(train):
    """Full shape of every parameter whose ZeRO++ gather quantizes its weights or gradients, by name."""
    return {name: list(w.gather.spec.shape) for name, w in zeropp_wrappers(train.network).items()
            if w.gather.quantize_weights or w.gather.quantize_grads}


def run_train(case, rank, world, out):
    ms.set_context(mode=ms.PYNATIVE_MODE if case.get("mode") == "pynative" else ms.GRAPH_MODE)
    zeropp = dict(case["zeropp"]) if case["zeropp"] else None
    if case.get("hpz"):
        half = world // 2
        members = list(range(half)) if rank < half else list(range(half, world))
        name = f"hpz_{members[0]}"  # a contiguous half, named by its first rank: unique job-wide (groups.py)
        create_group(name, members)
        zeropp = dict(zeropp or {}, hpz_group=name)
    train, phi = _build(case["model"], zeropp, case.get("reshard", True), case.get("lr", 1e-3))
    losses, start = [], time.time()
    first = start
    for step in range(case["steps"]):
        loss, _, _ = train(*_batch(case["model"], step, rank, world))
        losses.append(float(loss.asnumpy()))
        if step == 0:
            first = time.time()
    full = gather_full_params(train) if case["steps"] else {}
    digests = {k: hashlib.sha256(np.ascontiguousarray(v, np.float32).tobytes()).hexdigest() for k, v in full.items()}
    plan = train.comm_plan
    result = {"losses": losses, "digests": digests, "plan": [list(e) for e in plan.entries], "phi": phi,
              "emulated": _emulated_bytes(train), "hpz_bytes": hpz_secondary_bytes(train),
              "quantized": _quantized_shapes(train), "split": _split_shapes(train),
              "seconds": {"first_step": first - start, "rest": time.time() - first}}
    _write(out, case["name"], rank, result)


def run_errors(case, rank, world, out):
    """Each bad value raises naming the argument and value, before the network is modified."""
    op_group, dp_group = create_hybrid_groups(world // 2)  # shards over each half, replicas across
    bad = [
        ("block_size", {"quantize_weights": True, "block_size": 0}, {}),
        ("block_size_negative", {"quantize_gradients": True, "block_size": -5}, {}),
        ("not_dividing", {"hpz_group": world_group()}, {"optimizer_parallel_group": op_group,
                                                              "dp_group": dp_group}),
        ("no_reshard", {"hpz_group": op_group}, {"reshard_after_forward": False}),
    ]
    results = {}
    for label, zeropp, kwargs in bad:
        loss_net = _loss_net("tiny")
        KEEP_ALIVE.append(loss_net)
        before = snapshot_params(loss_net)
        optimizer = nn.AdamWeightDecay(loss_net.trainable_params(), learning_rate=1e-3)
        try:
            prepare_train_network(loss_net, optimizer, zero_stage=3, zeropp=zeropp, **kwargs)
            message = None
        except (TypeError, ValueError) as err:
            message = f"{type(err).__name__}: {err}"
        changed = changed_params(loss_net, before)  # names, shapes, values, no shard spec
        results[label] = {"message": message, "unchanged": not changed, "changed": changed}
    _write(out, "errors", rank, results)


def _write(out, name, rank, result):
    path = Path(out) / f"{name}_rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)


def main():
    out, cases = worker_args()
    rank, world = init_data_parallel("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    for case in cases:
        (run_errors if case["name"] == "errors" else run_train)(case, rank, world, out)


if __name__ == "__main__":
    main()
