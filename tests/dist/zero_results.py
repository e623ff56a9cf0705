"""Read the per-rank result files the dist workers write, and compute references."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from mindone_zero.core.partition import merge_arrays

WORKERS = Path(__file__).resolve().parent / "workers"
REPO = WORKERS.parents[2]


def reference_spec(steps: int, clip: bool, optimizer: str, skipped=(), net: str = "full") -> dict:
    """Arguments of one single-process reference run."""
    return dict(steps=int(steps), clip=bool(clip), optimizer=optimizer, skipped=list(skipped), net=net)


def _reference_path(out_dir: Path, spec: dict) -> Path:
    key = f"ref_{spec['steps']}_{int(spec['clip'])}_{spec['optimizer']}_{'-'.join(map(str, spec['skipped']))}_{spec['net']}"
    return Path(out_dir) / f"{key}.npz"


def compute_references(out_dir: Path, specs) -> None:
    """Run every missing reference of ``specs`` in ONE process (tests/dist/workers/reference.py)."""
    todo, seen = [], set()
    for spec in specs:
        path = _reference_path(out_dir, spec)
        if not path.exists() and str(path) not in seen:
            seen.add(str(path))
            todo.append(dict(spec, path=str(path)))
    if not todo:
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]), GLOG_v="3")
    subprocess.run([sys.executable, str(WORKERS / "reference.py"), json.dumps(todo)],
                   check=True, env=env, cwd=str(out_dir), capture_output=True, timeout=600)


def reference(out_dir: Path, steps: int, clip: bool, optimizer: str, skipped=(), net: str = "full") -> dict:
    """Single-process whole-batch training: losses, pre-clip norms and final params."""
    spec = reference_spec(steps, clip, optimizer, skipped, net)
    compute_references(out_dir, [spec])
    data = np.load(_reference_path(out_dir, spec))
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


def rank_json(out_dir: Path, stem: str, world: int) -> list:
    """Every rank's ``{stem}_rank{r}.json``, in rank order; a worker's recorded error fails here."""
    found = []
    for rank in range(world):
        result = json.loads((Path(out_dir) / f"{stem}_rank{rank}.json").read_text())
        assert "error" not in result, result.get("error")
        found.append(result)
    return found


def load_case(out_dir: Path, case: str, world: int):
    return [RankResult(out_dir, case, r) for r in range(world)]


def gathered_params(ranks) -> dict:
    """Full parameters: where the network holds shards (stage 3), blocks merged in group-rank
    order. With hybrid groups several ranks hold the same block; they must be bit-identical."""
    out = {}
    for name, value in ranks[0].params.items():
        spec = ranks[0].meta["specs"].get(name)
        if not (spec and spec["split"]):
            out[name] = value
            continue
        blocks = {}
        for r in ranks:
            index = r.meta["specs"][name]["rank"]
            if index in blocks:
                assert np.array_equal(blocks[index], r.params[name]), f"replicas of block {index} of {name} differ"
            else:
                blocks[index] = r.params[name]
        out[name] = merge_arrays([blocks[i] for i in range(spec["group_size"])], spec["shape"][0])
    return out


def mean_losses(ranks, accum: int) -> np.ndarray:
    """Per optimizer step: mean over ranks and micro-steps (the global-batch loss)."""
    return np.mean([r.losses.reshape(-1, accum) for r in ranks], axis=(0, 2))
