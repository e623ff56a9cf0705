"""For developers: a user's whole Hugging Face journey with the real libraries, and its figures.

    /tmp/hfvenv/bin/python tools/dev/hf_roundtrip.py --out outputs/hf_roundtrip

The journey, with two msrun workers in GRAPH_MODE (``tools/dev/hf_roundtrip_worker.py``):

1. Here, ``transformers``' ``LlamaForCausalLM`` (torch, fixed seed, a tiny config) is saved with
   ``save_pretrained(max_shard_size=...)`` into ``<out>/src``: several safetensors files, their
   index, ``config.json``, ``generation_config.json`` and a tokenizer (a ``tokenizers`` WordLevel
   model wrapped in ``PreTrainedTokenizerFast``, made offline).
2. Each worker builds ``mindone.transformers``' ``LlamaForCausalLM`` from that config under
   ``mindone_zero.sharded_init()``, wraps it in a next-token cross-entropy loss Cell (prefix
   ``net.``), builds ``nn.AdamWeightDecay`` on the whole network and calls
   ``prepare_train_network(zero_stage=3)``, then ``load_full_checkpoint(train_net, src,
   add_prefix="net.")``.
3. It fine-tunes ``--steps`` steps (each rank its own micro-batch), then does the same at stage 0
   with a second network built and loaded the same way. Here, torch fine-tunes the source model on
   the global batch (the ranks' micro-batches together) twice: with MindSpore's
   ``AdamWeightDecay`` rule written in torch (no bias correction, eps added to sqrt(v)), and with
   ``torch.optim.AdamW`` (bias-corrected, for contrast). Weight decay is 0 in all of them.
4. Each stage's network is exported with ``save_full_checkpoint(dtype="fp32"|"bf16",
   max_shard_size=..., strip_prefix="net.", copy_files_from=src)`` into ``<out>/export``.
5. Here, ``transformers.LlamaForCausalLM.from_pretrained`` loads the fp32 export (missing,
   unexpected and mismatched keys, logits against the MindSpore fine-tuned model's) and the bf16
   one (equal to the fp32 export rounded to bf16?), and the tokenizer is loaded from the export.

Prints a plain text table of every figure, stamped with the command, date, commit and machine,
and writes the same into ``<out>/hf_roundtrip.txt`` and ``<out>/hf_roundtrip.json``.

Needs, beyond the project's own environment: torch (a CPU build), ``transformers==4.57.1`` and
``mindone==0.5.0`` installed without its dependencies, plus the few it imports (omegaconf,
sentencepiece). Such an environment, sharing the system's MindSpore and numpy<2:

    python -m venv --system-site-packages /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    /tmp/hfvenv/bin/pip install transformers==4.57.1 omegaconf sentencepiece
    /tmp/hfvenv/bin/pip install --no-deps mindone==0.5.0

msrun starts its workers with the ``python`` of the system, so this tool puts its own
site-packages on the workers' ``PYTHONPATH``; each worker reports the interpreter and the
``mindone`` it ran with. Not part of the test suite (it needs the extras above).
"""
import argparse
import datetime
import json
import os
import shlex
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench.report import COMMIT_AT_START, LOAD_AT_START, default_command, machine  # noqa: E402
from tools.dev.launch import run_msrun  # noqa: E402

WORKER = "tools/dev/hf_roundtrip_worker.py"
WORLD = 2
CONFIG = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, initializer_range=0.1,
              bos_token_id=1, eos_token_id=2, pad_token_id=None)
SEED = 0
SEQ = 8
MICRO_BATCH = 2  # sequences per rank and step
STRIDE = 3  # the training data's next token: this token + STRIDE
LR, BETA1, BETA2, EPS = 5e-3, 0.9, 0.999, 1e-6  # MindSpore AdamWeightDecay's defaults for the betas and eps
SOURCE_SHARD_SIZE = "20KB"  # the 12 KB embedding and head, ~30 KB per layer: five files
EXPORT_SHARD_SIZE = 20000
PREFIX = "net."  # the loss Cell's attribute holding the model
LOGITS_GOAL = 1e-5
TOKENIZER_TEXT = "w1 w5 w7 w11 unknown w90"


# ----------------------------------------------------------------------------- shared with the worker


def fixed_input() -> np.ndarray:
    """The (2, SEQ) int32 ids every logits comparison uses."""
    return np.random.default_rng(7).integers(0, CONFIG["vocab_size"], size=(2, SEQ)).astype(np.int32)


def micro_batch(step: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s (MICRO_BATCH, SEQ) int32 ids at ``step``: runs ``start, start + STRIDE, ...``
    (mod the vocabulary) from random starts, a pattern the model can learn in a few steps."""
    starts = np.random.default_rng(1000 + step * WORLD + rank).integers(0, CONFIG["vocab_size"], (MICRO_BATCH, 1))
    return ((starts + STRIDE * np.arange(SEQ)) % CONFIG["vocab_size"]).astype(np.int32)


def global_batch(step: int) -> np.ndarray:
    """Every rank's micro-batch at ``step``, in rank order."""
    return np.concatenate([micro_batch(step, r) for r in range(WORLD)])


# ----------------------------------------------------------------------------- 1. the source folder


def write_tokenizer(folder: Path) -> bool:
    """A WordLevel tokenizer over "w0".."w92" and three special tokens, saved into ``folder``;
    built offline from ``tokenizers``. False where that package cannot make it."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return False
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i + 3 for i in range(CONFIG["vocab_size"] - 3)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))
    return True


def make_source(src: Path) -> dict:
    """The seeded torch model saved as a sharded Hugging Face folder, with a tokenizer."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    model.save_pretrained(str(src), max_shard_size=SOURCE_SHARD_SIZE)
    tokenizer = write_tokenizer(src)
    return {"files": sorted(os.listdir(src)), "tokenizer": tokenizer,
            "weight_files": len([f for f in os.listdir(src) if f.endswith(".safetensors")])}


# ----------------------------------------------------------------------------- torch's side


def torch_logits(model, ids: np.ndarray) -> np.ndarray:
    import torch

    model.eval()
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()


def next_token_loss(model, ids: np.ndarray):
    """Mean next-token cross-entropy of ``model`` on ``ids`` (a torch scalar with its graph)."""
    import torch

    ids = torch.tensor(ids, dtype=torch.long)
    logits = model(ids).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def mindspore_adam_weight_decay_rule(params):
    """A step function applying ``mindspore.nn.AdamWeightDecay``'s update (weight decay 0) to
    ``params``: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= lr m / (sqrt(v) + eps), with no
    bias correction (its documented formula and ``_update_run_op`` in mindspore/nn/optim/adam.py)."""
    import torch

    states = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]

    def step():
        with torch.no_grad():
            for p, (m, v) in zip(params, states):
                m.copy_(BETA1 * m + (1 - BETA1) * p.grad)
                v.copy_(BETA2 * v + (1 - BETA2) * p.grad * p.grad)
                p.sub_(LR * (m / (v.sqrt() + EPS)))
    return step


def torch_finetune(src: Path, steps: int, rule: str) -> dict:
    """Fine-tune the source model on the global batches; ``rule`` "mindspore" (AdamWeightDecay's
    update written in torch) or "adamw" (``torch.optim.AdamW``). Losses, final logits and weights."""
    import torch
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(str(src))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if rule == "mindspore":
        step_fn = mindspore_adam_weight_decay_rule(params)
    else:
        adamw = torch.optim.AdamW(params, lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=0.0)
        step_fn = adamw.step
    losses = []
    for step in range(steps):
        model.zero_grad()
        loss = next_token_loss(model, global_batch(step))
        loss.backward()
        step_fn()
        losses.append(float(loss.detach()))
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return {"losses": losses, "logits": torch_logits(model, fixed_input()), "weights": weights}


# ----------------------------------------------------------------------------- 2-4. the msrun job


def worker_pythonpath() -> str:
    """This interpreter's own site-packages (torch, transformers, mindone) before the caller's
    PYTHONPATH: msrun starts workers with the system's ``python``, which lacks them."""
    own = sysconfig.get_paths()["purelib"]
    return os.pathsep.join([own] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def run_job(out: Path, src: Path, export: Path, steps: int, timeout: float) -> list:
    """The two-rank job; returns each rank's report."""
    os.environ["PYTHONPATH"] = worker_pythonpath()
    job = out / "job"
    run_msrun(WORKER, WORLD, job, ["--src", str(src), "--export", str(export), "--steps", str(steps)],
              timeout=timeout, caller="hf_roundtrip")
    return [json.loads((job / f"rank{r}.json").read_text()) for r in range(WORLD)]


# ----------------------------------------------------------------------------- 5. back in transformers


def max_abs(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def load_export(folder: Path, ms_logits: np.ndarray) -> dict:
    """``from_pretrained`` of the fp32 export: loading info and logits against MindSpore's."""
    import transformers

    model, info = transformers.LlamaForCausalLM.from_pretrained(str(folder), output_loading_info=True)
    info = {k: [str(x) for x in v] for k, v in info.items()}
    return {"info": info, "logits_max_abs_diff": max_abs(torch_logits(model, fixed_input()), ms_logits),
            "model": model}


def bf16_is_fp32_rounded(fp32_model, bf16_folder: Path) -> dict:
    """``from_pretrained(dtype=bfloat16)`` of the bf16 export against the fp32 export rounded."""
    import torch
    import transformers

    half = transformers.LlamaForCausalLM.from_pretrained(str(bf16_folder), dtype=torch.bfloat16)
    want, got = fp32_model.state_dict(), half.state_dict()
    differ = [k for k, v in want.items() if not torch.equal(got[k], v.to(torch.bfloat16))]
    dtypes = sorted({str(v.dtype) for v in got.values()})
    return {"equal": not differ and sorted(got) == sorted(want), "differing": differ, "dtypes": dtypes}


def folder_tensors(folder: Path) -> dict:
    """{name: raw bytes, dtype and shape} of every tensor of a sharded safetensors folder."""
    from safetensors import safe_open

    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with safe_open(str(folder / name), framework="pt") as f:
                for key in f.keys():
                    t = f.get_tensor(key)
                    out[key] = (str(t.dtype), tuple(t.shape), t.contiguous().view(-1).view(dtype=_int_of(t)).numpy()
                                .tobytes())
    return out


def _int_of(t):
    import torch

    return {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def same_export(a: Path, b: Path) -> dict:
    """Whether two export folders hold the same tensors bit for bit, and the same files byte for byte."""
    ta, tb = folder_tensors(a), folder_tensors(b)
    files = sorted(os.listdir(a)) == sorted(os.listdir(b)) and all(
        (a / f).read_bytes() == (b / f).read_bytes() for f in os.listdir(a))
    return {"tensors_equal": ta == tb, "files_identical": files,
            "differing": sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k))}


def tokenizer_check(src: Path, export: Path):
    """Whether the export's tokenizer loads and encodes TOKENIZER_TEXT as the source's does."""
    from transformers import AutoTokenizer

    if not (src / "tokenizer.json").exists():
        return None
    a = AutoTokenizer.from_pretrained(str(src))(TOKENIZER_TEXT)["input_ids"]
    b = AutoTokenizer.from_pretrained(str(export))(TOKENIZER_TEXT)["input_ids"]
    return {"ids": b, "same_as_source": a == b}


# ----------------------------------------------------------------------------- 6. the figures


def stamp() -> dict:
    """Command (with this interpreter), date, commit, versions and machine, as tools/bench/report.py
    stamps a page."""
    command = [sys.executable, *default_command()[1:]]
    versions = {}
    for name in ("mindspore", "torch", "transformers", "mindone", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {"command": shlex.join(command), "date (UTC)": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M"), "commit": COMMIT_AT_START, "versions": versions, "machine": machine(),
            "load average (1 min) before the run": LOAD_AT_START}


def loss_figures(reports: list, torch_runs: dict) -> dict:
    """Per-step losses (the ranks' mean) at stages 3 and 0 and in torch, and their differences."""
    per_rank = {s: np.array([r["stages"][s]["losses"] for r in reports]) for s in ("3", "0")}
    stage3, stage0 = per_rank["3"].mean(0), per_rank["0"].mean(0)
    out = {"stage 3 losses (mean of ranks)": stage3.tolist(), "stage 0 losses (mean of ranks)": stage0.tolist(),
           "stage 3 vs stage 0, max |diff| over ranks and steps": max_abs(per_rank["3"], per_rank["0"]),
           "stage 3 == stage 0 exactly (every rank, every step)": bool(np.array_equal(per_rank["3"], per_rank["0"]))}
    for rule, label in (("mindspore", "torch, AdamWeightDecay's rule"), ("adamw", "torch.optim.AdamW")):
        out[f"{label} losses (global batch)"] = torch_runs[rule]["losses"]
        out[f"{label} vs stage 3, max |diff|"] = max_abs(torch_runs[rule]["losses"], stage3)
    return out


def job_figures(reports: list, source_logits: np.ndarray, job: Path) -> dict:
    """What the workers saw: interpreter, swaps, the Embedding's ZeRO-3 Cell, the loads."""
    first = reports[0]
    out = {"worker python": sorted({r["python"] for r in reports}), "worker mindone": first["mindone"],
           "swaps (worker process only)": first["swaps"],
           "PARALLEL_MODULES[mint.nn.Embedding]": first["parallel_modules_embedding"]}
    for s in ("3", "0"):
        out[f"stage {s}: embed_tokens after prepare"] = first["stages"][s]["embed_cell"]
        out[f"stage {s}: load missing (all ranks)"] = sorted({n for r in reports for n in r["stages"][s]["missing"]})
        out[f"stage {s}: load unexpected (all ranks)"] = sorted(
            {n for r in reports for n in r["stages"][s]["unexpected"]})
        loaded = np.load(job / f"logits_stage{s}_loaded.npy")
        out[f"stage {s}: loaded logits vs torch source, max |diff|"] = max_abs(loaded, source_logits)
        out[f"stage {s}: seconds (build+prepare, load, fine-tune, export)"] = first["stages"][s]["seconds"]
    return out


def export_figures(export: Path, src: Path, job: Path, torch_runs: dict) -> dict:
    """from_pretrained of the exports, the bf16 rounding, stage 3 against stage 0, the tokenizer."""
    tuned3, tuned0 = np.load(job / "logits_stage3_tuned.npy"), np.load(job / "logits_stage0_tuned.npy")
    loaded = load_export(export / "stage3_fp32", tuned3)
    out = {"export files (stage 3, fp32)": sorted(os.listdir(export / "stage3_fp32")),
           "from_pretrained loading info": loaded["info"],
           "from_pretrained logits vs MindSpore stage 3 fine-tuned, max |diff|": loaded["logits_max_abs_diff"],
           f"  below {LOGITS_GOAL}": loaded["logits_max_abs_diff"] < LOGITS_GOAL,
           "bf16 export == fp32 export rounded to bf16": bf16_is_fp32_rounded(loaded["model"], export / "stage3_bf16"),
           "fine-tuned logits, stage 3 vs stage 0, max |diff|": max_abs(tuned3, tuned0),
           "fine-tuned logits, torch (AdamWeightDecay's rule) vs stage 3, max |diff|":
               max_abs(torch_runs["mindspore"]["logits"], tuned3),
           "fine-tuned weights, torch (AdamWeightDecay's rule) vs stage 3 export, max |diff|":
               max(max_abs(v.numpy(), torch_runs["mindspore"]["weights"][k])
                   for k, v in loaded["model"].state_dict().items())}
    for dtype in ("fp32", "bf16"):
        out[f"export {dtype}: stage 3 vs stage 0"] = same_export(export / f"stage3_{dtype}", export / f"stage0_{dtype}")
    out["tokenizer from the export"] = tokenizer_check(src, export / "stage3_fp32")
    return out


def render(sections: dict) -> str:
    """A plain text table: one line per figure, grouped by section."""
    width = max(len(k) for figures in sections.values() for k in figures) + 2
    lines = []
    for title, figures in sections.items():
        lines += ["", title, "-" * len(title)]
        for key, value in figures.items():
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            lines.append(f"{key:<{width}}{text}")
    return "\n".join(lines[1:]) + "\n"


def _round_floats(value):
    if isinstance(value, float):
        return float(f"{value:.8g}")
    if isinstance(value, list):
        return [_round_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _round_floats(v) for k, v in value.items()}
    return value


def fresh_folders(out: Path) -> tuple:
    """``out``'s source, job and export folders, emptied (an export never replaces a non-empty folder)."""
    folders = tuple(out / name for name in ("src", "job", "export"))
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    return folders


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder of the source, the job, the exports and the figures")
    parser.add_argument("--steps", type=int, default=5, help="fine-tuning steps (default 5)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds the msrun job may take (default 1800)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    src, job, export = fresh_folders(out)
    header = stamp()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    source = make_source(src)

    source_logits = torch_logits(transformers.LlamaForCausalLM.from_pretrained(str(src)), fixed_input())
    torch_runs = {rule: torch_finetune(src, args.steps, rule) for rule in ("mindspore", "adamw")}
    reports = run_job(out, src, export, args.steps, args.timeout)
    sections = {
        "run": header,
        "1. source folder (transformers save_pretrained)": source,
        "2. load into mindone.transformers at stage 3 and 0 (2 ranks, GRAPH_MODE)": job_figures(reports, source_logits,
                                                                                                 job),
        "3. fine-tune": loss_figures(reports, torch_runs),
        "4-5. export and hand back to transformers": export_figures(export, src, job, torch_runs),
    }
    sections = _round_floats(sections)
    table = render(sections)
    print(table, end="")
    (out / "hf_roundtrip.txt").write_text(table)
    (out / "hf_roundtrip.json").write_text(json.dumps(sections, indent=2, default=str) + "\n")
    print(f"\nwritten: {out / 'hf_roundtrip.txt'} and {out / 'hf_roundtrip.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
