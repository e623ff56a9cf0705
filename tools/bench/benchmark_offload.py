"""For benchmarking: writes ``docs/benchmarks/<name>.md``, its figure ``<name>.svg`` and its raw
results ``<name>.json`` (``tools/bench/pages.py``).

Benchmark section: peak RSS and step time per rank with and without optimizer offload.

    python tools/bench/benchmark_offload.py --config configs/benchmark_offload.yaml --out outputs/benchmark/offload

One msrun job per model and setting (``tools/bench/benchmark_peak_worker.py``, the peak-memory worker,
with ``offload`` "none", "cpu" or "nvme"), AdamWeightDecay, ``steps`` steps at ``zero_stage``
(stage 3 frees gathered weights after forward). ``models`` lists the models side by side, each a
name plus the worker's model keys (``model`` "dense" or "lm", ``init``, ``activation``,
``prepare_first``, sizes; see that worker) and optionally its own ``settings``. Per model and
setting, the largest rank's figures: peak RSS during the steps (``measure_peak_memory``, process
RSS on CPU, the first step's compilation included), the model states on the device and the
optimizer states in host memory or files (``measure_model_states``), the median step time without
the first step, and the last loss (the same with and without offload). Offloaded rows also give
the peak saved against the same model and stage without offload, divided by the bytes offloaded
(issue 24 asks for at least 0.8 with files). Writes ``offload.md`` and ``offload.json`` into ``--out``.
"""
import statistics
import sys
import time
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench.bench_common import MB, load_section, run_section, run_setting  # noqa: E402
from tools.bench.pages import Page, publish  # noqa: E402
from tools.bench.report import DOCS  # noqa: E402

SETTINGS = [[3, "none"], [3, "nvme"], [3, "cpu"], [2, "none"], [2, "nvme"]]
DEFAULTS = {"world_size": 2, "steps": 6, "mode": "graph", "timeout_s": 600, "chunk_size": 2 ** 20,
            "models": [{"name": "dense", "model": "dense", "layers": 8, "width": 2048, "micro_batch": 8,
                        "init": "mindspore", "activation": "gelu", "prepare_first": False}],
            "settings": SETTINGS}
OFFLOADS = ("none", "cpu", "nvme")
MODEL_KEYS = {"dense": ("layers", "width", "micro_batch"),
              "lm": ("vocab_size", "d_model", "n_layers", "d_ff", "n_heads", "num_digits", "micro_batch")}


def _bad(key, expected, value):
    return ValueError(f"For 'load_offload_config', the argument 'offload_memory.{key}' must be {expected}, "
                      f"but got {value!r}.")


def _check_settings(key, settings):
    if not settings or any(len(s) != 2 or s[0] not in (0, 1, 2, 3) or s[1] not in OFFLOADS for s in settings):
        raise _bad(key, f"[stage, offload] pairs with offload in {list(OFFLOADS)}", settings)


def load_offload_config(path: str) -> dict:
    """The ``offload_memory`` section of a YAML file over ``DEFAULTS``.

    Raises:
        ValueError: unknown key or bad value, naming it. OSError: unreadable file.
    """
    cfg = load_section(path, "offload_memory", DEFAULTS, "load_offload_config")
    _check_settings("settings", cfg["settings"])
    models = cfg["models"]
    if not isinstance(models, list) or not models:
        raise _bad("models", "a non-empty list of models", models)
    for i, m in enumerate(models):
        kind = m.get("model") if isinstance(m, dict) else None
        if kind not in MODEL_KEYS or "name" not in m:
            raise _bad(f"models[{i}]", f"a dict with a 'name' and 'model' in {sorted(MODEL_KEYS)}", m)
        missing = [k for k in MODEL_KEYS[kind] if k not in m]
        if missing:
            raise _bad(f"models[{i}]", f"a {kind} model with keys {list(MODEL_KEYS[kind])} (missing {missing})", m)
        if "settings" in m:
            _check_settings(f"models[{i}].settings", m["settings"])
    return cfg


def summarize(results: dict) -> List[dict]:
    """One row per (model, stage, offload): the largest rank's figures; offloaded rows against no
    offload of the same model and stage. ``results`` maps (model, stage, offload) to rank results."""
    rows = []
    for (model, stage, offload), ranks in results.items():
        states = [r["model_states"] for r in ranks]
        rows.append({
            "model": model, "stage": stage, "offload": offload, "peak": max(r["peak_bytes"] for r in ranks),
            "device_states": max(s["total"] for s in states), "host_states": max(s.get("host", 0) for s in states),
            "file_states": max(s.get("file", 0) for s in states),
            "step_seconds": max(statistics.median(r["step_seconds"][1:]) for r in ranks),
            "last_loss": ranks[0]["losses"][-1],
        })
    base = {(r["model"], r["stage"]): r for r in rows if r["offload"] == "none"}
    for r in rows:
        ref = base.get((r["model"], r["stage"]))
        if ref is not None and r["offload"] != "none":
            r["saved"] = ref["peak"] - r["peak"]
            r["step_ratio"] = r["step_seconds"] / ref["step_seconds"]
            offloaded = r["file_states"] + r["host_states"]
            r["saved_per_offloaded"] = r["saved"] / offloaded if offloaded else None
    return rows


def describe(model: dict) -> str:
    """One line naming a model of the config."""
    if model["model"] == "lm":
        text = (f"TransformerLM (tools/lm_model.py) d_model {model['d_model']}, {model['n_layers']} layers, d_ff "
                f"{model['d_ff']}, vocab {model['vocab_size']}, sequence {2 * model['num_digits']}")
    else:
        text = (f"{model['layers']} x Dense({model['width']}, {model['width']})"
                + (" with GELU" if model.get("activation", "none") == "gelu" else ""))
    init = ("MindSpore's default initialisation" if model.get("init", "seeded") == "mindspore"
            or model["model"] == "lm" else "the benchmark's own initialisation")
    order = "prepare_network first" if model.get("prepare_first", True) else "prepare_train_network alone"
    return f"`{model['name']}`: {text}, {init}, {order}, micro-batch {model['micro_batch']}"


def _label(r: dict) -> str:
    return f"{r['model']}, stage {r['stage']}, {r['offload']}"


def render(results: dict) -> str:
    """The page's tables of ``{"config", "rows"}``: memory, then time."""
    cfg, rows = results["config"], results["rows"]
    lines = [f"Optimizer offload, N={cfg['world_size']}, AdamWeightDecay, {cfg['mode']} mode, {cfg['steps']} steps, "
             f"file chunks of {cfg['chunk_size'] / 2 ** 20:g} MiB; per rank (the largest rank), MB = 1e6 bytes. "
             "Models:", ""]
    lines += [f"- {describe(m)}" for m in cfg["models"]]
    lines += [
        "", "Memory: the peak resident set during the steps, where the model and optimizer states are, and the "
        "peak saved against no offload (of the same model and stage) per byte offloaded.", "",
        "| model, stage, offload | peak RSS (MB) | states on device (MB) | in host memory (MB) | in files (MB) "
        "| peak saved (MB) | saved / offloaded |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        saved = f"{r['saved'] / MB:.0f}" if "saved" in r else "-"
        ratio = f"{r['saved_per_offloaded']:.2f}" if r.get("saved_per_offloaded") is not None else "-"
        lines.append(f"| {_label(r)} | {r['peak'] / MB:.0f} | {r['device_states'] / MB:.0f} "
                     f"| {r['host_states'] / MB:.0f} | {r['file_states'] / MB:.0f} | {saved} | {ratio} |")
    lines += ["", "Time: the median step without the first (which compiles), and the last loss, the same with and "
              "without offload.", "",
              "| model, stage, offload | median step (s) | / no offload | last loss |", "|---|---:|---:|---:|"]
    for r in rows:
        step_ratio = f"{r['step_ratio']:.2f}x" if "step_ratio" in r else "-"
        lines.append(f"| {_label(r)} | {r['step_seconds']:.3f} | {step_ratio} | {r['last_loss']:.6f} |")
    return "\n".join(lines)


def intro(results: dict) -> list:
    rows = results["rows"]
    off = [r for r in rows if r["offload"] != "none" and "saved" in r]
    said = "; ".join(f"`{r['offload']}` saved {r['saved'] / MB:.0f} MB of the "
                     f"{(r['host_states'] + r['file_states']) / MB:.0f} MB it offloaded, at {r['step_ratio']:.2f}x the "
                     f"step time ({r['model']}, stage {r['stage']})" for r in off)
    faster = [r for r in off if r["step_ratio"] < 1]
    why = ("offload can even run faster than no offload, as it did here: the host update (nnacl's "
           "AdamWeightDecay, in place on views of the parameters, nothing copied) replaces the graph's own "
           "optimizer" if faster else "offload costs little time: the host update (nnacl's AdamWeightDecay, in "
           "place on views of the parameters) replaces the graph's own optimizer, with nothing to copy")
    return [f"Peak memory and step time per rank with the optimizer states on the device, in host memory (`cpu`) "
            f"and in files (`nvme`), on the same model and stage, with the losses checked equal: "
            f"{said or 'no offloaded row'}.",
            "Expect that on the CPU backend, where the device is the host: files save about the bytes they hold, "
            "host memory saves little (the states move within the same process's memory), and "
            f"{why}; on Ascend or GPU each step copies gradients and parameters between device and host, so "
            "there offload saves device memory and costs time."]


def draw(plt, results: dict):
    from tools.bench import plots

    rows = results["rows"]
    labels = [_label(r) for r in rows]
    fig, (states, peak, time_ax) = plt.subplots(1, 3, figsize=plots.size(1, 3.2), sharey=True)
    plots.hbars(states, labels, {"on device": [r["device_states"] / MB for r in rows],
                                 "in host memory": [r["host_states"] / MB for r in rows],
                                 "in files": [r["file_states"] / MB for r in rows]}, "MB per rank", stacked=True)
    plots.legend_below(states, 2)
    states.set_title("where the states are")
    plots.hbars(peak, labels, {"peak RSS": [r["peak"] / MB for r in rows]}, "MB per rank (largest rank)",
                colors=plots.COLORS[3:])
    peak.set_title("peak memory")
    plots.hbars(time_ax, labels, {"median step": [r["step_seconds"] for r in rows]}, "seconds per step",
                colors=plots.COLORS[4:])
    time_ax.set_title("step time")
    return fig


def _run_offload(cfg: dict, out: Path):
    results = {}
    for model in cfg["models"]:
        keys = {k: v for k, v in model.items() if k != "settings"}
        for stage, offload in model.get("settings", cfg["settings"]):
            print(f"running {model['name']}, stage {stage}, offload {offload} (N={cfg['world_size']}) ...", flush=True)
            results[(model["name"], stage, offload)] = run_setting(cfg, stage, True, out, offload, keys)
    return {"config": cfg, "rows": summarize(results)}


def sweep_chunk_sizes(numel: int, chunk_sizes, folder: str, repeats: int = 3) -> List[dict]:
    """The host update alone, in one process: AdamWeightDecay on one float32 tensor of ``numel``
    elements with its two states in files, for each chunk size in bytes: the median seconds per
    update and the peak RSS growth over the updates (``measure_peak_memory``). What ``chunk_size``
    trades: fewer, larger reads and writes against larger buffers."""
    import numpy as np
    from mindone_zero.memory.measure import measure_peak_memory
    from mindone_zero.offload import FileStore, HostRule, StepHyper
    from mindone_zero.offload.nnacl import adam_weight_decay_kernel

    rule = HostRule("AdamWeightDecay", ("moments1", "moments2"), 0.9, 0.999, 1e-6,
                    kernel="nnacl" if adam_weight_decay_kernel() else "numpy")
    hyper, rng = StepHyper((1e-4,), (0.01,), 1.0), np.random.default_rng(0)
    w, g = rng.standard_normal(numel, dtype=np.float32), rng.standard_normal(numel, dtype=np.float32)
    rows = []
    for chunk_bytes in chunk_sizes:
        store, chunk, seconds = FileStore(folder, "sweep_", chunk_bytes), max(1, chunk_bytes // 4), []
        for name in rule.states:
            store.create(name, np.zeros(numel, np.float32))

        def update():
            start = time.perf_counter()
            for lo in range(0, numel, chunk):
                states = {a: store.read(a, lo, min(lo + chunk, numel)) for a in rule.states}
                rule.update(w[lo:lo + chunk], g[lo:lo + chunk], states, 0, hyper)
                for a, values in states.items():
                    store.write(a, lo, values)
            seconds.append(time.perf_counter() - start)

        update()  # page cache and allocator warm
        peak = measure_peak_memory(update, steps=repeats)
        store.close()
        rows.append({"chunk_bytes": chunk_bytes, "seconds": statistics.median(seconds[1:]),
                     "growth_bytes": peak.growth_bytes, "kernel": rule.kernel})
    return rows


def render_sweep(sweep: dict) -> str:
    """The chunk-size table of ``{"numel", "rows"}``."""
    numel, rows = sweep["numel"], sweep["rows"]
    lines = [f"Host update alone, one tensor of {numel / 1e6:.1f} M float32 elements ({numel * 4 / MB:.0f} MB), "
             f"AdamWeightDecay ({rows[0]['kernel']}), states in files ({2 * numel * 4 / MB:.0f} MB):", "",
             "| chunk_size | median update (s) | peak RSS growth (MB) |", "|---:|---:|---:|"]
    lines += [f"| {r['chunk_bytes'] / 2 ** 20:g} MiB | {r['seconds']:.3f} | {r['growth_bytes'] / MB:.1f} |"
              for r in rows]
    return "\n".join(lines)


def intro_sweep(sweep: dict) -> list:
    rows = sweep["rows"]
    seconds = [r["seconds"] for r in rows]
    default = next((r for r in rows if r["chunk_bytes"] == DEFAULTS["chunk_size"]), None)
    if max(seconds) < 1.25 * min(seconds):
        time_said = f"the time moves little ({min(seconds):.3f}-{max(seconds):.3f} s)"
    elif seconds == sorted(seconds) or seconds == sorted(seconds, reverse=True):
        time_said = (f"the time {'rises' if seconds[-1] > seconds[0] else 'falls'} with the chunk "
                     f"({seconds[0]:.3f} to {seconds[-1]:.3f} s)")
    else:
        time_said = (f"the time follows no steady trend ({min(seconds):.3f}-{max(seconds):.3f} s: one update of "
                     f"one tensor, through the page cache, on a shared machine)")
    said = (f"; the default, {default['chunk_bytes'] / 2 ** 20:g} MiB, took {default['seconds']:.3f} s and "
            f"{default['growth_bytes'] / MB:.1f} MB" if default else "")
    return [f"The host optimizer update alone (AdamWeightDecay on one tensor of {sweep['numel'] / 1e6:.1f} M "
            "elements, both states in files), timed against `chunk_size`, the bytes read, updated and written "
            "back at a time, with the growth of the peak resident set.",
            f"Expect memory to grow in proportion to the chunk (the states' buffers), from "
            f"{rows[0]['growth_bytes'] / MB:.1f} MB to {rows[-1]['growth_bytes'] / MB:.1f} MB here (about "
            f"{rows[-1]['growth_bytes'] / rows[-1]['chunk_bytes']:.1f} x the largest chunk), while {time_said}{said}."]


def draw_sweep(plt, sweep: dict):
    from tools.bench import plots

    rows = sweep["rows"]
    xs = [r["chunk_bytes"] / 2 ** 20 for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=plots.size(1, 3.0))
    plots.lines(left, xs, {"median update": [r["seconds"] for r in rows]}, "chunk_size (MiB)", "seconds", log_x=True)
    left.set_ylim(bottom=0)
    left.set_title("time of one update")
    plots.lines(right, xs, {"peak RSS growth": [r["growth_bytes"] / MB for r in rows]}, "chunk_size (MiB)", "MB",
                log_x=True, colors=plots.COLORS[1:])
    right.set_title("memory")
    return fig


def main(argv=None) -> int:
    """Run one msrun job per model and setting, print and write the table; returns the exit code.
    ``--chunk_sweep NUMEL`` instead times the host update alone per chunk size (no msrun), into
    the page ``docs/benchmarks/offload_chunks.md`` (``--docs DIR`` as for the main table)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--chunk_sweep" in argv:
        import tempfile

        numel = int(argv[argv.index("--chunk_sweep") + 1])
        with tempfile.TemporaryDirectory() as folder:
            rows = sweep_chunk_sizes(numel, [2 ** 18, 2 ** 20, 2 ** 22, 2 ** 24], folder)
        sweep = {"numel": numel, "rows": rows}
        print(render_sweep(sweep))
        docs = argv[argv.index("--docs") + 1] if "--docs" in argv else str(DOCS)
        if docs:
            print(f"page: {publish(CHUNKS_PAGE, sweep, out_dir=docs)}")
        return 0
    return run_section(argv, __doc__, str(REPO / "configs" / "benchmark_offload.yaml"),
                       "outputs/benchmark/offload", load_offload_config, _run_offload, PAGE)


PAGE = Page("offload", "Peak memory and step time with and without optimizer offload", intro, render, draw,
            "per setting, where the model and optimizer states are, the peak memory and the median step.")
CHUNKS_PAGE = Page("offload_chunks", "Offload: chunk size of the file store", intro_sweep, render_sweep, draw_sweep,
                   "the host update's median time (left) and peak memory growth (right) against the chunk size.")


if __name__ == "__main__":
    sys.exit(main())
