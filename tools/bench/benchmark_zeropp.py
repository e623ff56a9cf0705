"""For benchmarking: writes ``docs/benchmarks/<name>.md`` (``tools/bench/report.py``).

ZeRO++ communication per step: every combination of qwZ, hpZ and qgZ against plain stage 3.

    python tools/bench/benchmark_zeropp.py --world_size 4 --out outputs/benchmark/zeropp
    python tools/bench/benchmark.py ... --zeropp          # the same, after the main tables

One msrun job of ``--world_size`` CPU workers (default 4) builds the demo LM (``model:`` of
``--config``, default ``configs/train_lm.yaml``) at stage 3 with ``reshard_after_forward=True``
once per combination and reads ``train_net.comm_plan``: the collectives of one optimizer step with
the bytes the native path moves (int8 values at 1 byte, float32 scales; see [Note: int8 on CPU] in
``mindone_zero/core/comm.py``). hpZ's secondary group is each half of the ranks (a "node" of N/2).
Nothing is trained: the plan is fixed when the network is built.

Per combination the table gives the ring volume a rank sends per step, in all and outside the
secondary group (what crosses nodes, the paper's measure), in Φ (the fp32 parameter bytes) and
against plain stage 3 (3Φ: forward gather, backward re-gather, gradient reduce-scatter). The
paper's figures (fp16 weights, int4 gradients) are 3Φ -> 0.75Φ across nodes.

    python tools/bench/benchmark_zeropp.py --block_sweep --out outputs/benchmark/zeropp_blocks

measures what the quantization block size trades, in one process (no msrun): for the matrices of a
demo LM made large (``--sweep_model``, default d_model 1024, d_ff 4096, 2 layers: tensors of 1-4 M
elements), with MindSpore's default initial weights and the gradients of one backward pass, the
relative error ``|dq(q(x)) - x| / |x|`` per tensor of the library's own ``quantize_blocks`` /
``dequantize_blocks``, against the bytes the float32 scales add (4 per block).
"""
import argparse
import itertools
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench.report import add_docs_flag, write_report  # noqa: E402
from tools.dev.launch import run_msrun  # noqa: E402

COMBOS = [dict(zip(("qwZ", "hpZ", "qgZ"), bits)) for bits in itertools.product((False, True), repeat=3)]


def _zeropp(combo, hpz_group):
    return {"quantize_weights": combo["qwZ"], "quantize_gradients": combo["qgZ"],
            "hpz_group": hpz_group if combo["hpZ"] else None}


def worker(config: str, out: Path) -> None:
    """msrun side: build each combination, write rank 0's plan entries and Φ to ``out/plans.json``."""
    import mindspore as ms
    import yaml
    from mindspore import nn

    from mindone_zero import create_hybrid_groups, prepare_train_network
    from mindone_zero.core.comm import init_data_parallel
    from tools.lm_model import LMLoss, build_lm, init_lm_weights

    rank, world = init_data_parallel("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    node, _ = create_hybrid_groups(world // 2)  # this rank's half (a "node"), under a name unique job-wide
    model = yaml.safe_load(open(config, encoding="utf-8"))["model"]
    results, keep = [], []
    for combo in COMBOS:
        loss_net = LMLoss(init_lm_weights(build_lm(model), 0))
        phi = sum(p.size * 4 for p in loss_net.trainable_params())
        opt = nn.AdamWeightDecay(loss_net.trainable_params(), learning_rate=1e-3)
        train = prepare_train_network(loss_net, opt, zero_stage=3, zeropp=_zeropp(combo, node),
                                      params_split_info=str(out / "params_info"))
        keep.append(train)
        results.append({"combo": combo, "phi": phi, "entries": [list(e) for e in train.comm_plan.entries]})
    if rank == 0:
        (out / "plans.json").write_text(json.dumps({"world": world, "secondary": node, "results": results}))


def volumes(entries, secondary: str):
    """(ring volume per rank, the part outside the group named ``secondary``) of plan entries,
    without the overflow-flag and clipping all-reduces (4-byte scalars)."""
    from mindone_zero.core.comm import CommPlan

    plan = CommPlan([tuple(e) for e in entries if not (e[0] == "all_reduce" and e[2] == 4)])
    return plan.volume(), plan.volume_outside({secondary})


def render(data: dict) -> str:
    """The markdown table of ``plans.json`` (``secondary``: rank 0's hpZ group)."""
    world, results, secondary = data["world"], data["results"], data["secondary"]
    base_total, base_cross = volumes(results[0]["entries"], secondary)
    phi = results[0]["phi"]
    lines = [f"ZeRO++ communication per optimizer step and rank, demo LM ({phi // 4} parameters, Φ = {phi} B fp32), "
             f"N={world}, hpZ group = {world // 2} ranks; native bytes (int8 + fp32 scales per block of 2048)",
             "", "| qwZ | hpZ | qgZ | sent per rank (B) | (Φ) | / stage 3 | outside the hpZ group (B) | (Φ) | / stage 3 |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        total, cross = volumes(r["entries"], secondary)
        flags = " | ".join("yes" if r["combo"][k] else "-" for k in ("qwZ", "hpZ", "qgZ"))
        # Φ of the paper is the full tensor; ring volume is (N-1)/N of it, so divide that out.
        scale = phi * (world - 1) / world
        lines.append(f"| {flags} | {total:.0f} | {total / scale:.2f} | {total / base_total:.3f} | {cross:.0f} | "
                     f"{cross / scale:.2f} | {cross / base_cross:.3f} |")
    return "\n".join(lines)


SWEEP_MODEL = {"vocab_size": 64, "d_model": 1024, "n_layers": 2, "d_ff": 4096, "max_len": 16, "n_heads": 8}
SWEEP_BLOCKS = (64, 256, 1024, 2048, 8192, 65536)


def relative_error(x, block_size: int) -> float:
    """|dequantize(quantize(x)) - x| / |x| of one tensor, blocks of ``block_size`` ([Note: block quantization])."""
    import numpy as np
    from mindspore import Tensor

    from mindone_zero.core.quantize import block_layout, dequantize_blocks, quantize_blocks

    flat = Tensor(x.reshape(-1))
    block, blocks, _ = block_layout(flat.shape[0], block_size)
    q, scales = quantize_blocks(flat, block, blocks)
    back = dequantize_blocks(q, scales, block, flat.shape[0]).asnumpy()
    return float(np.linalg.norm(back - x.reshape(-1)) / max(np.linalg.norm(x), 1e-30))


def block_sweep(model_cfg: dict, blocks=SWEEP_BLOCKS) -> str:
    """The block-size table: per block size, the scales' byte overhead and the median and largest
    relative error over the model's matrices (weights, and gradients of one backward pass)."""
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor

    from tools.lm_model import LMLoss, build_lm, reversal_batch

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    loss_net = LMLoss(build_lm(model_cfg))  # MindSpore's default initialisation
    params = [p for p in loss_net.trainable_params() if len(p.shape) >= 2]  # what qwZ / qgZ quantize
    ids, targets, weights = reversal_batch(1, 0, 8, (int(model_cfg["max_len"]) - 1) // 2, int(model_cfg["vocab_size"]))
    grads = ms.grad(loss_net, grad_position=None, weights=params)(Tensor(ids), Tensor(targets), Tensor(weights))
    kinds = {"weights": [p.asnumpy() for p in params], "gradients": [g.asnumpy() for g in grads]}
    sizes = sorted(int(np.prod(p.shape)) for p in params)
    lines = [f"Block quantization error, {len(params)} matrices of {sizes[0]}-{sizes[-1]} elements (demo LM, "
             f"d_model {model_cfg['d_model']}, d_ff {model_cfg['d_ff']}, MindSpore's default initialisation; "
             "gradients of one backward pass); relative error |dq(q(x)) - x| / |x| per tensor", "",
             "| block size | scale bytes / int8 bytes | weights: median | weights: max | gradients: median | "
             "gradients: max |", "|---:|---:|---:|---:|---:|---:|"]
    for block_size in blocks:
        errors = {k: [relative_error(x, block_size) for x in xs] for k, xs in kinds.items()}
        cells = " | ".join(f"{np.median(e):.4%} | {max(e):.4%}" for e in errors.values())
        lines.append(f"| {block_size} | {4 / block_size:.2%} | {cells} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--config", default=str(REPO / "configs" / "train_lm.yaml"))
    parser.add_argument("--world_size", type=int, default=4)
    parser.add_argument("--out", default="outputs/benchmark/zeropp")
    parser.add_argument("--as_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--block_sweep", action="store_true",
                        help="measure the quantization error against the block size instead (one process; "
                             "its page: DIR/zeropp_blocks.md)")
    parser.add_argument("--sweep_model", type=json.loads, default=SWEEP_MODEL,
                        help="the LM of --block_sweep, as JSON (keys of tools/lm_model.TransformerLM)")
    add_docs_flag(parser, "zeropp")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    if args.block_sweep:
        out.mkdir(parents=True, exist_ok=True)
        report = block_sweep(args.sweep_model)
        (out / "blocks.md").write_text(report + "\n")
        print(report)
        if args.docs:
            title = "ZeRO++: quantization error against the block size"
            print(f"page: {write_report('zeropp_blocks', title, report, out_dir=args.docs)}")
        return 0
    if args.as_worker:
        worker(args.config, out)
        return 0
    if args.world_size < 2 or args.world_size % 2:
        parser.error(f"the argument '--world_size' must be an even integer >= 2, but got {args.world_size}")
    out.mkdir(parents=True, exist_ok=True)
    run_msrun(__file__, args.world_size, out, ["--config", str(Path(args.config).resolve()), "--as_worker"],
              timeout=600, caller="benchmark_zeropp")
    report = render(json.loads((out / "plans.json").read_text()))
    (out / "zeropp.md").write_text(report + "\n")
    print(report)
    if args.docs:
        print(f"page: {write_report('zeropp', 'ZeRO++: communication per step', report, out_dir=args.docs)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOG_v", "3")
    sys.exit(main())
