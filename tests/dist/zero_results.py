"""Read the per-rank result files the dist workers write, and compute references."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from mindone_zero.partition import merge_arrays

WORKERS = Path(__file__).resolve().parent / "workers"
REPO = WORKERS.parents[2]


def reference(out_dir: Path, steps: int, clip: bool, optimizer: str, skipped=(), net: str = "full") -> dict:
    """Single-process whole-batch training (tests/dist/workers/reference.py), cached per args."""
    key = f"ref_{steps}_{int(clip)}_{optimizer}_{'-'.join(map(str, skipped))}_{net}"
    path = Path(out_dir) / f"{key}.npz"
    if not path.exists():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]), GLOG_v="3")
        subprocess.run(
            [sys.executable, str(WORKERS / "reference.py"), str(path), str(steps), "1" if clip else "0", optimizer,
             ",".join(map(str, skipped)), net],
            check=True, env=env, cwd=str(out_dir), capture_output=True, timeout=300,
        )
    data = np.load(path)
    return {"losses": data["losses"], "norms": data["norms"],
            "params": {k[len("param/"):]: data[k] for k in data.files if k.startswith("param/")}}


class RankResult:
    """One rank's results of one case: losses, flags, scales, params and their shard specs."""

    def __init__(self, out_dir: Path, case: str, rank: int):
        data = np.load(Path(out_dir) / f"{case}_rank{rank}.npz")
        with open(Path(out_dir) / f"{case}_rank{rank}.json") as f:
            self.meta = json.load(f)
        self.losses = data["losses"]
        self.overflows = data["overflows"]
        self.scales = data["scales"]
        self.final_scale = float(data["final_scale"])
        self.params = {k[len("param/"):]: data[k] for k in data.files if k.startswith("param/")}


def load_case(out_dir: Path, case: str, world: int):
    return [RankResult(out_dir, case, r) for r in range(world)]


def gathered_params(ranks) -> dict:
    """Full parameters: shards merged in rank order where the network holds shards (stage 3)."""
    out = {}
    for name, value in ranks[0].params.items():
        spec = ranks[0].meta["specs"].get(name)
        if spec and spec["split"]:
            out[name] = merge_arrays([r.params[name] for r in ranks], spec["shape"][0])
        else:
            out[name] = value
    return out


def mean_losses(ranks, accum: int) -> np.ndarray:
    """Per optimizer step: mean over ranks and micro-steps (the global-batch loss)."""
    return np.mean([r.losses.reshape(-1, accum) for r in ranks], axis=(0, 2))
