"""Two commits of the library, timed side by side: the median step (``benchmark.py``) and the first
call of the train step (``benchmark_compile.py``) at every ZeRO stage, with their ratios, and the
size of the compiled graphs (counted, so exact where the times are noisy).

    python tools/bench/side_by_side.py --before 60feb2e --after HEAD --rounds 2

Each commit is checked out into its own git worktree under ``--out``, and each round runs both
benchmarks in both trees, in turns (before, after; then after, before), so that a busy moment of
the machine falls on both sides. Each tree runs its own tools with its own code (``PYTHONPATH``
set to the tree). The table takes, per stage, the median over the rounds of each benchmark's
figure and gives the ratio after / before; a ratio is what this measures, not the seconds, which
depend on the machine's load. Writes ``<out>/side_by_side.md`` and ``.json``, stamped
(``tools/bench/report.py``), and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench.report import stamp, write_text_atomic  # noqa: E402  (reads the load at start)


def tree_at(rev: str, out: Path) -> Path:
    """A worktree of ``rev`` under ``out`` (made once; reused when it is at ``rev`` already)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    tree = out / "trees" / sha[:10]
    if not tree.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), sha], check=True,
                       capture_output=True)
    return tree


def _run(tree: Path, args: list, log: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree), GLOG_v="3")
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, *args], cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed in {tree} (exit {done.returncode}): see {log}")


def step_times(tree: Path, out: Path, args) -> dict:
    """``{stage: median step (s)}`` of ``benchmark.py``'s demo LM at ``args.world_size``."""
    stages = [str(s) for s in args.stages]
    _run(tree, ["tools/bench/benchmark.py", "--world_sizes", str(args.world_size), "--stages", *stages,
                "--out", str(out), "--docs", ""], out.with_suffix(".log"))
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"] if isinstance(results, dict) else results
    return {str(r["stage"]): r["step_time"] for r in rows
            if r.get("model", "lm") == "lm" and r["label"] == str(r["stage"])}


def first_calls(tree: Path, out: Path, args, graphs: bool = False) -> tuple:
    """``({stage: (first call wall s, median step s)}, {stage: graph sizes} or None)`` of
    ``benchmark_compile.py``, one round; the graph sizes (its graph-size job, counted from the IR
    files, the same in every round) when ``graphs``."""
    _run(tree, ["tools/bench/benchmark_compile.py", "--world_size", str(args.world_size), "--depths",
                str(args.depth), "--stages", *[str(s) for s in args.stages], "--rounds", "1", "--steps",
                str(args.steps), "--no_units", *([] if graphs else ["--no_graphs"]), "--cache_rounds", "0",
                "--out", str(out), "--docs_dir", str(out / "page")], out.with_suffix(".log"))
    report = json.loads((out / "compile.json").read_text())
    first = {e["row"].split()[-1]: (e["first_wall_s"], median(e["step_s"])) for e in report["timing"]
             if e["row"].startswith("stage ")}
    sizes = {e["row"].split()[-1]: {k: e[k] for k in GRAPH_FIGURES} for e in report.get("graphs", [])
             if e["row"].startswith("stage ")} if graphs else None
    return first, sizes


# benchmark_compile's graph sizes ([Note: compile cost] in mindone_zero/core/graph_tuples.py): the
# nodes after type inference (where most compile time goes) and of the kernel graphs (what runs).
GRAPH_FIGURES = ("type_inference_nodes", "kernel_nodes")


def graphs_table(before: dict, after: dict, stages) -> str:
    """Rank 0's graph sizes before and after: counted, so a ratio here is exact, unlike the times."""
    lines = ["| stage | nodes after type inference, before | after | ratio | kernel-graph nodes, before | after | "
             "ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    for s in map(str, stages):
        cells = []
        for key in GRAPH_FIGURES:
            b, a = before[s][key], after[s][key]
            cells.append(f"{b} | {a} | {a / b:.3f}" if a and b else f"{b} | {a} | -")
        lines.append(f"| {s} | {' | '.join(cells)} |")
    return "\n".join(lines)


def table(before: dict, after: dict, stages) -> str:
    lines = ["| stage | median step, before (ms) | after (ms) | ratio | first call, before (s) | after (s) | ratio | "
             "step in the compile job, ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in map(str, stages):
        b_step, a_step = (median(x["step"][s] for x in side) for side in (before, after))
        b_first, a_first = (median(x["first"][s][0] for x in side) for side in (before, after))
        b_cstep, a_cstep = (median(x["first"][s][1] for x in side) for side in (before, after))
        lines.append(f"| {s} | {b_step * 1e3:.1f} | {a_step * 1e3:.1f} | {a_step / b_step:.3f} | {b_first:.2f} | "
                     f"{a_first:.2f} | {a_first / b_first:.3f} | {a_cstep / b_cstep:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="60feb2e", help="the commit measured first in round 0")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--depth", type=int, default=2, help="blocks of benchmark_compile's model")
    parser.add_argument("--steps", type=int, default=10, help="benchmark_compile's calls after the first")
    parser.add_argument("--out", default="outputs/side_by_side")
    args = parser.parse_args(argv)
    if args.rounds < 1 or 0 not in args.stages:
        parser.error(f"--rounds must be >= 1 (got {args.rounds}) and --stages must include 0 (got {args.stages})")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    trees = {"before": tree_at(args.before, out), "after": tree_at(args.after, out)}
    measured, sizes = {"before": [], "after": []}, {}
    for k in range(args.rounds):
        for side in (("before", "after") if k % 2 == 0 else ("after", "before")):
            run = out / f"r{k}_{side}"
            run.mkdir(exist_ok=True)
            first, graph = first_calls(trees[side], run / "compile", args, graphs=k == 0)
            figures = {"step": step_times(trees[side], run / "step", args), "first": first}
            measured[side].append(figures)
            if graph is not None:  # round 0's
                sizes[side] = graph
            print(f"round {k} {side}: {json.dumps(figures)}", flush=True)
    command = ["python", "tools/bench/side_by_side.py", *(argv if argv is not None else sys.argv[1:])]
    body = (f"{stamp(command)}\n\nbefore: {args.before} ({trees['before'].name}), after: {args.after} "
            f"({trees['after'].name}); N={args.world_size}, {args.rounds} rounds, medians over rounds.\n\n"
            f"{table(measured['before'], measured['after'], args.stages)}\n\n"
            f"The compiled graphs of the first-call job (rank 0, counted from round 0's IR files):\n\n"
            f"{graphs_table(sizes['before'], sizes['after'], args.stages)}\n")
    write_text_atomic(out / "side_by_side.json", json.dumps({"args": vars(args), "measured": measured,
                                                             "graph_sizes": sizes}, indent=1))
    write_text_atomic(out / "side_by_side.md", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
