"""For benchmarking: writes ``docs/benchmarks/<name>.md``, its figure ``<name>.svg`` and its raw
results ``<name>.json`` (``tools/bench/pages.py``).

Measure the memory the offline combine (``convert_checkpoints``) needs, against the checkpoint's size.

    python tools/bench/measure_combine_memory.py                      # 8 tensors of 100 MB over 4 ranks (800 MB)
    python tools/bench/measure_combine_memory.py --params 4 --param_mb 10 --formats ckpt

Writes per-rank files of ``--params`` fp32 tensors of about ``--param_mb`` MB each (dim 0 not
divisible by the group, so padding is dropped on the way), split over ``--ranks`` ranks as a
ZeRO run saves them, with their split-info JSON; then combines them in a fresh Python process
per format and reports that process's extra peak resident memory: VmHWM after the call minus
VmRSS before it (after ``import mindspore``), both read from ``/proc/self/status``, next to the
size of the rank files. Rank files and outputs go to a temporary folder (``--folder`` to keep
them), removed at the end. Needs about 2 x the checkpoint size of free disk per format.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mindone_zero.checkpoint import atomic_save_checkpoint, write_split_info  # noqa: E402
from mindone_zero.core.partition import ShardSpec, row_range  # noqa: E402
from tools.bench.pages import Page, publish  # noqa: E402
from tools.bench.report import add_docs_flag  # noqa: E402

_COLS = 1000
_PEAK_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import mindspore
from mindone_zero.checkpoint import convert_checkpoints
def mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
before = mb("VmRSS")
convert_checkpoints({src!r}, {info!r}, {ranks})
print(before, mb("VmHWM"))
"""


def _block(index: int, rows: int, ranks: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s padded block of tensor ``index`` (values depend on the row, zero padding)."""
    start, stop = row_range(rows, ranks, rank)
    block = np.zeros((stop - start, _COLS), np.float32)
    real = max(0, min(stop, rows) - start)
    block[:real] = (np.arange(start, start + real, dtype=np.float32)[:, None] + index)
    return block


def write_rank_files(folder: str, fmt: str, params: int, param_mb: float, ranks: int):
    """Per-rank checkpoints and split-info JSON; returns (ckpt pattern, json pattern, bytes of rank files)."""
    rows = int(param_mb * 1e6 / (4 * _COLS)) | 1  # odd: never divisible by an even group
    names = [f"layers.{i}.weight" for i in range(params)]
    total = 0
    for r in range(ranks):
        path = os.path.join(folder, f"net_rank{r}.{fmt}")
        atomic_save_checkpoint({n: _block(i, rows, ranks, r) for i, n in enumerate(names)}, path)
        total += os.path.getsize(path)
        write_split_info([ShardSpec(n, (rows, _COLS), ranks, r, True) for n in names], os.path.join(folder, "info"), r)
    return os.path.join(folder, "net_rank{}." + fmt), os.path.join(folder, "info", "params_split_info_{}.json"), total


def measure(src: str, info: str, ranks: int) -> int:
    """Extra peak resident bytes of ``convert_checkpoints`` in a fresh process."""
    script = _PEAK_SCRIPT.format(root=str(REPO), src=src, info=info, ranks=ranks)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    before, peak = (int(x) for x in res.stdout.split()[-2:])
    return peak - before


def render(results: dict) -> str:
    """The table of ``{"params", "param_mb", "ranks", "rows"}``."""
    lines = [f"Offline combine (`convert_checkpoints`, a fresh process, VmHWM above VmRSS before the call) of "
             f"{results['params']} tensors of {results['param_mb']:g} MB over {results['ranks']} ranks:", "",
             "| format | rank files | output | extra peak RSS of the combine | extra peak / checkpoint size |",
             "|---|---:|---:|---:|---:|"]
    for r in results["rows"]:
        lines.append(f"| {r['format']} | {results['ranks']} x {r['rank_files_bytes'] / results['ranks'] / 1e6:.0f} MB | "
                     f"{r['output_bytes'] / 1e6:.0f} MB | {r['extra_bytes'] / 1e6:.0f} MB | "
                     f"{r['extra_bytes'] / r['rank_files_bytes']:.3f} |")
    return "\n".join(lines)


def intro(results: dict) -> list:
    largest = results["param_mb"] * 1e6
    measured = ", ".join(f"{r['extra_bytes'] / 1e6:.0f} MB ({r['format']}, {r['extra_bytes'] / r['rank_files_bytes']:.2f} "
                         f"of the checkpoint)" for r in results["rows"])
    return [f"The extra peak memory of combining {results['ranks']} ranks' checkpoint files into one "
            f"(`convert_checkpoints`, in a fresh process), against the checkpoint's size, for each file format.",
            f"Expect about twice the largest tensor, whatever the checkpoint's size: the combine holds one "
            f"tensor's blocks from every rank and their concatenation at a time, so 2 x {largest / 1e6:.0f} MB = "
            f"{2 * largest / 1e6:.0f} MB here (measured: {measured})."]


def draw(plt, results: dict):
    from tools.bench import plots

    rows = results["rows"]
    fig, ax = plt.subplots(figsize=plots.size(1, 2.4))
    plots.hbars(ax, [r["format"] for r in rows], {"rank files (the checkpoint)": [r["rank_files_bytes"] / 1e6 for r in rows],
                                                  "combined output": [r["output_bytes"] / 1e6 for r in rows],
                                                  "extra peak RSS of the combine": [r["extra_bytes"] / 1e6 for r in rows]},
                "MB")
    plots.marks(ax, [2 * results["param_mb"]] * len(rows), "twice the largest tensor")
    plots.legend_below(ax, 2)
    ax.set_title("offline combine: memory against the checkpoint's size")
    return fig


PAGE = Page("combine_memory", "Memory of the offline combine", intro, render, draw,
            "per format, the checkpoint's size, the output's and the combine's extra peak memory.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--params", type=int, default=8)
    parser.add_argument("--param_mb", type=float, default=100.0)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--formats", nargs="+", default=["ckpt", "safetensors"], choices=["ckpt", "safetensors"])
    parser.add_argument("--folder", help="keep the files here instead of a temporary folder")
    add_docs_flag(parser, "combine_memory")
    args = parser.parse_args(argv)
    for key in ("params", "ranks"):
        if getattr(args, key) < 1:
            parser.error(f"the argument '--{key}' must be >= 1, but got {getattr(args, key)}")
    if not args.param_mb > 0:
        parser.error(f"the argument '--param_mb' must be > 0, but got {args.param_mb}")
    root = args.folder or tempfile.mkdtemp(prefix="combine_memory_")
    results = {"params": args.params, "param_mb": args.param_mb, "ranks": args.ranks, "rows": []}
    try:
        for fmt in args.formats:
            folder = os.path.join(root, fmt)
            os.makedirs(folder, exist_ok=True)
            src, info, size = write_rank_files(folder, fmt, args.params, args.param_mb, args.ranks)
            extra = measure(src, info, args.ranks)
            out = src.format(f"all_{args.ranks}")
            results["rows"].append({"format": fmt, "rank_files_bytes": size, "output_bytes": os.path.getsize(out),
                                    "extra_bytes": extra})
            print(render(results).splitlines()[-1], flush=True)
            if not args.folder:
                shutil.rmtree(folder)
    finally:
        if not args.folder:
            shutil.rmtree(root, ignore_errors=True)
    print(render(results))
    if args.docs:
        print(f"page: {publish(PAGE, results, out_dir=args.docs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
