"""msrun worker of ``tools/benchmark.py``: every ZeRO stage of the config on the demo LM.

For each stage it builds the model afresh, wraps it with ``prepare_train_network``, measures
this rank's model-state bytes (``measure_model_states``) and runs ``warmup_steps`` optimizer
steps (compilation); then it times ``timed_steps`` steps per stage in turns, and writes
``<out>/stage{s}_rank{r}.json``: the bytes by kind, the timed step durations, the shard layout
of every parameter (for the communication model in ``tools/benchmark.py``) and the library's
own ``CommPlan`` when the train network has one.

Usage (launched by tools/benchmark.py): ``msrun ... tools/benchmark_worker.py --config C --out DIR``
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from mindone_zero import prepare_train_network  # noqa: E402
from mindone_zero.comm import init_data_parallel  # noqa: E402
from mindone_zero.memory_measure import measure_model_states  # noqa: E402
from tools.benchmark import load_benchmark_config  # noqa: E402
from tools.lm_model import LMLoss, build_lm, init_lm_weights, reversal_batch  # noqa: E402


def _layout(helper) -> list:
    """Per parameter: full shape, bytes per element, whether it is sharded, padded rows."""
    return [{"name": p.name, "shape": list(s.shape), "itemsize": int(p.itemsize), "split": bool(s.split),
             "padded_shape": list(s.padded_shape) if s.shape else []}
            for s, p in zip(helper.specs, helper.params)]


def _plan_entries(train_net) -> list:
    plan = getattr(train_net, "comm_plan", None)
    entries = getattr(plan, "entries", None) or []
    return [list(e) for e in entries]


class StageRun:
    """One stage's train network on this rank: built, measured, and stepped on demand."""

    def __init__(self, cfg: dict, stage: int, rank: int, world: int, out: Path):
        bench, model = cfg["benchmark"], cfg["model"]
        self.cfg, self.stage, self.rank, self.world = cfg, stage, rank, world
        self.accum = bench["gradient_accumulation_steps"]
        self.micro = bench["global_batch_size"] // (world * self.accum)
        net = init_lm_weights(build_lm(model), bench["init_seed"])
        optimizer = nn.Adam(net.trainable_params(), learning_rate=bench["learning_rate"])
        self.train_net = prepare_train_network(
            LMLoss(net), optimizer, zero_stage=stage, gradient_accumulation_steps=self.accum,
            clip_grad=bench["clip_grad"], params_split_info=str(out / "params_info" / f"stage{stage}"),
        )
        self.train_net.set_train(True)
        self.memory = measure_model_states(self.train_net)
        self.times, self.losses, self.step = [], [], 0

    def run_step(self, timed: bool) -> None:
        """One optimizer step (``accum`` micro-steps); collective."""
        data, model, bench = self.cfg["data"], self.cfg["model"], self.cfg["benchmark"]
        arrays = reversal_batch(data["seed"], self.step, bench["global_batch_size"], data["num_digits"],
                                model["vocab_size"])
        t0 = time.perf_counter()
        for m in range(self.accum):
            k = self.rank * self.accum + m
            loss, _, _ = self.train_net(*(Tensor(a[k * self.micro:(k + 1) * self.micro]) for a in arrays))
            self.losses.append(float(loss.asnumpy()))  # asnumpy waits for the step to finish
        if timed:
            self.times.append(time.perf_counter() - t0)
        self.step += 1

    def write(self, out: Path) -> None:
        """Write this rank's results to ``out/stage{s}_rank{r}.json`` (atomically)."""
        helper = self.train_net.zero_helper
        result = {"stage": self.stage, "world": self.world, "rank": self.rank, "memory": self.memory,
                  "step_times": self.times, "losses": self.losses, "layout": _layout(helper),
                  "comm_plan": _plan_entries(self.train_net), "accum": self.accum,
                  "clip_grad": self.cfg["benchmark"]["clip_grad"], "effective_stage": int(helper.zero_stage)}
        path = out / f"stage{self.stage}_rank{self.rank}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, path)


def run_all(cfg: dict, rank: int, world: int, out: Path) -> None:
    """Build and warm up every stage, then time them in turns. Collective.

    Timed steps go round-robin over the stages (stage 0, 1, 2, 3, 0, 1, ...), so that a load
    change on a shared machine slows every stage alike instead of whichever ran at the time.
    """
    bench = cfg["benchmark"]
    runs = []
    for stage in bench["stages"]:
        t0 = time.perf_counter()
        run = StageRun(cfg, stage, rank, world, out)
        for _ in range(bench["warmup_steps"]):
            run.run_step(timed=False)
        runs.append(run)
        print(f"rank {rank}: stage {stage} built and warmed up in {time.perf_counter() - t0:.1f}s", flush=True)
    for _ in range(bench["timed_steps"]):
        for run in runs:
            run.run_step(timed=True)
    for run in runs:
        run.write(out)


def main(argv=None) -> int:
    """Worker entry point (under msrun): every stage of ``--config``, results in ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    cfg = load_benchmark_config(args.config)
    rank, world = init_data_parallel()
    ms.set_context(mode=ms.GRAPH_MODE if cfg["benchmark"]["mode"] == "graph" else ms.PYNATIVE_MODE)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_all(cfg, rank, world, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
