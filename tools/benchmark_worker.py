"""msrun worker of ``tools/benchmark.py``: one ZeRO stage after another on the demo LM.

For each stage of the config it builds the model afresh, wraps it with
``prepare_train_network``, measures this rank's model-state bytes
(``measure_model_states``), runs ``warmup_steps + timed_steps`` optimizer steps and writes
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
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

from mindone_zero import prepare_train_network  # noqa: E402
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


def run_stage(cfg: dict, stage: int, rank: int, world: int, out: Path) -> None:
    """Build, measure and time one stage; write this rank's JSON. Collective."""
    bench, model, data = cfg["benchmark"], cfg["model"], cfg["data"]
    accum = bench["gradient_accumulation_steps"]
    net = init_lm_weights(build_lm(model), bench["init_seed"])
    optimizer = nn.Adam(net.trainable_params(), learning_rate=bench["learning_rate"])
    train_net = prepare_train_network(
        LMLoss(net), optimizer, zero_stage=stage, gradient_accumulation_steps=accum, clip_grad=bench["clip_grad"],
        params_split_info=str(out / "params_info" / f"stage{stage}"),
    )
    train_net.set_train(True)
    memory = measure_model_states(train_net)
    micro = bench["global_batch_size"] // (world * accum)
    times, losses = [], []
    for step in range(bench["warmup_steps"] + bench["timed_steps"]):
        arrays = reversal_batch(data["seed"], step, bench["global_batch_size"], data["num_digits"], model["vocab_size"])
        t0 = time.perf_counter()
        for m in range(accum):
            k = rank * accum + m
            loss, _, _ = train_net(*(Tensor(a[k * micro:(k + 1) * micro]) for a in arrays))
            losses.append(float(loss.asnumpy()))  # asnumpy waits for the step to finish
        if step >= bench["warmup_steps"]:
            times.append(time.perf_counter() - t0)
    result = {"stage": stage, "world": world, "rank": rank, "memory": memory, "step_times": times,
              "losses": losses, "layout": _layout(train_net.zero_helper), "comm_plan": _plan_entries(train_net),
              "accum": accum, "clip_grad": bench["clip_grad"],
              "effective_stage": int(train_net.zero_helper.zero_stage)}
    path = out / f"stage{stage}_rank{rank}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    cfg = load_benchmark_config(args.config)
    ms.set_device("CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_context(mode=ms.GRAPH_MODE if cfg["benchmark"]["mode"] == "graph" else ms.PYNATIVE_MODE)
    rank, world = get_rank(), get_group_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stage in cfg["benchmark"]["stages"]:
        t0 = time.perf_counter()
        run_stage(cfg, stage, rank, world, out)
        print(f"rank {rank}: stage {stage} done in {time.perf_counter() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
