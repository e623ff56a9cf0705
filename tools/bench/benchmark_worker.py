"""For benchmarking: an msrun worker, started by the benchmark scripts.

msrun worker of ``tools/bench/benchmark.py``: every ZeRO stage of the config on the demo LM and,
at the world sizes the config's ``dense`` section names, on the Dense stack.

For each (model, stage) it builds the model afresh, wraps it with ``prepare_train_network``,
measures this rank's model-state bytes (``measure_model_states``) and runs ``warmup_steps``
optimizer steps (compilation); then it times ``timed_steps`` steps of every (model, stage) in
turns, and writes ``<out>/stage{s}_rank{r}.json`` (``stage3_keep_rank{r}.json`` for stage 3 with
``reshard_after_forward=False``, ``stage3_units_rank{r}.json`` with gather units,
``stage0_idle{k}_rank{r}.json`` for stage 0 with k idle all-reduces (``IdleCollectives``), ``dense_``
in front for the Dense stack; each rank pinned to a core with ``pin_ranks``): the bytes by kind,
the timed step durations, the shard layout of every parameter, and the library's ``CommPlan`` of
one optimizer step (``train_net.comm_plan``) and of one with a single micro-step (``plan_comm(1)``).

Usage (launched by tools/bench/benchmark.py): ``msrun ... tools/bench/benchmark_worker.py --config C --out DIR``
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Tuple

if __name__ == "__main__":  # MindSpore: errors only; must precede its import (an importer keeps its own)
    os.environ.setdefault("GLOG_v", "3")
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from mindone_zero import prepare_train_network  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.memory.measure import measure_model_states  # noqa: E402
from tools.bench.bench_common import load_benchmark_config, settings_of, setting_name  # noqa: E402
from tools import lm_model  # noqa: E402
from tools.bench import dense_model  # noqa: E402
from tools.bench.dense_model import DenseLoss, build_dense, dense_batch  # noqa: E402
from tools.lm_model import LMLoss, build_lm, init_lm_weights, reversal_batch  # noqa: E402


def _layout(train_net) -> list:
    """Per parameter: full shape, bytes per element, whether it is sharded, padded rows, whether
    stage 3 gathers it again in backward (``reshard_after_forward``) and the coalesced gather it
    shares (``TrainOneStepWrapper.param_gathers``)."""
    plan, shards = train_net.zero_plan, train_net.optimizer_shards  # [Note: train records] in train/train_plan.py
    return [{"name": p.name, "shape": list(s.shape), "itemsize": int(p.itemsize), "split": bool(s.split),
             "padded_shape": list(s.padded_shape) if s.shape else [],
             "coalesced": g["coalesced"], "regathered": g["regathered"]}
            for s, p, g in zip(plan.specs, shards.params, train_net.param_gathers())]


def plan_entries(train_net, micro_steps=None) -> list:
    """The library's ``CommPlan`` entries: of the train network's step, or of one of ``micro_steps``."""
    plan = train_net.comm_plan if micro_steps is None else train_net.plan_comm(micro_steps)
    return [list(e) for e in plan.entries]


def _classes(names, *modules) -> tuple:
    """The Cell classes called ``names``, each looked up in ``modules`` in order."""
    found = []
    for name in names:
        cls = next((getattr(m, name) for m in modules if isinstance(getattr(m, name, None), type)), None)
        if cls is None:
            raise ValueError(f"For 'benchmark_worker', the gather unit class {name!r} is in none of "
                             f"{[m.__name__ for m in modules]}.")
        found.append(cls)
    return tuple(found)


class _IdleAllReduces(nn.Cell):
    """``count`` 4-byte all-reduces, one after the other, after ``x`` is computed; returns ``x``
    untouched. Collective over the world group."""

    def __init__(self, count: int):
        super().__init__()
        self.count = count
        self.all_reduce = ops.AllReduce()
        self.one = Tensor([1.0], ms.float32)

    def construct(self, x):
        token = self.one
        for _ in range(self.count):
            token = self.all_reduce(ops.depend(token, x))  # runs once x is computed, and in sequence
        return ops.depend(x, token)


class _IdleAtBackward(nn.Cell):
    """Identity whose backward starts with ``count`` idle all-reduces on the incoming gradient."""

    def __init__(self, count: int):
        super().__init__()
        self.syncs = _IdleAllReduces(count)

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (self.syncs(dout),)


class IdleCollectives(nn.Cell):
    """A loss network with ``forward`` idle all-reduces before its forward starts (on its first
    input) and ``backward`` at the start of its backward, per call (micro-step), so that forward's
    compute lies between them, as between a unit's all-gather and reduce-scatter: stage 0 plus
    synchronisation and nothing else ("0 (+k idle collectives)" in ``tools/bench/benchmark.py``).
    Values are untouched."""

    def __init__(self, network: nn.Cell, forward: int, backward: int):
        super().__init__()
        self.network = network
        self.before_forward = _IdleAllReduces(forward)
        self.at_backward = _IdleAtBackward(backward)

    def construct(self, *inputs):
        first = self.before_forward(inputs[0])
        return self.at_backward(self.network(first, *inputs[1:]))


class LMWorkload:
    """The demo LM of the config's ``model``/``data`` sections, with the ``benchmark`` settings."""

    prefix = ""

    def __init__(self, cfg: dict, world: int):
        self.cfg = cfg
        bench = cfg["benchmark"]
        self.unit_names = list(bench.get("stage3_units") or [])
        self.units = _classes(self.unit_names, lm_model)
        self.accum, self.clip_grad = bench["gradient_accumulation_steps"], bench["clip_grad"]
        self.micro = bench["global_batch_size"] // (world * self.accum)

    def build(self):
        """(loss network, optimizer), with the same initial weights on every call."""
        bench = self.cfg["benchmark"]
        net = init_lm_weights(build_lm(self.cfg["model"]), bench["init_seed"])
        return LMLoss(net), nn.Adam(net.trainable_params(), learning_rate=bench["learning_rate"])

    def micro_batches(self, step: int, rank: int) -> list:
        """This rank's inputs for each micro-step of optimizer step ``step``."""
        data, model, bench = self.cfg["data"], self.cfg["model"], self.cfg["benchmark"]
        arrays = reversal_batch(data["seed"], step, bench["global_batch_size"], data["num_digits"],
                                model["vocab_size"])
        ks = [rank * self.accum + m for m in range(self.accum)]
        return [tuple(Tensor(a[k * self.micro:(k + 1) * self.micro]) for a in arrays) for k in ks]


class DenseWorkload:
    """The config's ``dense`` section: ``layers`` x Dense(width, width), AdamWeightDecay."""

    prefix = "dense_"

    def __init__(self, cfg: dict, world: int):
        self.cfg = cfg
        self.dense = cfg["dense"]
        self.unit_names = list(self.dense.get("stage3_units") or [])
        self.units = _classes(self.unit_names, dense_model, nn)
        self.accum, self.clip_grad = self.dense["gradient_accumulation_steps"], False
        self.world = world

    def build(self):
        """(loss network, optimizer), with the same initial weights on every call."""
        net = build_dense(self.dense["layers"], self.dense["width"], self.cfg["benchmark"]["init_seed"])
        return DenseLoss(net), nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-4)

    def micro_batches(self, step: int, rank: int) -> list:
        """This rank's inputs for each micro-step of optimizer step ``step``."""
        per_rank = self.dense["batch_per_rank"]
        x, y = dense_batch(self.cfg["data"]["seed"], step, per_rank * self.world * self.accum, self.dense["width"])
        ks = [rank * self.accum + m for m in range(self.accum)]
        return [(Tensor(x[k * per_rank:(k + 1) * per_rank]), Tensor(y[k * per_rank:(k + 1) * per_rank])) for k in ks]


class StageRun:
    """One stage's train network of one workload on this rank: built, measured, stepped on demand."""

    def __init__(self, workload, setting: tuple, rank: int, world: int, out: Path):
        stage, reshard, units, idle = setting
        self.workload, self.stage, self.reshard, self.rank, self.world = workload, stage, reshard, rank, world
        self.name = workload.prefix + setting_name(stage, reshard, units, idle)
        self.unit_names = workload.unit_names if units else None
        loss_net, optimizer = workload.build()
        if idle:  # idle // accum per micro-step, half of them in forward, half in backward
            per_pass = idle // (2 * workload.accum)
            loss_net = IdleCollectives(loss_net, per_pass, per_pass)
        self.train_net = prepare_train_network(
            loss_net, optimizer, zero_stage=stage, gradient_accumulation_steps=workload.accum,
            clip_grad=workload.clip_grad, reshard_after_forward=reshard,
            gather_units=(workload.units or None) if units else None,
            params_split_info=str(out / "params_info" / self.name),
        )
        self.train_net.set_train(True)
        self.memory = measure_model_states(self.train_net)
        self.times, self.losses, self.step = [], [], 0

    def run_step(self, timed: bool) -> None:
        """One optimizer step (``accum`` micro-steps); collective."""
        batches = self.workload.micro_batches(self.step, self.rank)
        t0 = time.perf_counter()
        for inputs in batches:
            loss, _, _ = self.train_net(*inputs)
            self.losses.append(float(loss.asnumpy()))  # asnumpy waits for the step to finish
        if timed:
            self.times.append(time.perf_counter() - t0)
        self.step += 1

    def write(self, out: Path) -> None:
        """Write this rank's results to ``out/{prefix}stage{s}[_keep]_rank{r}.json`` (atomically)."""
        helper = self.train_net.zero_helper
        result = {"stage": self.stage, "reshard_after_forward": self.reshard, "units": self.unit_names,
                  "world": self.world,
                  "rank": self.rank, "memory": self.memory,
                  "step_times": self.times, "losses": self.losses, "layout": _layout(self.train_net),
                  "comm_plan": plan_entries(self.train_net), "comm_plan_a1": plan_entries(self.train_net, 1),
                  "accum": self.workload.accum,
                  "clip_grad": self.workload.clip_grad, "effective_stage": int(helper.zero_stage)}
        path = out / f"{self.name}_rank{self.rank}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, path)


def workloads_for(cfg: dict, world: int) -> list:
    """The demo LM, and the Dense stack when ``world`` is one of ``dense.world_sizes``."""
    runs = [LMWorkload(cfg, world)]
    if cfg.get("dense") and world in cfg["dense"]["world_sizes"]:
        runs.append(DenseWorkload(cfg, world))
    return runs


def run_all(cfg: dict, rank: int, world: int, out: Path) -> None:
    """Build and warm up every (workload, stage), then time them in turns. Collective.

    Timed steps go round-robin over every workload and stage (LM stage 0, 1, 2, 3, Dense stage
    0, 1, 2, 3, LM stage 0, ...), so that a load change on a shared machine slows every stage
    alike instead of whichever ran at the time.
    """
    bench = cfg["benchmark"]
    runs = []
    for workload in workloads_for(cfg, world):
        for setting in settings_of(bench, idle=not workload.prefix):
            t0 = time.perf_counter()
            run = StageRun(workload, setting, rank, world, out)
            for _ in range(bench["warmup_steps"]):
                run.run_step(timed=False)
            runs.append(run)
            print(f"rank {rank}: {run.name} built and warmed up in {time.perf_counter() - t0:.1f}s", flush=True)
    for _ in range(bench["timed_steps"]):
        for run in runs:
            run.run_step(timed=True)
    for run in runs:
        run.write(out)


def pin_to_core(rank: int) -> int:
    """Bind every thread of this process, and so the threads it starts later, to one CPU core:
    ``rank`` modulo the cores this process may use. Returns the core."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except OSError:  # the thread ended in between
            pass
    return core


def start_worker(config_path: str) -> Tuple[dict, int, int]:
    """Under msrun: read the benchmark config, start data parallelism, pin this rank to a core
    (``pin_ranks``) and set the config's mode. Returns (config, rank, world size). Collective."""
    cfg = load_benchmark_config(config_path)
    rank, world = init_data_parallel()
    if cfg["benchmark"]["pin_ranks"]:
        pin_to_core(rank)
    ms.set_context(mode=ms.GRAPH_MODE if cfg["benchmark"]["mode"] == "graph" else ms.PYNATIVE_MODE)
    return cfg, rank, world


def main(argv=None) -> int:
    """Worker entry point (under msrun): every stage of ``--config``, results in ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    cfg, rank, world = start_worker(args.config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_all(cfg, rank, world, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
