"""msrun worker: a training script written the way MindOne's examples are, run at stages 0-3.

What makes it MindOne-style (issue 9): the EMA is the script's own class with MindOne's
interface (not mindone_zero's), one Cell is marked ``recompute()``, and so is a Dense, the Conv is
cast to fp16 with ``to_float``, biases are opted out with ``parallel_optimizer = False``, every
rank reads other data, a Cell type of the script has a ZeRO-3 class written against MindOne's
constructor (``parallel_modules``), and after training the script evaluates with the EMA
weights swapped in, then swaps the trained weights back. A case with ``"op_group": true`` calls
``prepare_train_network`` as MindOne 0.2.0's scripts do, with ``op_group=`` naming a group of every
rank created by the script (issue 48).

Usage (under msrun): mindone_style_worker.py --out DIR --cases JSON
Each case: {"name", "mode": "graph"|"pynative", "stage", "fusion": bool, "optimizer": "adam"|"exp_adamw"|"sgd",
            "steps", "gradients_mean" (optional, default True), "lr" (optional), "op_group" (optional)}.
Writes DIR/{name}_rank{r}.npz (losses, evals, full params and EMA weights) and .json (flags).
Also DIR/errors_rank{r}.json: bad EMA / optimizer inputs, and whether anything was modified.
"""
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.communication import create_group, get_group_size

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from msrun_harness import worker_args  # noqa: E402
from models import FactoredOptimizer, ScriptEMA, SparseCELoss as LossNet, changed_params, snapshot_params  # noqa: E402

from mindone_zero import prepare_train_network  # noqa: E402
from mindone_zero.checkpoint import gather_full_params  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.zero3.layers import ZeroCell  # noqa: E402
from parallel_modules import ZeroParamWrapper  # noqa: E402

VOCAB, SEQ, EMB, CLASSES, CHANNELS = 11, 5, 6, 8, 3
BATCH_PER_RANK = 4
EMA_DECAY = 0.8
FUSION = {kind: {"openstate": True, "bucket_size": 300} for kind in ("allreduce", "reduce_scatter", "allgather")}
# Every case's networks stay alive to the end: MindSpore 2.10 caches what it parsed of a Cell by
# the object's id, and a Cell that reuses a freed Cell's id gets the stale entry (shard_network
# keeps the Cells it replaces alive for the same reason).
KEEP_ALIVE = []
OP_GROUP = "script_op_group"  # every rank, under the script's own name (not the world group's)


class EMAWithoutUpdate(nn.Cell):
    """Lacks ``ema_update``: prepare_train_network must refuse it before changing anything."""

    def __init__(self, network):
        super().__init__()
        self.net_weight = ParameterTuple(network.trainable_params())
        self.ema_weight = self.net_weight.clone(prefix="ema")
        self.updates = Parameter(Tensor(0.0, ms.float32), name="updates", requires_grad=False)

    def swap_before_eval(self):
        return True

    def swap_after_eval(self):
        return True


class ScaleShift(nn.Cell):
    """A layer of the script's own, with 8 rows: split at N=2 under MindOne's rule (the embedding's
    11 rows and the Conv's 3 output channels are not, and stay whole)."""

    def __init__(self, dim):
        super().__init__()
        self.weight = Parameter(Tensor(np.linspace(0.5, 1.5, dim).astype(np.float32)), name="weight")

    def construct(self, x):
        return x * self.weight


class ZeroScaleShift(nn.Cell):
    """ZeRO-3 version of ScaleShift written against MindOne's parallel-module constructor and
    MindOne's ZeroParamWrapper call; a no-op below stage 3."""

    def __init__(self, net, zero_stage=0, optimizer_parallel_group=None, cell_type=None):
        super().__init__(auto_prefix=False)
        self.net = net
        self.param_wrapper_w = nn.Identity()
        if zero_stage == 3:
            self.param_wrapper_w = ZeroParamWrapper(self.net.weight, zero_stage, optimizer_parallel_group, cell_type)

    def construct(self, x):
        return x * self.param_wrapper_w(self.net.weight)


class Block(nn.Cell):
    """Residual Dense + LayerNorm block, marked recompute() by the script."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm((dim,))
        self.dense = nn.Dense(dim, dim)
        self.act = nn.GELU()

    def construct(self, x):
        return x + self.act(self.dense(self.norm(x)))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        dim = CHANNELS * EMB
        self.embedding = nn.Embedding(VOCAB, EMB)
        self.conv = nn.Conv2d(1, CHANNELS, 3, pad_mode="same", has_bias=True).to_float(ms.float16)
        self.block = Block(dim)
        self.block.recompute()
        self.head = nn.Dense(dim, CLASSES)
        self.head.recompute()
        self.scale = ScaleShift(CLASSES)

    def construct(self, ids):
        x = self.embedding(ids)
        x = self.conv(x.reshape(x.shape[0], 1, SEQ, EMB)).astype(ms.float32)
        x = x.transpose(0, 2, 1, 3).reshape(x.shape[0], SEQ, CHANNELS * EMB)
        x = self.block(x).mean(axis=1)
        return self.scale(self.head(x))


def build_net():
    """The same initial weights on every rank; biases opted out of sharding, MindOne-style."""
    net = Net()
    rng = np.random.default_rng(0)
    for p in net.get_parameters():
        if p.name.endswith("weight") and "scale" in p.name:
            continue
        p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.4, p.dtype))
    for p in net.trainable_params():
        if p.name.endswith(".bias"):
            p.parallel_optimizer = False
    return net


def batch(step, rank, eval_batch=False):
    rng = np.random.default_rng(1000 * step + rank + (99991 if eval_batch else 0))
    ids = rng.integers(0, VOCAB, size=(BATCH_PER_RANK, SEQ)).astype(np.int32)
    labels = rng.integers(0, CLASSES, size=(BATCH_PER_RANK,)).astype(np.int32)
    return Tensor(ids), Tensor(labels)


def make_optimizer(name, params, lr):
    if name == "adam":
        return nn.Adam(params, learning_rate=lr)
    if name == "sgd":
        return nn.SGD(params, learning_rate=lr)
    if name == "exp_adamw":
        from mindspore.experimental.optim import AdamW

        return AdamW(params, lr=lr)
    raise ValueError(name)


def run_case(case, out, rank):
    ms.set_context(mode=ms.GRAPH_MODE if case["mode"] == "graph" else ms.PYNATIVE_MODE)
    ms.set_auto_parallel_context(gradients_mean=case.get("gradients_mean", True))
    net = build_net()
    loss_net = LossNet(net)
    ema = ScriptEMA(net, ema_decay=EMA_DECAY)  # the script's own EMA class
    opt = make_optimizer(case["optimizer"], net.trainable_params(), case.get("lr", 0.02))
    group = {"op_group": script_group()} if case.get("op_group") else {}  # MindOne 0.2.0's keyword
    train = prepare_train_network(
        loss_net, opt, ema=ema, zero_stage=case["stage"], comm_fusion=FUSION if case["fusion"] else None,
        parallel_modules={ScaleShift: ZeroScaleShift}, params_split_info=os.path.join(out, case["name"] + "_info"),
        **group,
    )
    ms.set_auto_parallel_context(gradients_mean=True)
    KEEP_ALIVE.append((train, loss_net, ema))
    train.set_train(True)
    losses = []
    for step in range(case["steps"]):
        loss, _, _ = train(*batch(step, rank))
        losses.append(float(loss.asnumpy()))
    loss_net.set_train(False)
    eval_ids, eval_labels = batch(0, rank, eval_batch=True)
    trained = float(loss_net(eval_ids, eval_labels).asnumpy())
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    ema.swap_before_eval()
    with_ema = float(loss_net(eval_ids, eval_labels).asnumpy())
    ema.swap_after_eval()
    back = float(loss_net(eval_ids, eval_labels).asnumpy())
    restored = all(np.array_equal(p.asnumpy(), before[p.name]) for p in net.trainable_params())
    full = gather_full_params(train, include_ema=True)
    meta = {
        "restored": restored,
        "used_parallel_module": any(isinstance(c, ZeroScaleShift) for _, c in net.cells_and_names()),
        "flags": {p.name: bool(p.parallel_optimizer) for _, p in train.parameters_and_names()},
        "split": {p.name: bool(getattr(p, "zero_spec", None) is not None and p.zero_spec.split)
                  for p in net.trainable_params()},
        "shapes": {p.name: list(p.shape) for _, p in train.parameters_and_names()},
        "zero_stage": train.zero_stage,
        "online_combine": online_combine_recipe(net) if case["stage"] == 3 else None,
        "op_group": train.zero_helper.op_group,
        "cell_groups": sorted({str(c.optimizer_parallel_group) for _, c in net.cells_and_names()
                               if isinstance(c, (ZeroCell, ZeroParamWrapper))}),
    }
    np.savez(os.path.join(out, f"{case['name']}_rank{rank}.npz"), losses=np.array(losses),
             evals=np.array([trained, with_ema, back]), **{"full/" + k: v for k, v in full.items()})
    with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
        json.dump(meta, f)


def script_group():
    """The script's group of every rank, created on first use (collective: every rank runs the same cases)."""
    if OP_GROUP not in KEEP_ALIVE:
        create_group(OP_GROUP, list(range(get_group_size())))
        KEEP_ALIVE.append(OP_GROUP)
    return OP_GROUP


def online_combine_recipe(net):
    """MindOne's documented online combine: all-gather the parameters whose parallel_optimizer
    says they are split, keep the others; rows past the full shape are our zero padding."""
    all_gather = ops.AllGather()
    out = {}
    for p in net.trainable_params():
        if p.parallel_optimizer:
            data = all_gather(p).asnumpy()[:p.zero_spec.shape[0]]
        else:
            data = p.asnumpy()
        out[p.name] = data.tolist()
    return out


def run_error_checks(out, rank):
    """Incompatible inputs raise before anything is modified (no sharding, no split-info file)."""
    results = {}
    for key, make in (("ema_without_update", lambda n: dict(ema=EMAWithoutUpdate(n))),
                      ("factored_optimizer", lambda n: dict(optimizer=FactoredOptimizer(n.trainable_params())))):
        net = build_net()
        kwargs = dict(optimizer=nn.Adam(net.trainable_params()))
        kwargs.update(make(net))
        loss_net = LossNet(net)
        before = snapshot_params(loss_net)
        info = os.path.join(out, f"errors_{key}_info")
        try:
            prepare_train_network(loss_net, zero_stage=3, params_split_info=info, **kwargs)
            message = None
        except (TypeError, ValueError) as e:
            message = f"{type(e).__name__}: {e}"
        changed = changed_params(loss_net, before)  # names, shapes, values, no shard spec
        results[key] = {"message": message, "unchanged": not changed, "changed": changed,
                        "no_file": not os.path.exists(info)}
    with open(os.path.join(out, f"errors_rank{rank}.json"), "w") as f:
        json.dump(results, f)


def main():
    out, cases = worker_args()
    rank, _ = init_data_parallel()
    run_error_checks(out, rank)
    for case in cases:
        run_case(case, out, rank)
        print(f"rank {rank}: case {case['name']} done", flush=True)


if __name__ == "__main__":
    main()
