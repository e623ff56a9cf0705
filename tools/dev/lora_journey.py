"""For developers: a LoRA fine-tune at ZeRO-3 as a new user writes it (issue 57), with its figures.

    /work/venvs/lora/bin/python tools/dev/lora_journey.py --out outputs/lora_journey

The journey, with two msrun workers in GRAPH_MODE (``tools/dev/lora_journey_worker.py``):

1. Here, ``transformers``' ``LlamaForCausalLM`` (torch, fixed seed, a tiny config: the one of
   ``tools/dev/hf_roundtrip.py``) is saved as a Hugging Face folder ``<out>/src``, and a ``peft`` LoRA
   adapter on ``q_proj`` and ``v_proj`` (r=4, alpha 8, both matrices random) as ``<out>/adapter``.
2. Each worker tries the orders of the issue's table with ``mindone.transformers`` and ``mindone.peft``
   (``PeftModel.from_pretrained(..., is_trainable=True)``), the loss Cell over ``get_base_model()``,
   ``nn.SGD`` on the trainable parameters and ``zero_stage=3``: (1) the model under ``sharded_init``,
   PEFT, ``prepare_train_network``, ``load_full_checkpoint(train_net, src, add_prefix="net.")`` (no
   name map); (2) ``prepare_network`` first, then PEFT; (3) ``from_pretrained`` on every rank, PEFT,
   ``prepare_train_network``. Each that builds fine-tunes ``--steps`` steps; order 1 also runs at stage
   0, exports the adapter with ``with gathered_parameters(peft_model.trainable_params()):
   peft_model.save_pretrained(export, is_main_process=rank == 0)`` and saves the logits of a fixed
   input (rank 0).
3. Here, torch's ``peft`` fine-tunes the same adapter on the global batches with ``torch.optim.SGD``,
   and ``peft.PeftModel.from_pretrained`` loads the export onto the source model: its logits against
   MindSpore's.

Prints the figures (which orders train, the frozen bytes each rank holds against full/N, the loss
differences against stage 0 and torch, the export's logits, what rank 0 held while exporting) with
the command, date, commit and machine, and writes them into ``<out>/lora_journey.json``.

Needs, beyond the project's environment: torch (a CPU build), ``transformers==4.57.1``, ``peft``,
``jinja2`` (``save_pretrained``'s model card), and ``mindone==0.5.0`` installed without its
dependencies plus the few it imports (omegaconf, sentencepiece, trampoline). Such an environment:

    python -m venv /work/venvs/lora && . /work/venvs/lora/bin/activate && pip install -e ".[test]"
    pip install torch==2.13.0 "transformers==4.57.1" "peft==0.17.1" jinja2 omegaconf sentencepiece trampoline
    pip install --no-deps mindone==0.5.0

The workers swap two ops without a CPU kernel in their own process (``swap_ops_without_cpu_kernels``
in ``tools/dev/hf_roundtrip_worker.py``). Not part of the test suite (it needs the extras above).
"""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.dev.hf_roundtrip import (PREFIX, WORLD, fixed_input, global_batch, make_source, max_abs,  # noqa: E402
                                    micro_batch, next_token_loss, stamp, torch_logits, worker_pythonpath)
from tools.dev.launch import run_msrun  # noqa: E402

__all__ = ["LR", "PREFIX", "fixed_input", "micro_batch"]

WORKER = "tools/dev/lora_journey_worker.py"
LR = 0.05
RANK, ALPHA, TARGETS = 4, 8, ["q_proj", "v_proj"]
GOALS = {"frozen over full/N": 1.05, "stage 0 (relative)": 1e-6, "torch peft": 1e-4, "logits": 1e-5}


def make_adapter(src: Path, folder: Path) -> None:
    """A torch ``peft`` LoRA adapter on the source model, both matrices random (``init_lora_weights=False``)."""
    import peft
    import torch
    import transformers

    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM.from_pretrained(str(src))
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0,
                             init_lora_weights=False)
    peft.get_peft_model(model, config).save_pretrained(str(folder))


def torch_peft_finetune(src: Path, adapter: Path, steps: int) -> list:
    """torch ``peft``'s fine-tune of the adapter on the global batches, ``torch.optim.SGD``: the losses."""
    import peft
    import torch
    import transformers

    model = peft.PeftModel.from_pretrained(transformers.LlamaForCausalLM.from_pretrained(str(src)), str(adapter),
                                           is_trainable=True)
    model.train()
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    losses = []
    for step in range(steps):
        sgd.zero_grad()
        loss = next_token_loss(model, global_batch(step))
        loss.backward()
        sgd.step()
        losses.append(float(loss.detach()))
    return losses


def load_export(src: Path, export: Path, ms_logits: np.ndarray) -> dict:
    """``peft.PeftModel.from_pretrained`` of the exported adapter: its logits against MindSpore's."""
    import peft
    import transformers

    model = peft.PeftModel.from_pretrained(transformers.LlamaForCausalLM.from_pretrained(str(src)), str(export))
    return {"files": sorted(os.listdir(export)), "logits_max_abs_diff": max_abs(torch_logits(model, fixed_input()),
                                                                                 ms_logits)}


def figures(reports: list, torch_losses: list, export: dict) -> dict:
    """The issue's goals, from the ranks' reports."""
    out = {"orders": {}}
    for name in ("1_peft_zero_load", "2_zero_then_peft", "3_load_peft_zero"):
        first = reports[0][name]
        if "error" in first:
            out["orders"][name] = {"trains": False, "error": first["error"]}
            continue
        losses = np.mean([r[name]["losses"] for r in reports], axis=0)
        frozen = [r[name]["frozen"] for r in reports]
        out["orders"][name] = {
            "trains": True, "losses": losses.tolist(),
            "frozen held per rank (B)": [f["held"] for f in frozen], "frozen full (B)": frozen[0]["full"],
            "held / (full/N)": max(f["held"] for f in frozen) / (frozen[0]["full"] / WORLD),
            "frozen split / splittable": f"{frozen[0]['split']} / {frozen[0]['splittable']} "
                                          f"(of {frozen[0]['frozen_params']})",
            "load (missing, unexpected)": [first.get("missing"), first.get("unexpected")],
        }
    stage0 = np.mean([r["stage0"]["losses"] for r in reports], axis=0)
    one = np.array(out["orders"]["1_peft_zero_load"]["losses"])
    out["loss vs stage 0 (max relative)"] = float(np.max(np.abs(one - stage0) / np.abs(stage0)))
    out["loss vs torch peft (max abs)"] = max_abs(one, torch_losses)
    if out["orders"]["3_load_peft_zero"].get("trains"):
        out["order 3 vs order 1 (max abs)"] = max_abs(out["orders"]["3_load_peft_zero"]["losses"], one)
    exported = reports[0]["1_peft_zero_load"]["export"]
    out["export"] = dict(exported, **export)
    out["rank 0 held while exporting, beyond its shards (B)"] = (exported["network_bytes_inside"]
                                                                 - exported["network_bytes_outside"])
    out["goals"] = GOALS
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/lora_journey")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    src, adapter, export, job = out / "src", out / "adapter", out / "export", out / "job"
    make_source(src)
    make_adapter(src, adapter)
    os.environ["PYTHONPATH"] = worker_pythonpath()
    run_msrun(WORKER, WORLD, job, ["--src", str(src), "--adapter", str(adapter), "--export", str(export),
                                   "--steps", str(args.steps)], timeout=args.timeout, caller="lora_journey")
    reports = [json.loads((job / f"rank{r}.json").read_text()) for r in range(WORLD)]
    result = figures(reports, torch_peft_finetune(src, adapter, args.steps),
                     load_export(src, export, np.load(job / "logits_stage3.npy")))
    result["stamp"] = stamp()
    text = json.dumps(result, indent=1)
    (out / "lora_journey.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
