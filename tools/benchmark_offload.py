"""Benchmark section: peak RSS and step time per rank with and without optimizer offload.

    python tools/benchmark_offload.py --config configs/benchmark_offload.yaml --out outputs/benchmark/offload

One msrun job per setting (``tools/benchmark_peak_worker.py``, the peak-memory worker, with
``offload`` "none", "cpu" or "nvme"): ``layers`` x ``nn.Dense(width, width)``, AdamWeightDecay,
``steps`` steps at ``zero_stage`` (stage 3 frees gathered weights after forward). Per setting,
the largest rank's figures: peak RSS during the steps (``measure_peak_memory``, process RSS on
CPU, the first step's compilation included), the model states on the device and the optimizer
states in host memory or files (``measure_model_states``), the median step time without the
first step, and the last loss (the same with and without offload). Rows with files also give the
peak saved against the same stage without offload, divided by the bytes in files (the issue
asks for at least 0.8). Writes ``offload.md`` and ``offload.json`` into ``--out``.
"""
import statistics
import sys
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.benchmark_peak import MB, load_section, run_benchmark, run_setting  # noqa: E402

DEFAULTS = {"world_size": 2, "layers": 8, "width": 2048, "micro_batch": 8, "steps": 6, "mode": "graph",
            "timeout_s": 600, "chunk_size": 2 ** 20,
            "settings": [[3, "none"], [3, "nvme"], [3, "cpu"], [2, "none"], [2, "nvme"]]}
OFFLOADS = ("none", "cpu", "nvme")


def load_offload_config(path: str) -> dict:
    """The ``offload_memory`` section of a YAML file over ``DEFAULTS``.

    Raises:
        ValueError: unknown key or bad value, naming it. OSError: unreadable file.
    """
    cfg = load_section(path, "offload_memory", DEFAULTS, "load_offload_config")
    settings = cfg["settings"]
    if not settings or any(len(s) != 2 or s[0] not in (0, 1, 2, 3) or s[1] not in OFFLOADS for s in settings):
        raise ValueError(f"For 'load_offload_config', the argument 'offload_memory.settings' must be "
                         f"[stage, offload] pairs with offload in {list(OFFLOADS)}, but got {settings!r}.")
    return cfg


def summarize(results: dict) -> List[dict]:
    """One row per (stage, offload): the largest rank's figures; file rows against no offload."""
    rows = []
    for (stage, offload), ranks in results.items():
        states = [r["model_states"] for r in ranks]
        rows.append({
            "stage": stage, "offload": offload, "peak": max(r["peak_bytes"] for r in ranks),
            "device_states": max(s["total"] for s in states), "host_states": max(s.get("host", 0) for s in states),
            "file_states": max(s.get("file", 0) for s in states),
            "step_seconds": max(statistics.median(r["step_seconds"][1:]) for r in ranks),
            "last_loss": ranks[0]["losses"][-1],
        })
    base = {r["stage"]: r for r in rows if r["offload"] == "none"}
    for r in rows:
        ref = base.get(r["stage"])
        if ref is not None and r["offload"] != "none":
            r["saved"] = ref["peak"] - r["peak"]
            r["step_ratio"] = r["step_seconds"] / ref["step_seconds"]
            offloaded = r["file_states"] + r["host_states"]
            r["saved_per_offloaded"] = r["saved"] / offloaded if offloaded else None
    return rows


def render(cfg: dict, rows: List[dict]) -> str:
    params = (cfg["width"] ** 2 + cfg["width"]) * cfg["layers"]
    lines = [
        f"Optimizer offload, N={cfg['world_size']}, {cfg['layers']} x Dense({cfg['width']}, {cfg['width']}) "
        f"({params / 1e6:.1f} M params, {params * 4 / MB:.0f} MB fp32), AdamWeightDecay, {cfg['mode']} mode, "
        f"{cfg['steps']} steps, micro-batch {cfg['micro_batch']}, file chunks of {cfg['chunk_size'] / 2 ** 20:g} MiB; "
        "per rank (largest rank), MB = 1e6 bytes.",
        "",
        "| stage | offload | peak RSS (MB) | states on device (MB) | optimizer states in host memory (MB) "
        "| in files (MB) | peak saved vs no offload (MB) | saved / offloaded bytes | median step (s) "
        "| / no offload | last loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        saved = f"{r['saved'] / MB:.0f}" if "saved" in r else "-"
        ratio = f"{r['saved_per_offloaded']:.2f}" if r.get("saved_per_offloaded") is not None else "-"
        step_ratio = f"{r['step_ratio']:.2f}x" if "step_ratio" in r else "-"
        lines.append(f"| {r['stage']} | {r['offload']} | {r['peak'] / MB:.0f} | {r['device_states'] / MB:.0f} "
                     f"| {r['host_states'] / MB:.0f} | {r['file_states'] / MB:.0f} | {saved} | {ratio} "
                     f"| {r['step_seconds']:.3f} | {step_ratio} | {r['last_loss']:.6f} |")
    return "\n".join(lines)


def _run_offload(cfg: dict, out: Path):
    results = {}
    for stage, offload in cfg["settings"]:
        print(f"running stage {stage}, offload {offload} (N={cfg['world_size']}) ...", flush=True)
        results[(stage, offload)] = run_setting(cfg, stage, True, out, offload)
    rows = summarize(results)
    return rows, render(cfg, rows)


def main(argv=None) -> int:
    """Run one msrun job per setting, print and write the table; returns the exit code."""
    return run_benchmark(argv, __doc__, str(REPO / "configs" / "benchmark_offload.yaml"),
                         "outputs/benchmark/offload", load_offload_config, _run_offload, "offload")


if __name__ == "__main__":
    sys.exit(main())
