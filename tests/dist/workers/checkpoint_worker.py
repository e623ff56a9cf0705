"""msrun worker for the checkpoint tests: train with save/resume per case, write per-rank results.

Usage (under msrun): checkpoint_worker.py --out DIR --cases JSON
Each case (keys with defaults in ``DEFAULTS``):
  name; stage; mode "graph"|"pynative"; accum; fmt "ckpt"|"safetensors"; net "tiny"|"even";
  pad: the padded split rule (pad_uneven_params; False: MindOne's rule, the library's default);
  hybrid: optimizer groups of 2 ranks, replicas over dp groups (world 4);
  ckpt: folder for save_train_state (relative to --out); saves: completed steps to save at;
  save_mid: [step, micro]: also save after that micro-step (mid-accumulation);
  load: folder to resume from (relative to --out; None trains from init_weights), load_step;
  end: train until this many optimizer steps are done;
  inject: {"kind": "raise"|"kill", "save": step, "rank": r}: that rank fails after writing its
          first file of that save (raise: the save fails on every rank and training goes on);
  full: write save_full_checkpoint(include_ema=True) to DIR/{name}_full.ckpt at the end;
  offload: None, "host" (optimizer_offload=True) or "file" (states in files under DIR/offload_states);
  frozen: names of parameters frozen (requires_grad=False) before the optimizer is built (a LoRA
          fine-tune's base: sharded at stage 3, never given an optimizer state);
  step_fault: {"step": s, "rank": r}: a state-file write of that rank fails with ENOSPC during step s
          (an offload "file" case); every rank then rebuilds, loads the latest checkpoint of ``ckpt``
          and trains on (events "step_errors" and "recovered_from").
Writes DIR/{name}_rank{r}.npz (losses per micro-step, gathered params and EMA, eval logits) and
DIR/{name}_rank{r}.json (events), the JSON rewritten after every step so a killed run leaves it.
Cases named "errors*" run the bad-input checks of ``checkpoint_errors.py`` instead.
"""
import argparse
import errno
import json
import os
import signal
import sys
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import LossNet, TinyNet, global_batch, init_weights, make_optimizer, micro_batch  # noqa: E402

from mindone_zero import EMA, create_hybrid_groups, prepare_train_network  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.offload import set_fault_hook  # noqa: E402
from mindone_zero.checkpoint import resume as ckpt_mod  # noqa: E402  (save_train_state looks its writer up there)
from mindone_zero.checkpoint import gather_full_params, load_train_state, save_full_checkpoint, save_train_state  # noqa: E402,E501

DEFAULTS = dict(mode="graph", accum=1, pad=True, fmt="ckpt", net="tiny", hybrid=False, ckpt=None, saves=(),
                save_mid=None, load=None, load_step=None, end=10, inject=None, full=False, offload=None, step_fault=None,
                frozen=())
KEEP_ALIVE = []  # train networks replaced after a failed step: MindSpore caches compiled Cells by id
EVAL_SEED = 99


class EvenNet(nn.Cell):
    """Dims 0 divide by 2 and 4, as MindOne's ZeRO needed (its JSON has no shape or padding)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.fc2 = nn.Dense(8, 4)
        self.act = nn.ReLU()

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class EvenLoss(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, target, factor):
        return ((self.net(x) - target) ** 2).mean() * factor


def even_batch(step, rank, world):
    rng = np.random.default_rng(500 + step)
    x, t = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    size = 8 // world
    return x[rank * size:(rank + 1) * size], t[rank * size:(rank + 1) * size]


def groups(case, rank, world):
    """(optimizer_parallel_group, dp_group) names; hybrid: groups {0,1},{2,3} share shards over {0,2},{1,3}
    (``create_hybrid_groups(2)``, which creates them on the first hybrid case only)."""
    if not case["hybrid"]:
        return None, None
    return create_hybrid_groups(2)


def build(case, rank, world, net=None):
    """A fresh train network for ``case`` (weights from the fixed seed)."""
    ms.set_context(mode=ms.GRAPH_MODE if case["mode"] == "graph" else ms.PYNATIVE_MODE)
    if case["net"] == "even":
        net = net or EvenNet()
        init_weights(net)
        loss_net = EvenLoss(net)
    else:
        net = init_weights(net or TinyNet())
        loss_net = LossNet(net)
    named = dict(net.parameters_and_names())  # names within the model, without the loss Cell's "net."
    for name in case["frozen"]:
        named[name].requires_grad = False
    opt = make_optimizer(net.trainable_params(), "adam")
    ema = EMA(net, ema_decay=0.9)
    op_group, dp_group = groups(case, rank, world)
    train = prepare_train_network(
        loss_net, opt, scale_sense=nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000), ema=ema,
        zero_stage=case["stage"], gradient_accumulation_steps=case["accum"], clip_grad=True, clip_norm=2.0,
        optimizer_parallel_group=op_group, dp_group=dp_group, pad_uneven_params=case["pad"],
        params_split_info=os.path.join(ARGS.out, "build_info", case["name"], str(rank)),
        optimizer_offload={"device": "nvme", "path": os.path.join(ARGS.out, "offload_states"), "chunk_size": 64}
        if case["offload"] == "file" else case["offload"] == "host",
    )
    train.set_train(True)
    return train


def batch(case, step, rank, world, micro):
    if case["net"] == "even":
        x, t = even_batch(step, rank, world)
        return Tensor(x), Tensor(t), Tensor(1.0, ms.float32)
    ids, labels = micro_batch(step, rank, world, micro, case["accum"])
    return Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32)


def install_fault(inject, rank):
    """Make this rank fail right after writing its first file of the save of step ``inject['save']``."""
    real = ckpt_mod.atomic_save_checkpoint
    state = {"armed": False}

    def faulty(params, path, format=None):  # noqa: A002
        out = real(params, path, format)
        if state["armed"]:
            if inject["kind"] == "kill":
                with open(os.path.join(ARGS.out, f"killed_rank{rank}.json"), "w") as f:
                    json.dump({"time": time.time(), "after": os.path.basename(path)}, f)
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(f"injected failure after writing {os.path.basename(path)}")
        return out

    ckpt_mod.atomic_save_checkpoint = faulty

    def arm(step):
        state["armed"] = inject is not None and inject["rank"] == rank and step == inject["save"]

    def restore():
        ckpt_mod.atomic_save_checkpoint = real

    return arm, restore


class Recorder:
    def __init__(self, case, rank):
        self.path = os.path.join(ARGS.out, f"{case['name']}_rank{rank}")
        self.events = {"losses": [], "saves": {}, "save_errors": {}, "loaded_step": None, "start": None}

    def flush(self):
        with open(self.path + ".json.tmp", "w") as f:
            json.dump(self.events, f)
        os.replace(self.path + ".json.tmp", self.path + ".json")


def save(case, train, rec, step, arm):
    arm(step)
    t0 = time.time()
    try:
        path = save_train_state(train, os.path.join(ARGS.out, case["ckpt"]), step, case["fmt"])
        rec.events["saves"][str(step)] = path
    except Exception as err:  # noqa: BLE001 - an injected failure, checked by the test
        rec.events["save_errors"][str(step)] = f"{type(err).__name__}: {err}"
    rec.events.setdefault("save_seconds", []).append(round(time.time() - t0, 3))
    arm(None)


def run_case(case, rank, world):
    case = dict(DEFAULTS, **case)
    rec = Recorder(case, rank)
    arm, restore = install_fault(case["inject"], rank)
    try:
        train_case(case, rec, arm, rank, world)
    finally:
        restore()


def install_step_fault(fault, rank):
    """Arm a state-file write failure (ENOSPC) for this rank at step ``fault['step']``; returns ``arm``."""
    state = {"step": None, "fired": False}

    def hook(name, offset):
        if fault is not None and state["step"] == fault["step"] and rank == fault["rank"] and not state["fired"]:
            state["fired"] = True  # once: the run resumed from the checkpoint goes through that step again
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    set_fault_hook(hook)
    return lambda step: state.update(step=step)


def train_case(case, rec, arm, rank, world):
    train = build(case, rank, world)
    step, micro0 = 0, 0
    if case["load"]:
        src = os.path.join(ARGS.out, case["load"])
        t0 = time.time()
        step = load_train_state(train, src, case["load_step"])
        rec.events["load_seconds"] = round(time.time() - t0, 3)
        with open(os.path.join(src, ckpt_mod.step_dir_name(step), "meta.json")) as f:
            micro0 = json.load(f)["accum_step"]
        rec.events["loaded_step"] = step
    rec.events["start"] = [step, micro0]
    arm_step_fault = install_step_fault(case["step_fault"], rank)
    t0 = time.time()
    try:
        while step < case["end"]:
            arm_step_fault(step)
            try:
                for micro in range(micro0, case["accum"]):
                    loss, _, _ = train(*batch(case, step, rank, world, micro))
                    rec.events["losses"].append([step, micro, float(loss.asnumpy())])
                    if case["save_mid"] == [step, micro]:
                        save(case, train, rec, step, arm)
            except (OSError, RuntimeError) as err:
                if case["step_fault"] is None:
                    raise
                rec.events.setdefault("step_errors", {})[str(step)] = f"{type(err).__name__}: {err}"
                KEEP_ALIVE.append(train)
                train = build(case, rank, world)
                step, micro0 = load_train_state(train, os.path.join(ARGS.out, case["ckpt"])), 0
                rec.events["recovered_from"] = step
                continue
            micro0, step = 0, step + 1
            rec.flush()
            if step in case["saves"]:
                save(case, train, rec, step, arm)
    finally:
        set_fault_hook(None)
    rec.events["train_seconds"] = round(time.time() - t0, 3)
    t0 = time.time()
    finish(case, train, rec, rank, world)
    rec.events["finish_seconds"] = round(time.time() - t0, 3)
    rec.flush()


def finish(case, train, rec, rank, world):
    """Gathered params/EMA, logits on a fixed batch (the whole network, gathered at stage 3)."""
    full = gather_full_params(train, include_ema=True)
    first = gather_full_params(train, rank0_only=True)
    rec.events["rank0_only_sizes"] = len(first)
    if case["net"] == "even":
        x = Tensor(np.random.default_rng(EVAL_SEED).standard_normal((3, 4)).astype(np.float32))
    else:
        x = Tensor(global_batch(EVAL_SEED)[0])
    ms.set_context(mode=ms.PYNATIVE_MODE)  # an eval graph would cost a compile; the values are the same
    logits = train.network.net(x).asnumpy()
    if case["full"]:
        save_full_checkpoint(train, os.path.join(ARGS.out, f"{case['name']}_full.ckpt"), include_ema=True)
    np.savez(rec.path + ".npz", logits=logits, **{"param/" + k: v for k, v in full.items()})
    rec.flush()


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True)
    ARGS = parser.parse_args()
    rank, world = init_data_parallel()
    for case in json.loads(ARGS.cases):
        t0, c0 = time.time(), time.process_time()
        if case["name"].startswith("errors"):
            import checkpoint_errors

            checkpoint_errors.run(case, ARGS.out, rank, world, lambda c, net=None: build(dict(DEFAULTS, **c), rank, world, net))
        else:
            run_case(case, rank, world)
        print(f"rank {rank}: case {case['name']} done in {time.time() - t0:.1f}s ({time.process_time() - c0:.1f}s CPU)",
              flush=True)


ARGS = None

if __name__ == "__main__":
    main()
