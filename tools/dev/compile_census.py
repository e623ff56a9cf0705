"""For developers: where the test suite's CPU goes.

Where a test run's CPU goes: MindSpore's graph compiles, per process and per msrun job.

    python tools/dev/compile_census.py                                  # the whole suite, as CI runs it
    python tools/dev/compile_census.py -- tests/dist/test_zeropp.py -q  # any pytest arguments after --

Runs ``python -m pytest`` with ``tools/dev/compile_census_hook`` first on ``PYTHONPATH``: every
Python process of the run (pytest and its workers, msrun, every rank) logs the CPU seconds of each
graph it compiles and its own CPU at exit. Prints, and writes to ``<out>/census.json``:

* the run's wall time and CPU (user + sys of pytest and everything it started);
* the train-step compiles (``TrainOneStepWrapper``): how many, their CPU, the mean;
* the other compiles (the tests' reference networks, ``jit`` functions), and the rest of the CPU;
* the *floor*: the run's CPU had every train step compiled in ``--floor_s`` seconds, and its wall
  time at the run's own use of the cores;
* the jobs that cost most (processes grouped by script and output folder).

``--floor_s`` is what a train step would cost if ZeRO added nothing to its graph: by default 0.45 s,
MindSpore's own data-parallel step (``nn.TrainOneStepCell``, which all-reduces through
``nn.DistributedGradReducer``) on a network of the tests' TinyNet's size, the first row of
``python tools/bench/compile_cost.py --layers 4 --width 16`` (4 x Dense(16), N=2, rank 0; 2026-12-03). Most
train steps of the suite are larger (TinyNet's, the demo LM's), so the floor is below what they
would cost even then. Processes that leave without a normal exit (a pytest-xdist
worker, a killed rank) log no exit line; their CPU is in the run's total and in "unlogged".
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Sequence

REPO = Path(__file__).resolve().parents[2]
HOOK = Path(__file__).resolve().parent / "compile_census_hook"
ENV_FOLDER = "MINDONE_ZERO_CENSUS_DIR"
TRAIN_STEP = "TrainOneStepWrapper"
DEFAULT_FLOOR_S = 0.45


def _job_of(argv: str) -> str:
    """A process's job: its script and the last part of its ``--out`` (or ``--log_dir``) folder."""
    words = argv.split()
    if not words:
        return "?"
    path = Path(words[0])
    script = path.parent.name if path.name == "__main__.py" else path.name  # "python -m pytest": pytest
    if script == "msrun":
        found = re.search(r"--log_dir=(\S+)", argv)
        return f"msrun {Path(found.group(1)).parent.name}" if found else "msrun"
    found = re.search(r"--out[= ](\S+)", argv)
    return f"{script} {Path(found.group(1)).name}" if found else script


def read_logs(folder: Path) -> List[dict]:
    """One dict per process that logged: {"pid", "compiles": [(cell type, CPU s)], "cpu": CPU s at
    exit or None, "argv"}."""
    processes = []
    for path in sorted(folder.glob("*.tsv")):
        entry = {"pid": int(path.stem), "compiles": [], "cpu": None, "argv": ""}
        for line in path.read_text().splitlines():
            kind, *fields = line.split("\t")
            if kind == "compile":
                entry["compiles"].append((fields[0], float(fields[1])))
            elif kind == "exit":
                entry["cpu"], entry["argv"] = float(fields[0]), fields[1] if len(fields) > 1 else ""
        processes.append(entry)
    return processes


def summarize(processes: List[dict], wall_s: float, cpu_s: float, floor_s: float) -> dict:
    """The census of a run of ``wall_s`` seconds and ``cpu_s`` CPU seconds (see the module doc)."""
    steps = [c for p in processes for name, c in p["compiles"] if name == TRAIN_STEP]
    others: Dict[str, float] = defaultdict(float)
    for p in processes:
        for name, c in p["compiles"]:
            if name != TRAIN_STEP:
                others[name] += c
    jobs: Dict[str, dict] = defaultdict(lambda: {"processes": 0, "cpu": 0.0, "compile": 0.0, "train_steps": 0})
    for p in processes:
        job = jobs[_job_of(p["argv"]) if p["cpu"] is not None else "(no exit line)"]
        job["processes"] += 1
        job["cpu"] += p["cpu"] or 0.0
        job["compile"] += sum(c for _, c in p["compiles"])
        job["train_steps"] += sum(name == TRAIN_STEP for name, _ in p["compiles"])
    train_cpu, other_cpu = sum(steps), sum(others.values())
    floor_cpu = cpu_s - train_cpu + len(steps) * floor_s
    cores = cpu_s / wall_s if wall_s > 0 else 0.0
    return {
        "wall_s": wall_s, "cpu_s": cpu_s, "cores_used": cores,
        "train_steps": len(steps), "train_step_cpu_s": train_cpu,
        "train_step_mean_s": train_cpu / len(steps) if steps else 0.0,
        "other_compile_cpu_s": other_cpu, "other_compiles": dict(sorted(others.items(), key=lambda kv: -kv[1])),
        "rest_cpu_s": cpu_s - train_cpu - other_cpu,
        "unlogged_cpu_s": cpu_s - sum(p["cpu"] or 0.0 for p in processes),
        "msrun_launches": sum(job["processes"] for name, job in jobs.items() if name.startswith("msrun")),
        "floor_s": floor_s, "floor_cpu_s": floor_cpu, "floor_wall_s": floor_cpu / cores if cores else 0.0,
        "jobs": dict(sorted(jobs.items(), key=lambda kv: -kv[1]["cpu"])),
    }


def render(census: dict, top: int) -> str:
    c = census
    lines = [
        f"wall {c['wall_s']:.0f} s, CPU {c['cpu_s']:.0f} s ({c['cores_used']:.2f} cores), "
        f"{c['msrun_launches']} msrun launches",
        f"train-step compiles: {c['train_steps']}, {c['train_step_cpu_s']:.0f} CPU-s "
        f"(mean {c['train_step_mean_s']:.2f} s)",
        f"other compiles: {c['other_compile_cpu_s']:.0f} CPU-s; the rest: {c['rest_cpu_s']:.0f} CPU-s "
        f"({c['unlogged_cpu_s']:.0f} of the run's CPU in processes with no exit line)",
        f"floor, every train step compiled in {c['floor_s']:.2f} s: {c['floor_cpu_s']:.0f} CPU-s, "
        f"{c['floor_wall_s']:.0f} s wall ({c['floor_wall_s'] / 60:.1f} min) at {c['cores_used']:.2f} cores",
        "", "| job | processes | CPU s | compile CPU s | train steps |", "|---|---:|---:|---:|---:|",
    ]
    for name, job in list(c["jobs"].items())[:top]:
        lines.append(f"| {name} | {job['processes']} | {job['cpu']:.1f} | {job['compile']:.1f} | {job['train_steps']} |")
    return "\n".join(lines)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(pytest_args: Sequence[str], out: Path, floor_s: float) -> dict:
    """Run pytest under the probe; returns the census (logs in ``<out>/logs``, emptied first)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in logs.glob("*.tsv"):
        stale.unlink()
    env = dict(os.environ, **{ENV_FOLDER: str(logs.resolve())})
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK), *filter(None, [env.get("PYTHONPATH")])])
    cpu0, start = _children_cpu(), time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=REPO, env=env, check=False)
    wall, cpu = time.monotonic() - start, _children_cpu() - cpu0
    census = summarize(read_logs(logs), wall, cpu, floor_s)
    census["pytest_args"], census["pytest_exit"] = list(pytest_args), result.returncode
    return census


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--out", default="outputs/compile_census")
    parser.add_argument("--floor_s", type=float, default=DEFAULT_FLOOR_S,
                        help="CPU seconds of a train-step compile in the floor (default: MindSpore's own DP step)")
    parser.add_argument("--top", type=int, default=20, help="jobs listed (the costliest first)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: tests -q)")
    args = parser.parse_args(argv)
    if not args.floor_s >= 0:
        parser.error(f"argument --floor_s: must be >= 0, got {args.floor_s}")
    if args.top < 1:
        parser.error(f"argument --top: must be >= 1, got {args.top}")
    out = Path(args.out)
    census = run(args.pytest_args or ["tests", "-q"], out, args.floor_s)
    print(render(census, args.top))
    (out / "census.json").write_text(json.dumps(census, indent=1))
    print(f"\nwrote {out / 'census.json'} (pytest exited with {census['pytest_exit']})")
    return census["pytest_exit"]


if __name__ == "__main__":
    sys.exit(main())
