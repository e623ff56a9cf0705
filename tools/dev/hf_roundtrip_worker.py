"""For developers: the msrun worker of ``tools/dev/hf_roundtrip.py`` (one rank of the journey).

Usage (launched by that tool, under the interpreter whose site-packages hold mindone):
``msrun ... tools/dev/hf_roundtrip_worker.py --out DIR --src HF_FOLDER --export EXPORT_DIR --steps K``

In GRAPH_MODE, for stage 3 and then stage 0: ``mindone.transformers``' ``LlamaForCausalLM`` is built
from ``HF_FOLDER``'s config under ``sharded_init()``, wrapped in ``CausalLMLoss`` (prefix ``net.``),
given ``nn.AdamWeightDecay`` on the whole network, prepared with ``prepare_train_network``, loaded
with ``load_full_checkpoint(add_prefix="net.")``, fine-tuned K steps on this rank's micro-batches
and exported into ``EXPORT_DIR/stage{s}_{fp32,bf16}`` (``strip_prefix="net."``,
``copy_files_from=HF_FOLDER``). Rank 0 writes the logits of the fixed input after the load and
after the fine-tune (``DIR/logits_stage{s}_{loaded,tuned}.npy``); every rank writes
``DIR/rank{r}.json``: its interpreter, the swaps, the load's missing and unexpected names, the
losses and each phase's seconds.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import mint, nn, ops  # noqa: E402

from mindone_zero import (PARALLEL_MODULES, load_full_checkpoint, prepare_train_network,  # noqa: E402
                          save_full_checkpoint, sharded_init)
from mindone_zero.core.comm import init_data_parallel  # noqa: E402
from tools.dev.hf_roundtrip import (BETA1, BETA2, EPS, EXPORT_SHARD_SIZE, LR, PREFIX, fixed_input,  # noqa: E402
                                    micro_batch)


# ----------------------------------------------------------------------------- the swaps


def _arange_by_range(start=0, end=None, step=1, *, dtype=None):
    """``mint.arange`` through ``ops.arange`` (the Range kernel, which the CPU backend has)."""
    if end is None:
        start, end = 0, start
    return ops.arange(start, end, step, dtype=dtype)


def _embedding_by_gather(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
                         scale_grad_by_freq=False):
    """``ops.embedding`` as a row gather: the same forward; the same backward where ``padding_idx``
    is None, ``max_norm`` None and ``scale_grad_by_freq`` False (the config sets no pad token)."""
    return ops.gather(weight, input, 0)


def swap_ops_without_cpu_kernels() -> list:
    """Make ``mindone.transformers``' Llama run on MindSpore 2.10's CPU backend, in this process only.

    Two ops it runs have no CPU kernel there: Arange (``mint.arange``: the rotary frequencies at
    build time, ``cache_position`` and the causal mask in ``LlamaModel.construct``, all in
    mindone/transformers/models/llama/modeling_llama.py and modeling_rope_utils.py, which look it up
    as ``mint.arange`` on the module ``mindspore.mint``) and Embedding (``ops.embedding``, looked up
    on ``mindspore.ops`` by ``mint.nn.Embedding.construct`` in mindspore/nn/layer/embedding.py and,
    at stage 3, by mindone_zero's own ZeRO-3 ``Embedding`` Cell in mindone_zero/zero3/layers.py).
    Both lookups happen when a graph is parsed, so replacing the two module attributes before
    building reaches every caller. (The model's own loss needs ConstantPadND and LogSoftmaxExt, which
    have no CPU kernel either: ``CausalLMLoss`` computes the loss itself.)

    Returns:
        list: a line per swap.
    """
    ms.mint.arange = _arange_by_range
    ms.ops.embedding = _embedding_by_gather
    return ["mindspore.mint.arange -> ops.arange (Arange has no CPU kernel)",
            "mindspore.ops.embedding -> ops.gather(weight, ids, 0) (Embedding has no CPU kernel)"]


# ----------------------------------------------------------------------------- the model


class CausalLMLoss(nn.Cell):
    """Mean next-token cross-entropy of a causal LM returning ``(logits, ...)``; the model is ``net``."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids):
        logits = self.net(ids)[0][:, :-1]
        return self.ce(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def build_train_net(src: str, stage: int):
    """The user's build: the config of ``src``, the model under ``sharded_init``, the loss Cell, the
    optimizer on the whole network, ``prepare_train_network``."""
    from transformers import LlamaConfig
    from mindone.transformers import LlamaForCausalLM

    config = LlamaConfig.from_pretrained(src)
    config.use_cache = False  # training: no key/value cache in the graph
    with sharded_init():
        model = LlamaForCausalLM(config)
    loss = CausalLMLoss(model)
    optimizer = nn.AdamWeightDecay(loss.trainable_params(), learning_rate=LR, beta1=BETA1, beta2=BETA2, eps=EPS,
                                   weight_decay=0.0)
    return prepare_train_network(loss, optimizer, zero_stage=stage)


def logits_of(train_net) -> np.ndarray:
    """The model's logits of ``fixed_input()`` (collective at stage 3: every rank calls it)."""
    return train_net.network.net(ms.Tensor(fixed_input()))[0].asnumpy()


def run_stage(stage: int, args, rank: int) -> dict:
    """Build, load, fine-tune and export at ``stage``; rank 0 saves the logits."""
    seconds, t = {}, time.perf_counter()
    train = build_train_net(args.src, stage)
    seconds["build+prepare"], t = time.perf_counter() - t, time.perf_counter()
    missing, unexpected = load_full_checkpoint(train, args.src, add_prefix=PREFIX)
    seconds["load"], t = time.perf_counter() - t, time.perf_counter()
    loaded = logits_of(train)
    losses = [float(train(ms.Tensor(micro_batch(step, rank)))[0].asnumpy()) for step in range(args.steps)]
    tuned = logits_of(train)
    seconds["fine-tune"], t = time.perf_counter() - t, time.perf_counter()
    for dtype in ("fp32", "bf16"):
        save_full_checkpoint(train, os.path.join(args.export, f"stage{stage}_{dtype}"), dtype=dtype,
                             max_shard_size=EXPORT_SHARD_SIZE, strip_prefix=PREFIX, copy_files_from=args.src)
    seconds["export"] = time.perf_counter() - t
    if rank == 0:
        np.save(os.path.join(args.out, f"logits_stage{stage}_loaded.npy"), loaded)
        np.save(os.path.join(args.out, f"logits_stage{stage}_tuned.npy"), tuned)
    embed = type(train.network.net.model.embed_tokens)
    return {"missing": missing, "unexpected": unexpected, "losses": losses,
            "embed_cell": f"{embed.__module__}.{embed.__qualname__}",
            "seconds": {k: round(v, 1) for k, v in seconds.items()}}


def _qualname(cls) -> str:
    return "not mapped" if cls is None else f"{cls.__module__}.{cls.__qualname__}"


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--out", "--src", "--export"):
        parser.add_argument(name, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    swaps = swap_ops_without_cpu_kernels()
    rank, _ = init_data_parallel()
    ms.set_context(mode=ms.GRAPH_MODE)
    import mindone

    report = {"python": sys.executable, "mindone": f"{mindone.__version__} ({os.path.dirname(mindone.__file__)})",
              "swaps": swaps, "parallel_modules_embedding": _qualname(PARALLEL_MODULES.get(mint.nn.Embedding)),
              "stages": {}}
    for stage in (3, 0):
        report["stages"][str(stage)] = run_stage(stage, args, rank)
        print(f"rank {rank}: stage {stage} done", flush=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
