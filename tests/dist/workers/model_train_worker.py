"""msrun worker: MindOne's training loop, ``ms.Model(train_net).train(...)`` with callbacks (issue 20).

The script is written the way MindOne's example training scripts are, without importing MindOne:

* ``prepare_train_network`` with the script's own EMA class (``models.ScriptEMA``: MindOne's
  interface, swaps through ``set_data``), AdamWeightDecay over a learning-rate list (what MindOne's ``create_scheduler``
  returns), a ``DynamicLossScaleUpdateCell`` whose first scale overflows the fp16 layer;
* a ``GeneratorDataset`` sharded per rank, three epochs of three steps, ``dataset_sink_mode=False``;
* ``EvalSaveLike``: ``EvalSaveCallback``'s call pattern. Every ``save_every`` steps, every rank saves
  ``save_checkpoint(train_network)`` for resume; the ranks that save the network (rank 0 at stages
  0-2 and with ``combine_online``, every rank at stage 3 otherwise) save with the EMA swapped in:
  ``swap_before_eval``, save, ``swap_after_eval``. Every rank swaps at stage 3 and with
  ``shard_ema`` (collective there); at stage 3 with ``combine_online`` every rank then
  ``ops.AllGather``s each parameter whose ``parallel_optimizer`` is True and rank 0 saves the result
  (MindOne turns the online combine off when there is an EMA; here it gathers the EMA weights);
* ``StepRecorder`` reads what MindOne's callbacks read: ``cb_params.net_outputs``,
  ``train_network.optimizer.global_step`` and ``learning_rate``, ``scale_sense``; it checks that
  every trainable parameter moves on the step after a swap, and stops training early with
  ``run_context.request_stop()``;
* resume: a freshly built train network, ``ms.load_checkpoint`` of this rank's resume file,
  ``load_param_into_net``, then ``Model.train`` on the rest of the data.

Network: a Conv2d with 5 output channels in float16 (dim 0 does not divide by 2), a LayerNorm of 5,
a Dense(5, 8) and a Dense(8, 3) head: some parameters split at N=2 and some not.

Usage (under msrun): model_train_worker.py --out DIR --cases JSON. Each case: {"name", "mode",
"stage", "pad_uneven", "shard_ema", "combine_online", "callback_ranks": "mindone"|"rank0",
"offload", "resume_from": null | {"case": name, "step": k}} (k a multiple of STEPS_PER_EPOCH). Writes DIR/{name}_rank{r}.json and
the checkpoints under DIR/{name}/.
"""
import json
import logging
import os
import sys

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops
from mindspore.train.callback import Callback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from msrun_harness import worker_args  # noqa: E402
from models import ScriptEMA, SparseCELoss as LossNet  # noqa: E402

from mindone_zero import convert_checkpoints, prepare_train_network  # noqa: E402
from mindone_zero.checkpoint import gather_full_params  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402

BATCH, STEPS_PER_EPOCH, EPOCHS, STOP_AT, SAVE_EVERY = 4, 3, 3, 8, 3  # saves at steps 3 and 6
CLASSES = 3
EMA_DECAY = 0.8
KEEP_ALIVE = []  # MindSpore 2.10 caches parsed Cells by id: keep every case's Cells alive


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, pad_mode="same", has_bias=True).to_float(ms.float16)
        self.norm = nn.LayerNorm((5,))
        self.hidden = nn.Dense(5, 8)
        self.act = nn.GELU()
        self.head = nn.Dense(8, CLASSES)

    def construct(self, x):
        h = self.conv(x).astype(ms.float32).mean(axis=(2, 3))
        return self.head(self.act(self.hidden(self.norm(h))))


def build_net():
    """The same initial weights on every rank and in every case."""
    net = Net()
    rng = np.random.default_rng(0)
    for p in net.get_parameters():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.5).astype(np.float32), p.dtype))
    return net


class Samples:
    """The global data set; sharded per rank by GeneratorDataset."""

    def __init__(self, count):
        self.count = count

    def __getitem__(self, i):
        rng = np.random.default_rng(7919 * i + 1)
        return rng.standard_normal((3, 6, 6)).astype(np.float32), np.int32(rng.integers(0, CLASSES))

    def __len__(self):
        return self.count


def dataset(world, rank):
    """One epoch: STEPS_PER_EPOCH batches of BATCH samples per rank, the same every epoch."""
    data = ds.GeneratorDataset(Samples(world * BATCH * STEPS_PER_EPOCH), column_names=["x", "y"], shuffle=False,
                               num_shards=world, shard_id=rank)
    return data.batch(BATCH, drop_remainder=True)


def build_train(case, folder):
    net = build_net()
    loss_net = LossNet(net)
    ema = ScriptEMA(net, ema_decay=EMA_DECAY)
    steps = STEPS_PER_EPOCH * EPOCHS
    lrs = [0.02 * (1.0 - 0.05 * i) for i in range(steps)]  # what MindOne's create_scheduler returns
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=lrs, weight_decay=0.01)
    scale = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0 ** 30, scale_factor=2 ** 10, scale_window=1000)
    train = prepare_train_network(
        loss_net, opt, scale_sense=scale, ema=ema, zero_stage=case["stage"], clip_grad=True, clip_norm=1.0,
        optimizer_offload=bool(case.get("offload")), pad_uneven_params=bool(case.get("pad_uneven")),
        shard_ema=bool(case.get("shard_ema")), params_split_info=os.path.join(folder, "params_info"))
    KEEP_ALIVE.append((train, loss_net, ema))
    return train, net, ema


class StepRecorder(Callback):
    """What MindOne's callbacks read each step, whether the step after a swap moved every weight,
    and an early stop."""

    def __init__(self, net, log, offset):
        super().__init__()
        self.net, self.log, self.offset = net, log, offset
        self.after_swap = None

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        loss, overflow, scale = (x.asnumpy() for x in cb.net_outputs)
        opt = cb.train_network.optimizer
        step = int(opt.global_step.asnumpy().reshape(-1)[0])
        lr = float(opt.learning_rate(opt.global_step - 1).asnumpy().reshape(-1)[0]) if step > 0 else None
        self.log["steps"].append(dict(loss=float(loss), overflow=bool(overflow), scale=float(scale),
                                      global_step=step, lr=lr,
                                      scale_sense=float(cb.train_network.scale_sense.asnumpy())))
        if self.after_swap is not None and not bool(overflow):
            frozen = [p.name for p in self.net.trainable_params() if np.array_equal(p.asnumpy(), self.after_swap[p.name])]
            self.log["frozen_after_swap"].append(frozen)
            self.after_swap = None
        if cb.cur_step_num + self.offset >= STOP_AT:
            run_context.request_stop()

    def swapped(self):
        self.after_swap = {p.name: p.asnumpy().copy() for p in self.net.trainable_params()}


class EvalSaveLike(Callback):
    """MindOne's ``EvalSaveCallback`` call pattern (see the module docstring)."""

    def __init__(self, case, net, ema, folder, rank, recorder, offset):
        super().__init__()
        self.case, self.net, self.ema, self.folder, self.rank = case, net, ema, folder, rank
        self.recorder, self.offset = recorder, offset
        stage = case["stage"]
        self.combine = stage == 3 and bool(case.get("combine_online"))
        self.saves_network = rank == 0 or (stage == 3 and not self.combine)
        # at stage 3 every rank swaps (the online combine gathers the swapped-in EMA shards)
        self.swaps = self.saves_network or stage == 3 or bool(case.get("shard_ema"))

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        step = cb.cur_step_num + self.offset
        if step % SAVE_EVERY:
            return
        ms.save_checkpoint(cb.train_network, os.path.join(self.folder, f"train_resume_rank{self.rank}_s{step}.ckpt"))
        if self.swaps:
            trained = {p.name: p.asnumpy().copy() for p in self.net.trainable_params()}
            self.ema.swap_before_eval()
            differs = any(not np.array_equal(p.asnumpy(), trained[p.name]) for p in self.net.trainable_params())
        combined = self._combine_online() if self.combine else None
        if self.saves_network:
            to_save = combined or [{"name": p.name, "data": Tensor(p.asnumpy())} for p in self.net.trainable_params()]
            suffix = f"_op_rank_{self.rank}" if self.case["stage"] == 3 and not self.combine else ""
            ms.save_checkpoint(to_save, os.path.join(self.folder, f"net-s{step}{suffix}.ckpt"))
        if self.swaps:
            self.ema.swap_after_eval()
            restored = all(np.array_equal(p.asnumpy(), trained[p.name]) for p in self.net.trainable_params())
            self.recorder.log["swap_checks"].append({"ema_differs": differs, "restored": restored})
            self.recorder.swapped()

    def _combine_online(self):
        """MindOne's online combine: AllGather of every parameter whose parallel_optimizer is set."""
        gather = ops.AllGather()
        out = []
        for p in self.net.trainable_params():
            data = gather(p) if p.parallel_optimizer else p.value()
            out.append({"name": p.name, "data": Tensor(data.asnumpy())})
        return out


def callbacks_for(case, rank, net, ema, folder, log, offset):
    recorder = StepRecorder(net, log, offset)
    if case.get("callback_ranks") == "rank0" and rank != 0:
        return [recorder]
    return [recorder, EvalSaveLike(case, net, ema, folder, rank, recorder, offset)]


def resume_into(train, case, out, rank):
    """MindOne's resume: ms.load_checkpoint + load_param_into_net of this rank's resume file."""
    src = case["resume_from"]
    path = os.path.join(out, src["case"], f"train_resume_rank{rank}_s{src['step']}.ckpt")
    not_loaded, unused = ms.load_param_into_net(train, ms.load_checkpoint(path))
    return {"not_loaded": list(not_loaded), "unused": list(unused)}


def load_report(path):
    """Load a saved network checkpoint into a fresh, unsharded network."""
    fresh = LossNet(build_net())
    KEEP_ALIVE.append(fresh)
    try:
        not_loaded, unused = ms.load_param_into_net(fresh, ms.load_checkpoint(path), strict_load=True)
    except (RuntimeError, ValueError) as e:
        return {"error": str(e)[:500]}, None
    values = {p.name: p.asnumpy().tolist() for p in fresh.trainable_params()}
    return {"not_loaded": list(not_loaded), "unused": list(unused)}, values


def saved_networks(case, folder, rank, world):
    """{step: (load report, values)} of the network checkpoints this case saved (rank 0 reads)."""
    if rank != 0 or case.get("callback_ranks") == "rank0":  # rank 1 saved no network file there
        return {}
    out = {}
    first = case["resume_from"]["step"] if case.get("resume_from") else 0
    for step in range(first + SAVE_EVERY, STOP_AT + 1, SAVE_EVERY):
        if case["stage"] < 3 or case.get("combine_online"):
            path = os.path.join(folder, f"net-s{step}.ckpt")
        else:
            path = convert_checkpoints(os.path.join(folder, f"net-s{step}_op_rank_{{}}.ckpt"),
                                       os.path.join(folder, "params_info", "params_split_info_{}.json"), world)
        if os.path.exists(path):
            out[step] = load_report(path)
    return out


class WarningLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def run_case(case, out, rank, world):
    ms.set_context(mode=ms.GRAPH_MODE if case["mode"] == "graph" else ms.PYNATIVE_MODE)
    folder = os.path.join(out, case["name"])
    os.makedirs(folder, exist_ok=True)
    warnings = WarningLog()
    logging.getLogger("mindone_zero").addHandler(warnings)
    try:
        train, net, ema = build_train(case, folder)
    finally:
        logging.getLogger("mindone_zero").removeHandler(warnings)
    log = {"steps": [], "frozen_after_swap": [], "swap_checks": [], "warnings": warnings.messages}
    first = 0
    if case.get("resume_from"):
        log["resume"] = resume_into(train, case, out, rank)
        first = case["resume_from"]["step"]
    callbacks = callbacks_for(case, rank, net, ema, folder, log, first)
    ms.Model(train).train(EPOCHS - first // STEPS_PER_EPOCH, dataset(world, rank), callbacks=callbacks,
                          dataset_sink_mode=False)
    full = gather_full_params(train)
    log["full"] = {k: v.tolist() for k, v in full.items()}
    log["flags"] = {p.name: bool(p.parallel_optimizer) for p in net.trainable_params()}
    log["saved"] = {str(k): v for k, v in saved_networks(case, folder, rank, world).items()}
    with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
        json.dump(log, f)


def main():
    out, cases = worker_args()
    rank, world = init_data_parallel()
    for case in cases:
        run_case(case, out, rank, world)
        print(f"rank {rank}: case {case['name']} done", flush=True)


if __name__ == "__main__":
    main()
