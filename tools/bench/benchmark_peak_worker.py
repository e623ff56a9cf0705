"""For benchmarking: an msrun worker, started by the benchmark scripts.

msrun worker of ``tools/bench/benchmark_peak.py``: peak memory of training steps for one ZeRO setting.

Builds ``layers`` x ``nn.Dense(width, width)`` under a mean-squared-error loss, AdamWeightDecay,
wraps it with ``prepare_train_network(zero_stage, reshard_after_forward)``, then measures this
rank's peak memory over ``steps`` training steps (``mindone_zero.memory.measure.measure_peak_memory``,
first step's compilation included), above the memory in use just before the steps and above the
memory in use before the network was built (``memory_in_use``), and
writes ``<out>/<name>_rank{r}.json``: baseline/peak/growth bytes, model-state bytes by kind (and
where offloaded states live), the losses, each step's seconds, and the library's ``CommPlan`` of
one step. ``offload`` ("none", "cpu", "nvme") sets ``optimizer_offload``.

Model keys of the case (defaults: the Dense stack as ``tools/bench/benchmark_peak.py`` measures it):
``model`` "dense" (``layers`` x ``width``) or "lm" (``tools/lm_model.py``'s TransformerLM with
``vocab_size``, ``d_model``, ``n_layers``, ``d_ff``, ``n_heads``, ``num_digits``, on the
reversal task); ``init`` "seeded" (this tool's own weights) or "mindspore" (the Cells' default
initialisation); ``activation`` "none" or "gelu" between Dense layers; ``prepare_first`` (True:
``prepare_network`` before the optimizer is built, MindOne's order; False: the optimizer is built
on the whole network, as a script that calls ``prepare_train_network`` alone does).

Usage (launched by tools/bench/benchmark_peak.py):
``msrun ... tools/bench/benchmark_peak_worker.py --out DIR --case JSON``
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # MindSpore: errors only; must precede its import (an importer keeps its own)
    os.environ.setdefault("GLOG_v", "3")
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from mindone_zero import prepare_network, prepare_train_network  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.memory.measure import measure_model_states, measure_peak_memory, memory_in_use  # noqa: E402


class MSELoss(nn.Cell):
    """Mean squared error of ``net(x)`` against ``y``; the top Cell reads no parameter itself."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, y):
        return ((self.net(x) - y) ** 2).mean()


def build(layers: int, width: int, seed: int = 0, init: str = "seeded", activation: str = "none") -> nn.Cell:
    """``layers`` x Dense(width, width) under ``MSELoss``: deterministic weights (``init="seeded"``)
    or MindSpore's default ones ("mindspore"), with a GELU between layers (``activation="gelu"``)."""
    cells = []
    for i in range(layers):
        cells.append(nn.Dense(width, width))
        if activation == "gelu" and i + 1 < layers:
            cells.append(nn.GELU())
    net = nn.SequentialCell(cells)
    if init == "seeded":
        rng = np.random.default_rng(seed)
        for p in net.get_parameters():
            p.set_data(Tensor(rng.standard_normal(p.shape, dtype=np.float32) / np.float32(np.sqrt(width))))
    return MSELoss(net)


def build_case(case: dict, rank: int):
    """(loss network, inputs of one step) for the case's model keys (see the module docstring).
    MindSpore's default initialisers draw from its global seed, set here so that every rank and
    every setting starts from the same weights (and the last losses compare)."""
    ms.set_seed(0)
    if case.get("model", "dense") == "lm":
        from tools.lm_model import LMLoss, build_lm, reversal_batch

        digits = case["num_digits"]
        net = build_lm(dict(case, max_len=2 * digits))
        batch = reversal_batch(100 + rank, 0, case["micro_batch"], digits, case["vocab_size"])
        return LMLoss(net), [Tensor(a) for a in batch]
    loss_net = build(case["layers"], case["width"], init=case.get("init", "seeded"),
                     activation=case.get("activation", "none"))
    rng = np.random.default_rng(100 + rank)
    x = Tensor(rng.standard_normal((case["micro_batch"], case["width"])).astype(np.float32))
    y = Tensor(rng.standard_normal((case["micro_batch"], case["width"])).astype(np.float32))
    return loss_net, [x, y]


def offload_argument(case: dict, out: Path):
    """``optimizer_offload`` for the case's ``offload``: "none", "cpu" (host memory) or "nvme"
    (files under ``<out>/offload_states``, ``chunk_size`` bytes per chunk)."""
    offload = case.get("offload", "none")
    if offload == "nvme":
        return {"device": "nvme", "path": str(out / "offload_states"), "chunk_size": case["chunk_size"]}
    return offload == "cpu"


def run(case: dict, out: Path, rank: int, world: int) -> dict:
    ms.set_context(mode=ms.GRAPH_MODE if case["mode"] == "graph" else ms.PYNATIVE_MODE)
    before_build = memory_in_use()
    loss_net, inputs = build_case(case, rank)
    if case.get("prepare_first", True):
        # MindOne's order: shard first (stage 3; a no-op below), so that the optimizer states are
        # created at shard size instead of whole and then cut.
        loss_net = prepare_network(loss_net, case["stage"], reshard_after_forward=case["reshard_after_forward"])
    optimizer = nn.AdamWeightDecay(loss_net.trainable_params(), learning_rate=1e-4)
    train = prepare_train_network(loss_net, optimizer, zero_stage=case["stage"],
                                  reshard_after_forward=case["reshard_after_forward"],
                                  params_split_info=str(out / "params_info" / case["name"]),
                                  optimizer_offload=offload_argument(case, out))
    train.set_train(True)
    losses = []

    seconds = []

    def step():
        start = time.perf_counter()
        loss, _, _ = train(*inputs)
        losses.append(float(loss.asnumpy()))
        seconds.append(time.perf_counter() - start)

    peak = measure_peak_memory(step, steps=case["steps"])
    plan = train.comm_plan
    return {"rank": rank, "world": world, "case": case, "before_build_bytes": before_build,
            "baseline_bytes": peak.baseline_bytes,
            "peak_bytes": peak.peak_bytes, "growth_bytes": peak.growth_bytes, "source": peak.source,
            "model_states": measure_model_states(train), "losses": losses, "step_seconds": seconds,
            "comm": {k: {"calls": plan.count(k), "volume": plan.volume(k)} for k in ("all_gather", "reduce_scatter",
                                                                                     "all_reduce")}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", required=True, help="JSON: name, stage, reshard_after_forward, layers, width, ...")
    args = parser.parse_args()
    case, out = json.loads(args.case), Path(args.out)
    rank, world = init_data_parallel()
    result = run(case, out, rank, world)
    with open(out / f"{case['name']}_rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
