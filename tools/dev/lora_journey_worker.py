"""For developers: the msrun worker of ``tools/dev/lora_journey.py`` (one rank of the LoRA journey).

Usage (launched by that tool): ``msrun ... tools/dev/lora_journey_worker.py --out DIR --src HF_FOLDER
--adapter ADAPTER --export EXPORT_DIR --steps K``

In GRAPH_MODE, on ``mindone.transformers``' ``LlamaForCausalLM`` and ``mindone.peft``, each order of the
issue's table as a user writes it (``ORDERS``), then stage 0 for the parity: build, PEFT, ZeRO, load,
fine-tune K steps with ``nn.SGD`` on this rank's micro-batches. The first order also exports the adapter
through ``gathered_parameters`` and ``save_pretrained``, and rank 0 saves the logits of the fixed input.
Every rank writes ``DIR/rank{r}.json``: per order the losses or the error, the frozen bytes it holds,
and the export's figures.
"""
import argparse
import json
import os
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

from mindone_zero import (gathered_parameters, load_full_checkpoint, prepare_network,  # noqa: E402
                          prepare_train_network, sharded_init)
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from tools.dev.hf_roundtrip_worker import CausalLMLoss, swap_ops_without_cpu_kernels  # noqa: E402
from tools.dev.lora_journey import LR, PREFIX, fixed_input, micro_batch  # noqa: E402


def _config(src):
    from transformers import LlamaConfig

    config = LlamaConfig.from_pretrained(src)
    config.use_cache = False
    return config


def _peft(model, adapter):
    from mindone.peft import PeftModel

    return PeftModel.from_pretrained(model, adapter, is_trainable=True)


def _train(peft_model, stage):
    loss = CausalLMLoss(peft_model.get_base_model())  # PeftModel.construct does not compile in GRAPH_MODE
    return prepare_train_network(loss, nn.SGD(loss.trainable_params(), learning_rate=LR), zero_stage=stage)


def order_peft_then_zero(args, stage):
    """1: the model under sharded_init, mindone.peft's adapter, ZeRO, then the base weights."""
    from mindone.transformers import LlamaForCausalLM

    with sharded_init():
        model = LlamaForCausalLM(_config(args.src))
    peft_model = _peft(model, args.adapter)
    train = _train(peft_model, stage)
    missing, unexpected = load_full_checkpoint(train, args.src, add_prefix=PREFIX)  # no name map
    return peft_model, train, {"missing": missing, "unexpected": unexpected}


def order_zero_then_peft(args, stage):
    """2: ZeRO first (prepare_network), then mindone.peft's adapter."""
    from mindone.transformers import LlamaForCausalLM

    with sharded_init():
        model = LlamaForCausalLM(_config(args.src))
    loss = prepare_network(CausalLMLoss(model), zero_stage=stage)
    peft_model = _peft(loss.net, args.adapter)
    return peft_model, _train(peft_model, stage), {}


def order_loaded_then_peft_then_zero(args, stage):
    """3: the Hugging Face habit: from_pretrained (every rank loads the whole base), the adapter, ZeRO."""
    from mindone.transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(args.src)
    peft_model = _peft(model, args.adapter)
    return peft_model, _train(peft_model, stage), {}


ORDERS = {"1_peft_zero_load": order_peft_then_zero, "2_zero_then_peft": order_zero_then_peft,
          "3_load_peft_zero": order_loaded_then_peft_then_zero}


def frozen_bytes(network, world) -> dict:
    """Frozen bytes this rank holds against the full ones, and which splittable frozen ones are split."""
    held = full = splittable = split = count = 0
    for p in network.get_parameters():
        if p.requires_grad:
            continue
        spec = getattr(p, "zero_spec", None)
        shape = tuple(spec.shape) if spec is not None else tuple(p.shape)
        count += 1
        held += p.nbytes
        full += int(np.prod(shape)) * p.itemsize
        if len(shape) >= 1 and shape[0] % world == 0:  # MindOne's split rule, the default
            splittable += 1
            split += int(spec is not None and spec.split)
    return {"frozen_params": count, "held": int(held), "full": int(full), "splittable": splittable, "split": split}


def vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def export_adapter(peft_model, export, rank) -> dict:
    """The issue's recipe; what rank 0 holds meanwhile (the network's bytes) and its peak."""
    base = peft_model.get_base_model()
    outside = sum(p.nbytes for p in base.get_parameters())
    adapter = peft_model.trainable_params()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = vm_hwm_kib()
    with gathered_parameters(adapter):
        inside = sum(p.nbytes for p in base.get_parameters())
        peft_model.save_pretrained(export, is_main_process=rank == 0)
    full_adapter = sum(int(np.prod(p.zero_spec.shape)) * p.itemsize if getattr(p, "zero_spec", None) is not None
                       else p.nbytes for p in adapter)
    largest = max(int(np.prod(getattr(p, "zero_spec", p).shape)) * p.itemsize for p in base.get_parameters())
    return {"network_bytes_outside": int(outside), "network_bytes_inside": int(inside),
            "adapter_full_bytes": int(full_adapter), "adapter_shard_bytes": int(sum(p.nbytes for p in adapter)),
            "largest_tensor_bytes": int(largest), "vm_hwm_rise_kib": vm_hwm_kib() - before,
            "adapter_params": len(adapter)}


def run_order(name, args, rank, world, stage=3) -> dict:
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        peft_model, train, load = ORDERS[name](args, stage)
    except Exception as err:  # noqa: BLE001 - what a user meets is the finding
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}",
                "where": traceback.format_exc().strip().splitlines()[-3][:300]}
    report = dict(load, frozen=frozen_bytes(train.network, world), stage=stage)
    report["losses"] = [float(train(ms.Tensor(micro_batch(step, rank)))[0].asnumpy()) for step in range(args.steps)]
    if name == "1_peft_zero_load" and stage == 3:
        logits = peft_model.get_base_model()(ms.Tensor(fixed_input()))[0].asnumpy()  # collective
        if rank == 0:
            np.save(os.path.join(args.out, "logits_stage3.npy"), logits)
        report["export"] = export_adapter(peft_model, args.export, rank)
    return report


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--out", "--src", "--adapter", "--export"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    swaps = swap_ops_without_cpu_kernels()
    rank, world = init_data_parallel()
    report = {"python": sys.executable, "swaps": swaps, "world": world}
    for name in ORDERS:
        report[name] = run_order(name, args, rank, world)
    report["stage0"] = run_order("1_peft_zero_load", args, rank, world, stage=0)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
