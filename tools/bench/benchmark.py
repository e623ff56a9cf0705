"""For benchmarking: writes ``docs/benchmarks/<name>.md``, its figure ``<name>.svg`` and its raw
results ``<name>.json`` (``tools/bench/pages.py``).

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

Writes ``benchmark.md`` (the tables) and ``results.json`` into ``--out``, and the page with its
figure (where matplotlib is installed: ``pip install -e .[plot]``) and raw results into
``docs/benchmarks/`` (``--docs``; ``tools/bench/pages.py``); prints the tables. ``--zeropp``
adds ZeRO++'s bytes per step for every combination of qwZ, hpZ and qgZ against plain stage 3
(``tools/bench/benchmark_zeropp.py``, into ``<out>/zeropp``).
"""
import argparse
import json
import sys
from pathlib import Path
from statistics import median
from typing import Callable, List, Sequence, Tuple

import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mindone_zero.memory.estimate import estimate_model_states_memory  # noqa: E402
from mindone_zero.core.stage import StagePolicy  # noqa: E402
from tools.bench import benchmark_offload, benchmark_peak, benchmark_zeropp  # noqa: E402
from tools.bench.pages import Page, publish  # noqa: E402
from tools.bench.report import add_docs_flag  # noqa: E402
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
    collective works on. Follows [Note: gradient reduction] in ``mindone_zero/train/grad_sync.py``:
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


def _lead(rows: List[dict]) -> Tuple[str, str, Callable[[dict], str]]:
    """(header cells, alignment cells, row -> leading cells) of a table: the N column only where the
    rows have more than one world size."""
    if len({r["world"] for r in rows}) > 1:
        return "| N | stage |", "|---:|---|", lambda r: f"| {r['world']} | {r['label']} |"
    return "| stage |", "|---|", lambda r: f"| {r['label']} |"


def render_tables(cfg: dict, rows: List[dict]) -> str:
    """The markdown report: memory and step time, communication, bytes by kind, and how to read them."""
    bench = cfg["benchmark"]
    p, g, k = bench["param_bytes"], bench["grad_bytes"], bench["optimizer_bytes"]
    head, align, lead = _lead(rows)
    worlds = sorted({r["world"] for r in rows})
    lines = [
        f"Demo LM ({rows[0]['num_params']} parameters, Φ = {rows[0]['phi_bytes']} B of fp32 parameters), Adam, "
        f"global batch {bench['global_batch_size']}, {bench['gradient_accumulation_steps']} micro-steps per "
        f"optimizer step, {bench['mode']} mode, {bench['timed_steps']} timed steps after {bench['warmup_steps']} "
        f"warm-up, CPU backend, {_placement(bench)}, N = {', '.join(map(str, worlds))}.",
        "",
        f"Memory and time: the model states per rank measured, the ZeRO paper's estimate ({p}+{g}+{k} B per "
        "parameter), and the median optimizer step.",
        "",
        f"{head} model states (KiB) | estimate (KiB) | measured / estimate | median step (ms) | vs stage 0 |",
        f"{align}---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"{lead(r)} {r['memory']['total'] / 1024:.1f} | {r['estimate'] / 1024:.1f} | "
                     f"{r['memory_ratio']:.3f} | {r['step_time'] * 1e3:.1f} | {r['time_ratio']:.2f}x |")
    lines += ["", "Communication per optimizer step and rank: the library's collectives, and the bytes the native "
              "path sends, also in Φ' = Φ (N-1)/N, with the paper's figure.", "",
              f"{head} collectives | native KiB | in Φ' | in Φ' at 1 micro-step | paper |",
              f"{align}---:|---:|---:|---:|---:|"]
    for r in rows:
        unit = r["phi_bytes"] * (r["world"] - 1) / r["world"]  # Φ' = Φ (N-1)/N: the paper's Φ on N ranks
        lines.append(f"{lead(r)} {_calls(r)} | {r['volume'] / 1024:.1f} | {r['volume'] / unit:.2f} | "
                     f"{r['volume_a1'] / unit:.2f} | {PAPER_FACTOR[r['stage']]}Φ |")
    kinds = [kind for kind in MEMORY_KINDS if any(r["memory"][kind] for r in rows)]
    zeros = [k.replace("_", " ") for k in MEMORY_KINDS if k not in kinds]
    lines += ["", "Measured bytes per rank by kind (`measure_model_states`"
              + (f"; left out, 0 everywhere: {', '.join(zeros)}" if zeros else "") + "):", "",
              f"{head} " + " | ".join(kind.replace("_", " ") for kind in kinds) + " | total |",
              align + "---:|" * (len(kinds) + 1)]
    for r in rows:
        cells = " | ".join(str(r["memory"][kind]) for kind in kinds + ["total"])
        lines.append(f"{lead(r)} {cells} |")
    lines += ["", *_notes(rows)]
    return "\n".join(lines)


def render_dense_table(cfg: dict, rows: List[dict]) -> str:
    """The markdown table of the Dense stack: step time per stage against stage 0."""
    dense = cfg["dense"]
    head, align, lead = _lead(rows)
    lines = [
        f"{dense['layers']} x Dense({dense['width']}, {dense['width']}) ({rows[0]['num_params']} parameters), "
        f"AdamWeightDecay, batch {dense['batch_per_rank']} per rank, {dense['gradient_accumulation_steps']} "
        f"micro-step(s) per optimizer step, {cfg['benchmark']['mode']} mode, {_placement(cfg['benchmark'])}, timed in "
        f"turns with the demo LM, N = {', '.join(map(str, sorted({r['world'] for r in rows})))}.",
        "",
        f"{head} median step (ms) | vs stage 0 | collectives / step | native KiB / step / rank |",
        f"{align}---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"{lead(r)} {r['step_time'] * 1e3:.1f} | {r['time_ratio']:.2f}x | {_calls(r)} | "
                     f"{r['volume'] / 1024:.1f} |")
    return "\n".join(lines)


def render_page(results: dict) -> str:
    """The page's body of ``{"config", "rows", "dense_rows"}``."""
    report = render_tables(results["config"], results["rows"])
    if results.get("dense_rows"):
        report += "\n\n" + render_dense_table(results["config"], results["dense_rows"])
    return report


def intro(results: dict) -> list:
    rows, dense = results["rows"], results.get("dense_rows") or []
    world = min(r["world"] for r in rows)
    at = [r for r in rows if r["world"] == world]
    s3 = (next(r for r in at if r["stage"] == 3 and r["reshard_after_forward"] and not r.get("units"))
          if any(r["stage"] == 3 for r in at) else None)
    d3 = next((r for r in dense if r["world"] == world and r["label"] == "3"), None)
    top = max(r["memory_ratio"] for r in at)
    slower = (f": stage 3 took {s3['time_ratio']:.2f}x stage 0's step on the demo LM"
              + (f" and {d3['time_ratio']:.2f}x on the large Dense layers" if d3 else "") if s3 else "")
    return [f"Per ZeRO stage, the model-state memory per rank, the median step time against stage 0 and the bytes "
            f"each rank communicates per step, on the demo LM ({rows[0]['num_params']} parameters) at "
            f"N = {', '.join(map(str, sorted({r['world'] for r in rows})))}"
            + (", and the step time of a stack of large Dense layers." if dense else "."),
            "Expect memory to fall as the ZeRO paper's formula says (stages 1-2 a little above it, up to "
            f"{top:.2f}x here: they keep a 1/N fp32 master copy the formula leaves out), the bytes of one "
            "micro-step to match the paper's 2Φ and 3Φ, and time to rise with the stage more than it would on a "
            "device: the CPU backend emulates reduce-scatter and all-gather, and on a model this small each "
            f"collective's fixed cost dominates{slower}; read the ratios, not the milliseconds."]


def draw(plt, results: dict):
    from tools.bench import plots

    rows, dense = results["rows"], results.get("dense_rows") or []
    many = len({r["world"] for r in rows}) > 1
    labels = [(f"N={r['world']}: " if many else "") + r["label"] for r in rows]
    fig, (mem, time_ax, comm) = plt.subplots(1, 3, figsize=plots.size(1, 3.8), sharey=True,
                                             gridspec_kw={"width_ratios": [1.4, 1, 1]})
    kinds = [kind for kind in MEMORY_KINDS if any(r["memory"][kind] for r in rows)]
    plots.hbars(mem, labels, {kind.replace("_", " "): [r["memory"][kind] / 1024 for r in rows] for kind in kinds},
                "KiB per rank", stacked=True)
    plots.marks(mem, [r["estimate"] / 1024 for r in rows], "paper's estimate")
    plots.legend_below(mem)
    mem.set_title("model states per rank")
    by_label = {(r["world"], r["label"]): r["time_ratio"] for r in dense}
    series = {"demo LM": [r["time_ratio"] for r in rows]}
    if dense:
        series["Dense stack"] = [by_label.get((r["world"], r["label"])) for r in rows]
    plots.hbars(time_ax, labels, series, "median step / stage 0's")
    time_ax.axvline(1.0, color="grey", linewidth=0.8)
    plots.legend_below(time_ax, 1)
    time_ax.set_title("step time")
    plots.hbars(comm, labels, {"native bytes": [r["volume_a1"] / (r["phi_bytes"] * (r["world"] - 1) / r["world"])
                                                for r in rows]}, "Φ' per step (1 micro-step)", colors=plots.COLORS[2:])
    plots.marks(comm, [PAPER_FACTOR[r["stage"]] for r in rows], "paper (2Φ, 3Φ)")
    plots.legend_below(comm, 1)
    comm.set_title("communication")
    return fig


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
                     f"reshard_after_forward=False. The rows \"3\" and \"3 (keep)\" gather per Cell "
                     f"(gather_units=None); the library's default, gather_units=\"auto\", makes the demo LM's "
                     f"blocks units ([Note: units by default] in mindone_zero/zero3/auto_units.py).")
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


PAGE = Page("benchmark", "ZeRO stages 0-3: memory, step time, communication", intro, render_page, draw,
            "per setting, the model states by kind against the paper's estimate, the step time against stage 0, "
            "and the bytes per step against the paper's.")


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
    results = {"config": cfg, "rows": rows, "dense_rows": dense_rows}
    report = render_page(results)
    (out / "benchmark.md").write_text(report + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(report)
    print(f"tables: {out / 'benchmark.md'}")
    if args.docs:
        print(f"page: {publish(PAGE, results, out_dir=args.docs)}")
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
