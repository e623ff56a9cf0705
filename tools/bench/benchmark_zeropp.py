"""For benchmarking: writes ``docs/benchmarks/<name>.md``, its figure ``<name>.svg`` and its raw
results ``<name>.json`` (``tools/bench/pages.py``).

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

from tools.bench.pages import Page, publish  # noqa: E402
from tools.bench.report import add_docs_flag  # noqa: E402
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


def combo_label(combo: dict) -> str:
    """``qwZ + hpZ``, or ``stage 3`` for none."""
    on = [k for k in ("qwZ", "hpZ", "qgZ") if combo[k]]
    return " + ".join(on) if on else "stage 3"


def rows_of(data: dict) -> list:
    """Per combination of ``plans.json``: label, bytes sent per rank in all and outside rank 0's hpZ
    group (``secondary``), each in Φ' (the fp32 parameter bytes times (N-1)/N: plain stage 3 is 3)
    and against plain stage 3."""
    world, results, secondary = data["world"], data["results"], data["secondary"]
    base_total, base_cross = volumes(results[0]["entries"], secondary)
    scale = results[0]["phi"] * (world - 1) / world  # Φ of the paper is the full tensor; ring volume is (N-1)/N
    rows = []
    for r in results:
        total, cross = volumes(r["entries"], secondary)
        rows.append({"label": combo_label(r["combo"]), "total": total, "cross": cross, "total_phi": total / scale,
                     "cross_phi": cross / scale, "total_ratio": total / base_total, "cross_ratio": cross / base_cross})
    return rows


def render(data: dict) -> str:
    """The markdown table of ``plans.json`` (``secondary``: rank 0's hpZ group)."""
    world, phi = data["world"], data["results"][0]["phi"]
    lines = [f"Demo LM ({phi // 4} parameters, Φ = {phi} B fp32), N={world}, hpZ group = {world // 2} ranks (a "
             f"\"node\"); native bytes (int8 and an fp32 scale per block of 2048) sent per optimizer step and rank, "
             f"ring algorithms; Φ' = Φ (N-1)/N, so plain stage 3 sends 3Φ'.", "",
             "| combination | sent (B) | (Φ') | / stage 3 | outside the node (B) | (Φ') | / stage 3 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows_of(data):
        lines.append(f"| {r['label']} | {r['total']:.0f} | {r['total_phi']:.2f} | {r['total_ratio']:.3f} | "
                     f"{r['cross']:.0f} | {r['cross_phi']:.2f} | {r['cross_ratio']:.3f} |")
    return "\n".join(lines)


def intro(data: dict) -> list:
    rows = rows_of(data)
    best = min(rows, key=lambda r: r["cross_phi"])
    return [f"What each combination of ZeRO++'s qwZ, hpZ and qgZ sends per optimizer step and rank at stage 3 "
            f"(N={data['world']}, a node of {data['world'] // 2}), in all and outside the node, read from the "
            f"library's communication plan of the demo LM: nothing is trained, so these bytes are exact, not timed.",
            f"Expect plain stage 3 at 3Φ' (gather in forward, again in backward, reduce-scatter), hpZ to move the "
            f"backward gather inside the node (more bytes in all, fewer across nodes), and all three together at "
            f"{best['cross_phi']:.2f}Φ' across nodes, {best['cross_ratio']:.3f} of stage 3: the paper's 0.75 of 3 "
            f"(0.25) quantizes fp16 weights to int8 and gradients to int4, here fp32 weights and gradients both "
            f"go to int8, with an fp32 scale per block."]


def draw(plt, data: dict):
    from tools.bench import plots

    rows = rows_of(data)
    fig, ax = plt.subplots(figsize=plots.size(1, 3.4))
    plots.hbars(ax, [r["label"] for r in rows], {"outside the node": [r["cross_phi"] for r in rows],
                                                 "inside the node": [r["total_phi"] - r["cross_phi"] for r in rows]},
                "bytes sent per optimizer step and rank (Φ' = fp32 parameter bytes x (N-1)/N)", stacked=True)
    plots.goal(ax, 3.0, "plain stage 3 (3Φ')", horizontal_line=False)
    plots.legend_below(ax, 2)
    ax.set_title(f"ZeRO++ at N={data['world']}, node = {data['world'] // 2} ranks: bytes inside and outside the node")
    return fig


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


def block_sweep(model_cfg: dict, blocks=SWEEP_BLOCKS) -> dict:
    """Per block size, the relative error of every matrix of the model (weights, and gradients of
    one backward pass): ``{"model", "sizes", "blocks": [{"block_size", "weights", "gradients"}]}``."""
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
    return {"model": dict(model_cfg), "sizes": sorted(int(np.prod(p.shape)) for p in params),
            "blocks": [dict(block_size=b, **{k: [relative_error(x, b) for x in xs] for k, xs in kinds.items()})
                       for b in blocks]}


def _median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def render_blocks(sweep: dict) -> str:
    """The block-size table: per block size, the scales' byte overhead and the median and largest
    relative error over the model's matrices."""
    model, sizes = sweep["model"], sweep["sizes"]
    lines = [f"{len(sizes)} matrices of {sizes[0]}-{sizes[-1]} elements (demo LM, d_model {model['d_model']}, d_ff "
             f"{model['d_ff']}, MindSpore's default initialisation; gradients of one backward pass); relative error "
             "|dq(q(x)) - x| / |x| per tensor.", "",
             "| block size | scale bytes / int8 bytes | weights: median | weights: max | gradients: median | "
             "gradients: max |", "|---:|---:|---:|---:|---:|---:|"]
    for b in sweep["blocks"]:
        cells = " | ".join(f"{_median(b[k]):.4%} | {max(b[k]):.4%}" for k in ("weights", "gradients"))
        lines.append(f"| {b['block_size']} | {4 / b['block_size']:.2%} | {cells} |")
    return "\n".join(lines)


def intro_blocks(sweep: dict) -> list:
    first, last = sweep["blocks"][0], sweep["blocks"][-1]
    default = next((b for b in sweep["blocks"] if b["block_size"] == 2048), None)
    said = (f"; at the default, 2048, the median gradient error is {_median(default['gradients']):.2%} for "
            f"{4 / 2048:.2%} more bytes" if default else "")
    return ["The relative error of the int8 block quantization that qwZ and qgZ apply, against the block size, "
            f"for the weights and the gradients of one backward pass of a demo LM made large ({len(sweep['sizes'])} "
            "matrices), with the library's own quantize and dequantize.",
            f"Expect the error to grow with the block (each block's scale follows its largest value) and the "
            f"scales' bytes to shrink as 4 / block: the gradients, with heavier tails, go from "
            f"{_median(first['gradients']):.2%} at {first['block_size']} to {_median(last['gradients']):.2%} at "
            f"{last['block_size']}, the weights stay near {_median(first['weights']):.2%}{said}."]


def draw_blocks(plt, sweep: dict):
    from tools.bench import plots

    blocks = [b["block_size"] for b in sweep["blocks"]]
    fig, ax = plt.subplots(figsize=plots.size(1, 3.4))
    series = {}
    for kind in ("weights", "gradients"):
        series[f"{kind}: median"] = [100 * _median(b[kind]) for b in sweep["blocks"]]
        series[f"{kind}: max"] = [100 * max(b[kind]) for b in sweep["blocks"]]
    plots.lines(ax, blocks, series, "block size (elements)", "relative error (%)", log_x=True,
                styles={"weights: max": "o--", "gradients: max": "s--", "gradients: median": "s-"})
    twin = ax.twinx()
    twin.plot(blocks, [400 / b for b in blocks], ":", color="grey", label="scale bytes / int8 bytes (right)")
    twin.set_yscale("log")
    twin.set_ylabel("scale bytes / int8 bytes (%)")
    plots.legend_below(ax, 3, extra=[twin])
    ax.set_title("int8 block quantization: error against block size")
    return fig


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
        sweep = block_sweep(args.sweep_model)
        report = render_blocks(sweep)
        (out / "blocks.md").write_text(report + "\n")
        (out / "blocks.json").write_text(json.dumps(sweep, indent=1))
        print(report)
        if args.docs:
            print(f"page: {publish(BLOCKS_PAGE, sweep, out_dir=args.docs)}")
        return 0
    if args.as_worker:
        worker(args.config, out)
        return 0
    if args.world_size < 2 or args.world_size % 2:
        parser.error(f"the argument '--world_size' must be an even integer >= 2, but got {args.world_size}")
    out.mkdir(parents=True, exist_ok=True)
    run_msrun(__file__, args.world_size, out, ["--config", str(Path(args.config).resolve()), "--as_worker"],
              timeout=600, caller="benchmark_zeropp")
    data = json.loads((out / "plans.json").read_text())
    report = render(data)
    (out / "zeropp.md").write_text(report + "\n")
    print(report)
    if args.docs:
        print(f"page: {publish(PAGE, data, out_dir=args.docs)}")
    return 0


PAGE = Page("zeropp", "ZeRO++: communication per step", intro, render, draw,
            "bytes each rank sends per optimizer step, inside and outside its node, for every combination.")
BLOCKS_PAGE = Page("zeropp_blocks", "ZeRO++: quantization error against the block size", intro_blocks, render_blocks,
                   draw_blocks, "median and largest relative error over the matrices, and the scales' bytes.")


if __name__ == "__main__":
    os.environ.setdefault("GLOG_v", "3")
    sys.exit(main())
