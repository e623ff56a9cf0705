"""For benchmarking: writes ``docs/benchmarks/<name>.md``, its figure ``<name>.svg`` and its raw
results ``<name>.json`` (``tools/bench/pages.py``).

Benchmark section: peak memory per rank of ZeRO training steps, stages 0-3, stage 3 both ways.

    python tools/bench/benchmark_peak.py --config configs/benchmark_peak.yaml --out outputs/benchmark/peak
    python tools/bench/benchmark.py ... --peak_memory     # the same, after the main tables

One msrun job per setting (a fresh process each, so that no setting inherits another's allocator
pools) runs ``tools/bench/benchmark_peak_worker.py``: ``layers`` x ``nn.Dense(width, width)`` (8 x 2048
by default: 33.6 M fp32 parameters, 134 MB) under an MSE loss with AdamWeightDecay, ``steps``
training steps, built in MindOne's order (``prepare_network`` first, so that at stage 3 the
optimizer states are created at shard size). For each setting the table gives, per rank (the largest over ranks):

* the peak memory of the steps (``measure_peak_memory``: on CPU the process's peak resident set
  during the steps, the first step's graph compilation included; on Ascend/GPU the runtime's peak
  allocated bytes), as growth around the steps (above what was in use once the train network was
  built: what the issue calls the peak of a training step) and as growth above what the process
  used before the network was built (``memory_in_use``; includes the model states and what the
  build left resident), each with its ratio to stage 0;
* the measured model-state bytes (``measure_model_states``), the paper's estimate of them
  (``estimate_model_states_memory``) and the peak estimate (``estimate_peak_memory``: model states
  plus the full-layer term; activations are not counted);
* the all-gather volume of one step from the library's ``CommPlan`` in units of Φ (parameter
  bytes): 1Φ(N-1)/N with ``reshard_after_forward=False``, 2Φ(N-1)/N with True (backward
  re-gathers);
* the last loss, the same for every setting (the options change memory, not the numbers).

Writes ``peak.md`` and ``peak.json`` into ``--out`` and prints the tables.
"""
import sys
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mindone_zero.memory.estimate import estimate_model_states_memory, estimate_peak_memory  # noqa: E402
from tools.bench.bench_common import MB, case_name, load_section, run_section, run_setting  # noqa: E402
from tools.bench.pages import Page  # noqa: E402

PEAK_DEFAULTS = {
    "world_size": 4,
    "layers": 8,
    "width": 2048,
    "micro_batch": 8,
    "steps": 6,
    "mode": "graph",
    "timeout_s": 600,
    # (zero_stage, reshard_after_forward); the option matters at stage 3 only
    "settings": [[0, True], [1, True], [2, True], [3, False], [3, True]],
    "param_bytes": 4,
    "grad_bytes": 4,
    "optimizer_bytes": 8,
}


def load_peak_config(path: str) -> dict:
    """The ``peak_memory`` section of a YAML file over ``PEAK_DEFAULTS``.

    Raises:
        ValueError: unknown key or bad value, naming it. OSError: unreadable file.
    """
    cfg = load_section(path, "peak_memory", PEAK_DEFAULTS, "load_peak_config")
    for key in ("world_size", "layers", "width", "micro_batch", "steps", "timeout_s"):
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"For 'load_peak_config', the argument 'peak_memory.{key}' must be an integer >= 1, "
                             f"but got {cfg[key]!r}.")
    settings = cfg["settings"]
    if not settings or [0, True] not in [list(s) for s in settings] or any(
            len(s) != 2 or s[0] not in (0, 1, 2, 3) or not isinstance(s[1], bool) for s in settings):
        raise ValueError(f"For 'load_peak_config', the argument 'peak_memory.settings' must be [stage, bool] pairs "
                         f"including [0, true] (the baseline), but got {settings!r}.")
    return cfg


def summarize(cfg: dict, results: dict) -> List[dict]:
    """One row per setting: the largest per-rank figures and the estimates."""
    width, layers, n = cfg["width"], cfg["layers"], cfg["world_size"]
    layer_params = width * width + width
    total = layer_params * layers
    nbytes = (cfg["param_bytes"], cfg["grad_bytes"], cfg["optimizer_bytes"])
    phi = total * cfg["param_bytes"]
    def from_build(r):
        return r["peak_bytes"] - r["before_build_bytes"]

    base = max(r["growth_bytes"] for r in results[(0, True)])
    base_build = max(from_build(r) for r in results[(0, True)])
    rows = []
    for (stage, reshard), ranks in results.items():
        growth, built = max(r["growth_bytes"] for r in ranks), max(from_build(r) for r in ranks)
        rows.append({
            "stage": stage, "reshard_after_forward": reshard if stage == 3 else None,
            "growth": growth, "ratio": growth / base, "from_build": built, "ratio_build": built / base_build,
            "peak": max(r["peak_bytes"] for r in ranks),
            "states": max(r["model_states"]["total"] for r in ranks),
            "states_estimate": estimate_model_states_memory(total, n, stage, *nbytes),
            "peak_estimate": estimate_peak_memory(total, n, stage, layer_params, *nbytes,
                                                  reshard_after_forward=reshard),
            "all_gather_phi": ranks[0]["comm"]["all_gather"]["volume"] / phi,
            "last_loss": ranks[0]["losses"][-1], "source": ranks[0]["source"],
        })
    return rows


def _label(r: dict) -> str:
    """``0``, ``3`` (resharding after forward, the default) or ``3 (keep)``, as on the stages page."""
    return str(r["stage"]) + (" (keep)" if r["reshard_after_forward"] is False else "")


def render(results: dict) -> str:
    """The page's tables of ``{"config", "rows"}``: measured peaks, then estimates."""
    cfg, rows = results["config"], results["rows"]
    n = cfg["world_size"]
    params = (cfg["width"] ** 2 + cfg["width"]) * cfg["layers"]
    lines = [
        f"Peak memory per rank, N={n}, {cfg['layers']} x Dense({cfg['width']}, {cfg['width']}) "
        f"({params / 1e6:.1f} M params, {params * 4 / MB:.0f} MB fp32), AdamWeightDecay, {cfg['mode']} mode, "
        f"{cfg['steps']} steps, micro-batch {cfg['micro_batch']}; MB = 1e6 bytes; source: {rows[0]['source']}. "
        "Stage \"3\" frees the gathered weights after forward (`reshard_after_forward=True`, the default), "
        "\"3 (keep)\" keeps them until backward.",
        "",
        "| stage | peak growth around the steps (MB) | / stage 0 | peak above the process before build (MB) "
        "| / stage 0 |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {_label(r)} | {r['growth'] / MB:.0f} | {r['ratio']:.2f} | {r['from_build'] / MB:.0f} "
                     f"| {r['ratio_build']:.2f} |")
    lines += ["", "Against the estimator (`estimate_model_states_memory`, `estimate_peak_memory`: model states plus "
              "the full-layer term, no activations), with the all-gather volume of one step in Φ (parameter bytes):",
              "", "| stage | model states measured (MB) | model-states estimate (MB) | peak estimate (MB) "
              "| all-gather per step (Φ) | last loss |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {_label(r)} | {r['states'] / MB:.0f} | {r['states_estimate'] / MB:.0f} "
                     f"| {r['peak_estimate'] / MB:.0f} | {r['all_gather_phi']:.2f} | {r['last_loss']:.6f} |")
    return "\n".join(lines)


def intro(results: dict) -> list:
    cfg, rows = results["config"], results["rows"]
    base = next(r for r in rows if r["stage"] == 0)
    low = min(rows, key=lambda r: r["growth"])
    below = all(r["states"] <= 1.01 * r["states_estimate"] for r in rows) and any(  # a few bytes of scalars over
        r["states"] < 0.95 * r["states_estimate"] for r in rows)
    states = (" (measured at or below the estimate: the estimator counts the gradients, which live only inside a "
              "step without accumulation)" if below else "")
    return [f"The peak memory per rank of {cfg['steps']} training steps at every ZeRO stage (N={cfg['world_size']}, "
            f"a stack of {cfg['layers']} Dense layers), each setting in a fresh msrun job, next to the measured "
            "model states and the estimator's figures.",
            f"Expect the model states to fall with the stage as the estimator says{states}, and the peak to fall "
            f"less: on CPU the peak is the process's resident set, which also holds the compiled graph, the "
            f"batch's activations and the allocator's pools; here stage {_label(low)} peaked lowest, at "
            f"{low['ratio']:.2f} of stage 0's {base['growth'] / MB:.0f} MB."]


def draw(plt, results: dict):
    from tools.bench import plots

    rows = results["rows"]
    labels = [f"stage {_label(r)}" for r in rows]
    fig, ax = plt.subplots(figsize=plots.size(1, 3.2))
    plots.hbars(ax, labels, {"peak growth around the steps": [r["growth"] / MB for r in rows],
                             "peak above the process before build": [r["from_build"] / MB for r in rows],
                             "model states measured": [r["states"] / MB for r in rows]}, "MB per rank (largest rank)")
    plots.marks(ax, [r["peak_estimate"] / MB for r in rows], "peak estimate (states + a full layer)")
    plots.legend_below(ax, 2)
    ax.set_title(f"peak memory per rank, N={results['config']['world_size']}")
    return fig


def _run_peak(cfg: dict, out: Path) -> dict:
    results = {}
    for stage, reshard in cfg["settings"]:
        print(f"running {case_name(stage, reshard)} (N={cfg['world_size']}) ...", flush=True)
        results[(stage, reshard)] = run_setting(cfg, stage, reshard, out)
    return {"config": cfg, "rows": summarize(cfg, results)}


PAGE = Page("peak", "Peak memory per rank of ZeRO training steps", intro, render, draw,
            "per stage, the measured peaks and model states (bars) and the estimator's peak (ticks).")


def main(argv=None) -> int:
    """Run one msrun job per setting, print and write the table; returns the exit code."""
    return run_section(argv, __doc__, str(REPO / "configs" / "benchmark_peak.yaml"), "outputs/benchmark/peak",
                       load_peak_config, _run_peak, PAGE)


if __name__ == "__main__":
    sys.exit(main())
