"""For benchmarking: writes ``docs/benchmarks/<name>.md`` (``tools/bench/report.py``).

Benchmark ZeRO stages 0-3 at several world sizes on the demo LM: memory, speed, communication;
and the step time of every stage on a stack of large Dense layers.

    python tools/bench/benchmark.py --config configs/benchmark.yaml --out outputs/benchmark

One msrun job per world size (``tools/bench/benchmark_worker.py``) runs every stage of both models,
timing their steps in turns. For each (world size N, stage) the demo LM's report gives:

* measured model-state bytes per rank (``mindone_zero.memory.measure.measure_model_states``)
  and their ratio to ``estimate_model_states_memory`` with the config's bytes per parameter
  (default fp32 training with Adam: 4 B parameter, 4 B gradient, 8 B optimizer states, two
  fp32 moments). Gradients are held between micro-steps only as accumulation buffers, so the
  default config accumulates 2 micro-steps; stages 1-2 also keep a 1/N fp32 master copy of the
  parameters (4/N B per parameter beyond the formula), which shows as a ratio above 1;
* the median optimizer-step time and its ratio to stage 0 at the same N. On the CPU backend
  ReduceScatter (and sub-group AllGather) are emulated with AllReduce, so stages 1-3 move more
  bytes than the native path would, and times are those of the emulation;
* collectives and bytes per optimizer step per rank on the native path, from the library's own
  ``CommPlan`` (``train_net.comm_plan``, and ``train_net.plan_comm(1)`` for one micro-step;
  [Note: comm plan] in ``mindone_zero/core/comm_plan.py``; ring algorithm: all-reduce sends
  2(N-1)/N of the tensor, reduce-scatter and all-gather (N-1)/N), next to the ZeRO paper's 2Φ
  (stages 0-2) and 3Φ (stage 3), Φ = parameter bytes. With accumulation our stages 2-3
  communicate every micro-step, and stage 3 keeps the forward-gathered parameters for backward
  instead of gathering them again, hence 2Φ per micro-step rather than the paper's 3Φ. Result
  files without the plans are counted from the shard layout (``native_collectives``).

The Dense stack (config section ``dense``, default 4 x Dense(1024, 1024), 4.2M parameters in 8
tensors, AdamWeightDecay, batch 32 per rank, at N=2) gets a table of its own: the median step
per stage and its ratio to stage 0, with the library's collectives per step. Its few large
tensors show what a stage costs per byte, where the LM's many small ones show the cost per launch.
``idle_collectives: [k]`` adds rows "0 (+k idle collectives)" to the LM's table: stage 0 with k
4-byte all-reduces per step that touch nothing, the cost of synchronisation alone (for where the
rest of a step's time goes, see ``tools/dev/profile_step.py``).

Writes ``benchmark.md`` (the tables), ``results.json`` and, if matplotlib is installed
(``pip install -e .[plot]``), ``benchmark.png`` into ``--out``; prints the tables. ``--zeropp``
adds ZeRO++'s bytes per step for every combination of qwZ, hpZ and qgZ against plain stage 3
(``tools/bench/benchmark_zeropp.py``, into ``<out>/zeropp``).
"""
import argparse
import json
import os
import sys
from pathlib import Path
from statistics import median
from typing import List, Sequence, Tuple

import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mindone_zero.memory.estimate import estimate_model_states_memory  # noqa: E402
from mindone_zero.core.stage import StagePolicy  # noqa: E402
from tools.bench import benchmark_offload, benchmark_peak, benchmark_zeropp  # noqa: E402
from tools.bench.report import add_docs_flag, write_report  # noqa: E402
from tools.bench.bench_common import (check_bench, load_benchmark_config, run_world, setting_label,  # noqa: E402
                                setting_name, settings_of)

RING = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "broadcast": 1.0}
PAPER_FACTOR = {0: 2, 1: 2, 2: 2, 3: 3}
MEMORY_KINDS = ("params", "master_shards", "optimizer_states", "accumulation", "ema", "other")


# ----------------------------------------------------------------------------- communication model
def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def native_collectives(layout: List[dict], stage: int, accum: int, clip_grad: bool) -> List[Tuple[str, int]]:
    """Collectives of one optimizer step on one rank, as native ops: ``[(kind, tensor bytes)]``,
    one per tensor (no buckets), worked out from the shard layout for result files that do not
    carry the library's ``CommPlan`` (``summarize`` reads the plan where there is one).

    ``layout`` has, per parameter, ``shape`` (full), ``padded_shape``, ``itemsize`` and ``split``
    (as ``tools/bench/benchmark_worker.py`` writes it) and ``regathered`` (stage 3 gathers it again in
    backward). Tensor bytes are the full (padded) tensor a
    collective works on. Follows [Note: gradient reduction] in ``mindone_zero/train/zero_helper.py``:
    one overflow-flag all-reduce per micro-step; gradients reduced every micro-step at stages 2-3
    (and whenever ``accum == 1``), else once per optimizer step; stages 1-2 reduce-scatter sharded
    gradients and all-gather the updated shards once per step; stage 3 all-gathers each sharded
    parameter in forward (and again in backward when it is ``regathered``,
    ``reshard_after_forward=True``) and reduce-scatters its gradient in backward, every micro-step;
    replicated parameters are all-reduced; one global-norm all-reduce per step when clipping at
    stages >= 1. At stage 3 the parameters with the same ``coalesced`` index (not None) share each
    collective, recorded once with their summed bytes ([Note: coalesced gathers] in
    ``mindone_zero/zero3/coalesce.py``). Pure arithmetic on ``StagePolicy``'s answers.
    """
    policy = StagePolicy(stage)
    entries = [("all_reduce", 4)] * accum
    reduces = accum if policy.reduce_each_micro_step(accum) else 1
    group_bytes, counted = {}, set()
    for p in layout:
        if p.get("coalesced") is not None:
            padded = _prod(p["padded_shape"] or p["shape"]) * p["itemsize"]
            group_bytes[p["coalesced"]] = group_bytes.get(p["coalesced"], 0) + padded
    for p in layout:
        full = _prod(p["shape"]) * p["itemsize"]
        padded = _prod(p["padded_shape"] or p["shape"]) * p["itemsize"]
        group = p.get("coalesced") if policy.shards_params and p["split"] else None
        if group is not None:
            if group in counted:
                continue
            counted.add(group)
            padded = group_bytes[group]
        if policy.shards_params and p["split"]:
            gathers = [("all_gather", padded)] * (2 if p.get("regathered") else 1)
            entries += (gathers + [("reduce_scatter", padded)]) * accum
        elif policy.uses_masters and p["split"]:
            entries += [("reduce_scatter", padded)] * reduces + [("all_gather", padded)]
        else:
            entries += [("all_reduce", full)] * reduces
    if clip_grad and policy.is_zero:
        entries.append(("all_reduce", 4))
    return entries


def ring_volume(entries: Sequence[Sequence], world: int) -> float:
    """Bytes one rank sends for ``entries`` ((kind, bytes, ...)) with ring algorithms over ``world`` ranks."""
    return sum(RING[e[0]] * (world - 1) / world * e[1] for e in entries)


# ----------------------------------------------------------------------------- results
def _load_ranks(out: Path, stem: str, world: int) -> List[dict]:
    ranks = []
    for r in range(world):
        with open(out / f"{stem}_rank{r}.json") as f:
            ranks.append(json.load(f))
    return ranks


def summarize(cfg: dict, out: Path, world: int, prefix: str = "") -> List[dict]:
    """One row per setting (``settings_of``) at ``world`` ranks from the workers' JSON files in
    ``out`` (``prefix`` "dense_" for the Dense stack)."""
    bench = cfg["benchmark"]
    rows = []
    for stage, reshard, units, idle in settings_of(bench, idle=not prefix):
        ranks = _load_ranks(out, prefix + setting_name(stage, reshard, units, idle), world)
        r0 = ranks[0]
        num_params = sum(_prod(p["shape"]) for p in r0["layout"])
        phi = sum(_prod(p["shape"]) * p["itemsize"] for p in r0["layout"])
        estimate = estimate_model_states_memory(num_params, world, stage, bench["param_bytes"], bench["grad_bytes"],
                                                bench["optimizer_bytes"])
        # the library's plans ([Note: comm plan]); the layout's per-tensor count only for files without them
        step = [(e[0], e[2]) for e in r0["comm_plan"]] or native_collectives(
            r0["layout"], stage, r0["accum"], r0["clip_grad"])
        step_a1 = [(e[0], e[2]) for e in r0.get("comm_plan_a1") or []] or native_collectives(
            r0["layout"], stage, 1, r0["clip_grad"])
        rows.append({
            "model": prefix.rstrip("_") or "lm", "world": world, "stage": stage,
            "label": setting_label(stage, reshard, units, idle), "reshard_after_forward": reshard,
            "units": r0.get("units"),
            "idle": idle, "losses": r0["losses"],
            "effective_stage": r0["effective_stage"], "num_params": num_params,
            "phi_bytes": phi, "memory": {k: max(r["memory"][k] for r in ranks) for k in r0["memory"]},
            "memory_equal_on_ranks": all(r["memory"] == r0["memory"] for r in ranks), "estimate": estimate,
            "step_time": median(r0["step_times"]), "collectives": len(step), "volume": ring_volume(step, world),
            "volume_a1": ring_volume(step_a1, world),
            "paper_volume": PAPER_FACTOR[stage] * phi, "first_loss": r0["losses"][0], "last_loss": r0["losses"][-1],
        })
    stage0 = next(r for r in rows if r["stage"] == 0 and not r["idle"])
    base = stage0["step_time"]
    for row in rows:
        if row["idle"] and row["losses"] != stage0["losses"]:
            raise RuntimeError(f"For 'benchmark', N={world} stage 0 with {row['idle']} idle collectives gave other "
                               f"losses than stage 0: {row['losses'][:4]} against {stage0['losses'][:4]}: the idle "
                               f"all-reduces must not touch the computation.")
        row["time_ratio"] = row["step_time"] / base
        row["memory_ratio"] = row["memory"]["total"] / row["estimate"]
    return rows


# ----------------------------------------------------------------------------- report
def _placement(bench: dict) -> str:
    return "each rank pinned to a core" if bench["pin_ranks"] else "ranks sharing all cores"


def _calls(row: dict) -> int:
    """Collectives per optimizer step (the library's ``CommPlan``: buckets counted as one), idle
    all-reduces added."""
    return row["collectives"] + row["idle"]


def _kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def render_tables(cfg: dict, rows: List[dict]) -> str:
    """The markdown report: main table, bytes by kind, and how to read them."""
    bench = cfg["benchmark"]
    p, g, k = bench["param_bytes"], bench["grad_bytes"], bench["optimizer_bytes"]
    lines = [
        f"Demo LM ({rows[0]['num_params']} parameters, Φ = {rows[0]['phi_bytes']} B of fp32 parameters), Adam, "
        f"global batch {bench['global_batch_size']}, {bench['gradient_accumulation_steps']} micro-steps per "
        f"optimizer step, {bench['mode']} mode, {bench['timed_steps']} timed steps after {bench['warmup_steps']} "
        f"warm-up, CPU backend, {_placement(bench)}.",
        "",
        f"| N | stage | model states / rank | estimate ({p}+{g}+{k} B) | measured / estimate | median step | "
        f"vs stage 0 | collectives / step (library) | native bytes / step / rank | in Φ' | in Φ' at 1 micro-step | "
        f"paper |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        unit = r["phi_bytes"] * (r["world"] - 1) / r["world"]  # Φ' = Φ (N-1)/N: the paper's Φ on N ranks
        lines.append(
            f"| {r['world']} | {r['label']} | {_kib(r['memory']['total'])} | {_kib(r['estimate'])} | "
            f"{r['memory_ratio']:.3f} | {r['step_time'] * 1e3:.1f} ms | {r['time_ratio']:.2f}x | {_calls(r)} | "
            f"{_kib(r['volume'])} | {r['volume'] / unit:.2f}Φ' | {r['volume_a1'] / unit:.2f}Φ' | "
            f"{PAPER_FACTOR[r['stage']]}Φ |"
        )
    lines += ["", "Measured bytes per rank by kind (`measure_model_states`):", "",
              "| N | stage | " + " | ".join(MEMORY_KINDS) + " | total |",
              "|---:|---:|" + "---:|" * (len(MEMORY_KINDS) + 1)]
    for r in rows:
        cells = " | ".join(str(r["memory"][kind]) for kind in MEMORY_KINDS + ("total",))
        lines.append(f"| {r['world']} | {r['label']} | {cells} |")
    lines += ["", *_notes(rows)]
    return "\n".join(lines)


def render_dense_table(cfg: dict, rows: List[dict]) -> str:
    """The markdown table of the Dense stack: step time per stage against stage 0."""
    dense = cfg["dense"]
    lines = [
        f"{dense['layers']} x Dense({dense['width']}, {dense['width']}) ({rows[0]['num_params']} parameters), "
        f"AdamWeightDecay, batch {dense['batch_per_rank']} per rank, {dense['gradient_accumulation_steps']} "
        f"micro-step(s) per optimizer step, {cfg['benchmark']['mode']} mode, {_placement(cfg['benchmark'])}, timed in "
        f"turns with the demo LM.",
        "",
        "| N | stage | median step | vs stage 0 | collectives / step (library) | native bytes / step / rank |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['world']} | {r['label']} | {r['step_time'] * 1e3:.1f} ms | {r['time_ratio']:.2f}x | "
                     f"{_calls(r)} | {_kib(r['volume'])} |")
    return "\n".join(lines)


def _notes(rows: List[dict]) -> List[str]:
    notes = [
        "- Estimate: `estimate_model_states_memory` (ZeRO paper). Gradients are held only as accumulation buffers; "
        "stages 1-2 also keep a 1/N fp32 master copy of the parameters, which the formula does not count.",
        "- Step time: CPU backend, where ReduceScatter and sub-group AllGather are emulated with AllReduce; the "
        "native-path bytes are what Ascend/GPU would move.",
        "- Native bytes: ring algorithms (all-reduce 2(N-1)/N of the tensor, reduce-scatter and all-gather (N-1)/N), "
        "per optimizer step, overflow-flag and norm all-reduces included; Φ' = Φ (N-1)/N, the paper's Φ for "
        "N ranks. "
        "Stages 2-3 communicate every micro-step; the next column is the same count with one micro-step per step. "
        "Paper: 2Φ for stages 0-2, 3Φ for stage 3, per step without accumulation (its stage 3 gathers the "
        "parameters again in backward, as ours does by default, `reshard_after_forward=True`; "
        "\"3 (keep)\" keeps the forward-gathered ones until backward: 2Φ).",
    ]
    units = sorted({", ".join(r["units"]) for r in rows if r.get("units")})
    if units:
        notes.append(f"- \"3 (units)\": stage 3 with gather_units=({'; '.join(units)}): each unit's parameters in one "
                     f"all-gather (again in backward, without recomputing the unit's layers) and one reduce-scatter ([Note: gather units] in "
                     f"mindone_zero/zero3/units.py); \"3 (units, keep)\" the same units with "
                     f"reshard_after_forward=False.")
    idle = sorted({r["idle"] for r in rows if r.get("idle")})
    if idle:
        notes.append(f"- \"0 (+k idle collectives)\": stage 0 with k extra 4-byte all-reduces per optimizer step (k = "
                     f"{', '.join(map(str, idle))}), as many in forward as in backward at every micro-step, that touch "
                     f"no value (the losses are checked equal to stage 0's): what synchronising the ranks k more "
                     f"times costs on this backend, with no bytes to move and no kernel added to the model's work.")
    for r in rows:
        if r["effective_stage"] != r["stage"]:
            notes.append(f"- N={r['world']} stage {r['label']} ran as stage {r['effective_stage']} (fallback).")
        if not r["memory_equal_on_ranks"]:
            notes.append(f"- N={r['world']} stage {r['label']}: ranks hold different bytes; the maximum is shown.")
    return notes


def plot(rows: List[dict], path: Path) -> bool:
    """Bar charts of memory, step time and communication per stage and N; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    worlds = sorted({r["world"] for r in rows})
    stages = sorted({r["stage"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / (2 * len(worlds))
    for i, world in enumerate(worlds):
        sel = [next(r for r in rows if r["world"] == world and r["stage"] == s) for s in stages]
        xs = [s + (2 * i - len(worlds)) * width + width / 2 for s in stages]
        axes[0].bar(xs, [r["memory"]["total"] / 1024 for r in sel], width, label=f"measured N={world}")
        axes[0].bar([x + width for x in xs], [r["estimate"] / 1024 for r in sel], width, label=f"estimate N={world}",
                    alpha=0.5)
        axes[1].bar([s + (i - len(worlds) / 2 + 0.5) * 0.8 / len(worlds) for s in stages],
                    [r["time_ratio"] for r in sel], 0.8 / len(worlds), label=f"N={world}")
        axes[2].bar([s + (i - len(worlds) / 2 + 0.5) * 0.8 / len(worlds) for s in stages],
                    [r["volume_a1"] / (r["phi_bytes"] * (world - 1) / world) for r in sel], 0.8 / len(worlds),
                    label=f"N={world}")
    axes[2].plot(stages, [PAPER_FACTOR[s] for s in stages], "k_", markersize=30, label="paper (2Φ / 3Φ)")
    axes[2].set_ylim(0, 4)
    titles = ("model states per rank (KiB)", "median step time / stage 0", "native bytes per step (1 micro-step) / Φ'")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xticks(stages)
        ax.set_xlabel("ZeRO stage")
        ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_name("." + path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return True


def main(argv=None) -> int:
    """Run the msrun jobs, print and write the report; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--config", default=str(REPO / "configs" / "benchmark.yaml"))
    parser.add_argument("--out", default="outputs/benchmark")
    parser.add_argument("--world_sizes", type=int, nargs="+", help="override benchmark.world_sizes")
    parser.add_argument("--stages", type=int, nargs="+", help="override benchmark.stages (must include 0)")
    parser.add_argument("--timeout_s", type=int, help="override benchmark.timeout_s, the bound of each msrun job")
    parser.add_argument("--peak_memory", action="store_true",
                        help="then run the peak-memory section (tools/bench/benchmark_peak.py, "
                             "configs/benchmark_peak.yaml)")
    parser.add_argument("--zeropp", action="store_true",
                        help="then report ZeRO++'s bytes per step for every combination "
                             "(tools/bench/benchmark_zeropp.py, N=4)")
    parser.add_argument("--offload_memory", action="store_true",
                        help="then run the offload section (tools/bench/benchmark_offload.py, "
                             "configs/benchmark_offload.yaml)")
    add_docs_flag(parser, "benchmark")
    args = parser.parse_args(argv)
    try:
        cfg = load_benchmark_config(args.config)
        for key in ("world_sizes", "stages", "timeout_s"):
            if getattr(args, key) is not None:
                cfg["benchmark"][key] = getattr(args, key)
        check_bench(cfg["benchmark"])
    except (ValueError, OSError) as err:
        parser.error(str(err))
    out = Path(args.out)
    rows, dense_rows = [], []
    for world in cfg["benchmark"]["world_sizes"]:
        print(f"running N={world}: stages {cfg['benchmark']['stages']} ...", flush=True)
        resolved = out / "config.yaml"
        out.mkdir(parents=True, exist_ok=True)
        resolved.write_text(yaml.safe_dump(cfg))
        run_world(str(resolved), world, out / f"N{world}", cfg["benchmark"]["timeout_s"])
        rows += summarize(cfg, out / f"N{world}", world)
        if world in cfg["dense"]["world_sizes"]:
            dense_rows += summarize(cfg, out / f"N{world}", world, prefix="dense_")
    report = render_tables(cfg, rows)
    if dense_rows:
        report += "\n\n" + render_dense_table(cfg, dense_rows)
    (out / "benchmark.md").write_text(report + "\n")
    (out / "results.json").write_text(json.dumps(rows + dense_rows, indent=1))
    print(report)
    if plot(rows, out / "benchmark.png"):
        print(f"chart: {out / 'benchmark.png'}")
    else:
        print("chart skipped: matplotlib is not installed (pip install -e '.[plot]')")
    print(f"tables: {out / 'benchmark.md'}")
    if args.docs:
        title = "ZeRO stages 0-3: memory, step time, communication"
        print(f"page: {write_report('benchmark', title, report, out_dir=args.docs)}")
    code = 0
    docs = ["--docs", args.docs]  # the sections write their own pages (peak.md, zeropp.md, offload.md)
    if args.peak_memory:
        code = benchmark_peak.main(["--out", str(out / "peak"), *docs])
    if args.zeropp and code == 0:
        code = benchmark_zeropp.main(["--out", str(out / "zeropp"), *docs])
    if args.offload_memory and code == 0:
        code = benchmark_offload.main(["--out", str(out / "offload"), *docs])
    return code


if __name__ == "__main__":
    sys.exit(main())
