"""For developers: where a step's time goes, by kernel type.

Where a training step's time goes: MindSpore's profiler over the steps of one ZeRO setting,
summed per kernel type, several settings side by side.

    python tools/dev/profile_step.py --model lm --settings 0 3 3:units,keep --world_size 2

The settings (``stage`` or ``stage:flags``, flags from ``keep`` (``reshard_after_forward=False``)
and ``units`` (the config's gather units)) run in one msrun job on the model of
``configs/benchmark.yaml`` (``lm``: the demo LM, ``dense``: the Dense stack), built and stepped as
``tools/bench/benchmark.py`` does (each rank pinned to a core with ``pin_ranks``), one setting after
another: each is built, warmed up for ``warmup_steps`` steps, then a profiler of its own (its own
folder) records ``--steps`` optimizer steps of it alone; rank 0's kernels are summed per type into
milliseconds and launches per step. MindSpore 2.10's Profiler starts, stops and analyses several
times in one process; one job saves an msrun start-up per setting.

A collective's time is the time its kernel waits: for the bytes to move and for the slower rank
to arrive. When the ranks share cores, the second part dominates for small tensors (the
benchmark's "0 (+k idle collectives)" rows measure it). Time outside the kernels (graph launch
and scheduling) is not attributed, and the profiler's own cost grows with the number of kernels:
compare kernel times across settings, not the profiled step times with the benchmark's.

The table also gives the launches per step of the compute kernels (``COMPUTE``: matmuls,
normalisations, activations): a layer recomputed in backward launches its forward kernels twice.

Writes ``profile.md`` and ``profile.json`` into ``--out`` and prints the table.
"""
import argparse
import csv
import json
import os
import shutil
import sys
from pathlib import Path
from statistics import median
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench.bench_common import load_benchmark_config, run_world, setting_label, setting_name  # noqa: E402

COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AllToAll", "Send", "Receive")
# The compute kernels whose launches per step show a recomputed forward ([Note: reshard after forward]):
# matmuls, normalisations, activations, softmax and convolutions (forward kernels; "...Grad" are backward's).
COMPUTE = ("MatMul", "BatchMatMul", "Dense", "LayerNorm", "RmsNorm", "GeLU", "FastGeLU", "ReLU", "SiLU", "Sigmoid",
           "Tanh", "Softmax", "Conv2D", "Conv3D")
FLAGS = ("keep", "units")


def parse_setting(text: str) -> Tuple[int, bool, bool]:
    """``"3:units,keep"`` -> ``(3, False, True)``: (stage, reshard_after_forward, gather units).

    Raises:
        ValueError: naming ``--settings`` and the text.
    """
    stage_text, _, flag_text = text.partition(":")
    flags = [f for f in flag_text.split(",") if f] if flag_text else []
    if stage_text not in ("0", "1", "2", "3") or any(f not in FLAGS for f in flags) or len(set(flags)) < len(flags):
        raise ValueError(f"For 'profile_step', each of '--settings' must be a stage 0-3, optionally followed by "
                         f"':' and flags from {list(FLAGS)} separated by ',', but got {text!r}.")
    stage = int(stage_text)
    if flags and stage != 3:
        raise ValueError(f"For 'profile_step', the flags of '--settings' apply to stage 3 only, but got {text!r}.")
    return stage, "keep" not in flags, "units" in flags


def read_op_types(folder: Path, rank: int, steps: int) -> Dict[str, List[float]]:
    """``{kernel type: [ms per step, launches per step]}`` from the profiler's
    ``cpu_op_type_info_<rank>.csv`` under ``folder``.

    Raises:
        FileNotFoundError: the profiler wrote no such file.
    """
    found = sorted(folder.glob(f"**/cpu_op_type_info_{rank}.csv"))
    if not found:
        raise FileNotFoundError(f"For 'profile_step', no cpu_op_type_info_{rank}.csv under {folder}.")
    with open(found[-1], newline="") as f:
        return {row["op_type"]: [float(row["total_compute_time"]) / steps, int(row["type_occurrences"]) / steps]
                for row in csv.DictReader(f)}


def split_collectives(ops: Dict[str, List[float]]) -> Tuple[float, float]:
    """(ms per step in collective kernels, ms per step in all others)."""
    comm = sum(v[0] for k, v in ops.items() if k in COLLECTIVES)
    return comm, sum(v[0] for v in ops.values()) - comm


# ----------------------------------------------------------------------------- msrun worker
def worker(args) -> int:
    """Every setting under msrun, one after another: each built, warmed up and profiled for ``--steps``
    steps into its own folder (``setting_folder``), which gets ``profile_rank<r>.json``."""
    from mindspore import Profiler

    from tools.bench.benchmark_worker import DenseWorkload, LMWorkload, StageRun, plan_entries, start_worker

    cfg, rank, world = start_worker(args.config)
    workload = (LMWorkload if args.model == "lm" else DenseWorkload)(cfg, world)
    runs = []  # kept alive to the end: MindSpore keys parsed Cells by id
    for text in args.job_settings:
        stage, reshard, units = parse_setting(text)
        out = setting_folder(Path(args.out), args.model, stage, reshard, units)
        run = StageRun(workload, (stage, reshard, units, 0), rank, world, out)
        runs.append(run)
        for _ in range(cfg["benchmark"]["warmup_steps"]):
            run.run_step(timed=False)
        profiler = Profiler(output_path=str(out / "profiler"), start_profile=True)
        for _ in range(args.steps):
            run.run_step(timed=True)
        profiler.stop()
        profiler.analyse()
        plan = plan_entries(run.train_net)
        result = {"ops": read_op_types(out / "profiler", rank, args.steps), "step_times": run.times,
                  "planned_collectives": len(plan) if plan else None}
        tmp = out / f"profile_rank{rank}.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, out / f"profile_rank{rank}.json")
        print(f"rank {rank}: {text} profiled", flush=True)
    return 0


def setting_folder(out: Path, model: str, stage: int, reshard: bool, units: bool) -> Path:
    """Where one setting's profiler output and results go, under the job's ``--out``."""
    return out / f"{model}_{setting_name(stage, reshard, units)}"


# ----------------------------------------------------------------------------- report
def render(model: str, world: int, steps: int, results: Dict[str, dict], top: int) -> str:
    """Markdown: per kernel type, ms and launches per step of every setting (rank 0)."""
    labels = list(results)
    ops = {label: r["ops"] for label, r in results.items()}
    kinds = sorted(set().union(*ops.values()), key=lambda k: -max(o.get(k, [0, 0])[0] for o in ops.values()))
    lines = [f"{model}, N={world}, rank 0, {steps} profiled optimizer steps: ms / launches per step by kernel type.",
             "", "| | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]

    def row(name, cells):
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("step (profiled, median)", [f"{median(results[l]['step_times']) * 1e3:.1f} ms" for l in labels])
    row("kernels", [f"{sum(v[0] for v in ops[l].values()):.1f} ms / {sum(v[1] for v in ops[l].values()):.0f}"
                    for l in labels])
    row("collectives", [f"{split_collectives(ops[l])[0]:.1f} ms / "
                        f"{sum(v[1] for k, v in ops[l].items() if k in COLLECTIVES):.0f}" for l in labels])
    row("other kernels", [f"{split_collectives(ops[l])[1]:.1f} ms" for l in labels])
    row("collectives in the CommPlan", [str(results[l]["planned_collectives"]) for l in labels])
    for kind in [k for k in COMPUTE if any(k in o for o in ops.values())]:
        row(f"{kind} launches", [f"{ops[l][kind][1]:.0f}" if kind in ops[l] else "0" for l in labels])
    for kind in kinds[:top]:
        row(kind, [f"{ops[l][kind][0]:.2f} ms / {ops[l][kind][1]:.0f}" if kind in ops[l] else "-" for l in labels])
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--config", default=str(REPO / "configs" / "benchmark.yaml"))
    parser.add_argument("--out", default="outputs/profile")
    parser.add_argument("--model", choices=("lm", "dense"), default="lm")
    parser.add_argument("--settings", nargs="+", default=["0", "3", "3:units,keep"])
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=15, help="kernel types listed (the costliest first)")
    # under msrun: the settings, in this order (msrun would take "--worker" for its own "--worker_num")
    parser.add_argument("--job_settings", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job_settings:
        return worker(args)
    try:
        settings = [parse_setting(s) for s in args.settings]
        cfg = load_benchmark_config(args.config)
        for key in ("world_size", "steps", "top"):
            if getattr(args, key) < 1:
                raise ValueError(f"For 'profile_step', '--{key}' must be >= 1, but got {getattr(args, key)}.")
    except (ValueError, OSError) as err:
        parser.error(str(err))
    out = Path(args.out)
    folders = [setting_folder(out, args.model, *setting) for setting in settings]
    for folder in folders:
        if folder.exists():  # never report an earlier run's numbers
            shutil.rmtree(folder / "profiler", ignore_errors=True)
            for stale in folder.glob("profile_rank*.json"):
                stale.unlink()
    labels = [setting_label(*setting) for setting in settings]
    print(f"profiling {args.model} stages {', '.join(labels)} at N={args.world_size} in one job ...", flush=True)
    run_world(args.config, args.world_size, out, cfg["benchmark"]["timeout_s"] * len(settings),
              worker="tools/dev/profile_step.py",
              worker_args=["--job_settings", *args.settings, "--model", args.model, "--steps", str(args.steps)],
              what="profile_step")
    results = {label: json.loads((folder / "profile_rank0.json").read_text()) for label, folder in zip(labels, folders)}
    report = render(args.model, args.world_size, args.steps, results, args.top)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.md").write_text(report + "\n")
    (out / "profile.json").write_text(json.dumps(results, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
