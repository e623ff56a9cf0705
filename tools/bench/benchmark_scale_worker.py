"""For developers: the msrun worker of ``tools/bench/benchmark_scale.py``. One rank's peak memory
growth through a model's life at ZeRO stage 3, one way of doing it per job.

Usage (launched by benchmark_scale.py): ``msrun ... benchmark_scale_worker.py --out DIR --case JSON``
with the case keys ``way`` ("mindone", "sharded", "sharded_mindone_order" or "lora"), ``layers``, ``width``, ``steps``, ``pretrained``
(the full checkpoint to load) and ``export`` (the path the full model is exported to).

* ``mindone`` (MindOne's order, as its scripts do it): build the network eagerly, ``ms.load_checkpoint``
  the full file into it, build the optimizer on the full network, ``prepare_train_network``.
* ``sharded``: build under ``mindone_zero.sharded_init()``, ``prepare_network`` (each rank keeps its
  blocks), ``load_full_checkpoint`` into the shards, the optimizer, ``prepare_train_network``.
* ``sharded_mindone_order``: build under ``sharded_init()``, the optimizer on the full (unmaterialized)
  network, ``prepare_train_network``, then ``load_full_checkpoint`` into the train network.
* ``lora``: a LoRA fine-tune of the same model (``LoraDense`` on every layer, rank ``LORA_RANK``, the
  base frozen): as ``sharded``, with the optimizer on the adapters only, the checkpoint's names matched
  to PEFT's structure by ``load_full_checkpoint`` itself, and the adapter exported inside
  ``gathered_parameters`` (rank 0 saves it). Also records the frozen bytes the rank holds.

All then run ``steps`` training steps and ``save_full_checkpoint``. Each phase's growth is its peak
resident set (VmHWM, reset before the phase) above the resident set when it started
(``mindone_zero.memory.measure.measure_peak_memory``). Writes ``DIR/<way>_rank{r}.json``.
"""
import argparse
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # MindSpore: errors only; must precede its import (an importer keeps its own)
    os.environ.setdefault("GLOG_v", "3")
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from mindone_zero import (gathered_parameters, load_full_checkpoint, prepare_network,  # noqa: E402
                          prepare_train_network, save_full_checkpoint, sharded_init)
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from mindone_zero.memory.measure import measure_peak_memory, memory_in_use  # noqa: E402


class DenseStack(nn.Cell):
    """``layers`` x Dense(width, width) under a mean-squared-error loss (parameters ``net.<i>.*``)."""

    def __init__(self, layers: int, width: int):
        super().__init__()
        self.net = nn.SequentialCell([nn.Dense(width, width) for _ in range(layers)])

    def construct(self, x, y):
        return ((self.net(x) - y) ** 2).mean()


LORA_RANK = 8


class LoraDense(nn.Cell):
    """LoRA around a Dense in PEFT's structure: ``base_layer`` and ``CellDict``s of adapters, read
    through local variables (``lora_A = self.lora_A[name]``)."""

    def __init__(self, base: nn.Dense, r: int = LORA_RANK):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.CellDict({"default": nn.Dense(base.in_channels, r, has_bias=False)})
        self.lora_B = nn.CellDict({"default": nn.Dense(r, base.out_channels, has_bias=False, weight_init="zeros")})
        self.active_adapters = ["default"]

    def construct(self, x):
        result = self.base_layer(x)
        for name in self.active_adapters:
            lora_A, lora_B = self.lora_A[name], self.lora_B[name]
            result = result + lora_B(lora_A(x.astype(lora_A.weight.dtype)))
        return result


class LoraStack(DenseStack):
    """``DenseStack`` with LoRA of rank ``r`` on every layer, the base frozen (a LoRA fine-tune's model):
    parameters ``net.<i>.base_layer.*`` and ``net.<i>.lora_{A,B}.default.weight``."""

    def __init__(self, layers: int, width: int, r: int = LORA_RANK):
        nn.Cell.__init__(self)
        self.net = nn.SequentialCell([LoraDense(nn.Dense(width, width), r) for _ in range(layers)])
        for p in self.get_parameters():
            p.requires_grad = "lora_" in p.name


def frozen_bytes(net) -> tuple:
    """(bytes of frozen parameters this rank holds, their full bytes)."""
    frozen = [p for p in net.get_parameters() if not p.requires_grad]
    full = sum(int(np.prod(getattr(p, "zero_spec", p).shape)) * p.itemsize for p in frozen)
    return int(sum(p.nbytes for p in frozen)), int(full)


def mindone_load(path: str, net: nn.Cell) -> None:
    """``ms.load_checkpoint`` of the whole file into the full network (of each file of a sharded folder)."""
    if os.path.isdir(path):
        for name in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
            ms.load_checkpoint(os.path.join(path, name), net, format="safetensors")
    else:
        ms.load_checkpoint(path, net, format="safetensors" if path.endswith(".safetensors") else "ckpt")


def phases(case: dict, rank: int):
    """The way's phases in order, as (name, callable), and ``state``, where each callable keeps its
    result (``state["net"]``: the network)."""
    state = {}
    layers, width = case["layers"], case["width"]
    rng = np.random.default_rng(100 + rank)
    batch = [Tensor(rng.standard_normal((2, width)).astype(np.float32)) for _ in range(2)]

    def build():
        if case["way"] == "lora":
            with sharded_init():
                state["net"] = LoraStack(layers, width, case.get("lora_rank", LORA_RANK))
        elif case["way"] != "mindone":
            with sharded_init():
                state["net"] = DenseStack(layers, width)
        else:
            state["net"] = DenseStack(layers, width)

    def shard():
        state["net"] = prepare_network(state["net"], zero_stage=3)

    def load():
        if case["way"] != "mindone":  # the prepared network, or the train network
            load_full_checkpoint(state.get("train", state["net"]), case["pretrained"])
        else:
            mindone_load(case["pretrained"], state["net"])

    def prepare():
        opt = nn.AdamWeightDecay(state["net"].trainable_params(), learning_rate=1e-4)
        state["train"] = prepare_train_network(state["net"], opt, zero_stage=3)

    def train():
        out = None
        for _ in range(case["steps"]):
            out = state["train"](*batch)
        return out

    def export():
        if case["way"] != "lora":
            save_full_checkpoint(state["train"], case["export"])
            return
        adapter = state["net"].trainable_params()  # the adapter only, as PEFT's save_pretrained saves it
        with gathered_parameters(adapter):
            if rank == 0:
                ms.save_checkpoint([{"name": p.name, "data": p} for p in adapter], case["export"])

    steps = f"{case['steps']} train step{'s' if case['steps'] > 1 else ''}"
    if case["way"] in ("sharded", "lora"):
        return [("build", build), ("prepare_network", shard), ("load pretrained", load),
                ("optimizer + prepare_train_network", prepare), (steps, train), ("export", export)], state
    if case["way"] == "sharded_mindone_order":
        return [("build", build), ("optimizer + prepare_train_network", prepare), ("load pretrained", load),
                (steps, train), ("export", export)], state
    return [("build", build), ("load pretrained", load), ("optimizer + prepare_train_network", prepare),
            (steps, train), ("export", export)], state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", required=True)
    args = parser.parse_args()
    case = json.loads(args.case)
    ms.set_context(mode=ms.GRAPH_MODE)
    rank, _ = init_data_parallel()
    start = memory_in_use()
    result = {"phases": []}
    steps, state = phases(case, rank)
    for name, run in steps:
        peak = measure_peak_memory(run)
        result["phases"].append({"name": name, "growth": peak.growth_bytes, "peak": peak.peak_bytes})
        if "train step" in name:
            result["held_after_steps"] = memory_in_use() - start
    result["frozen_held"], result["frozen_full"] = frozen_bytes(state["net"])
    result["peak"] = max(p["peak"] for p in result["phases"]) - start
    with open(os.path.join(args.out, f"{case['way']}_rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
