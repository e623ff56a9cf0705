"""tools/train.py as the tests launch it (the tool starts msrun itself), and the one run two modules share.

``straight``: 6 steps of a one-layer model at ZeRO stage 3, N=2, checkpoints at steps 3 and 6,
with ``--compile_cache`` into a fresh folder. tests/dist/test_train_tool.py checks it as the demo
job end to end (and resumes a copy of it); tests/dist/test_compile_cache.py takes it as its cold
run and repeats it warm. The session fixture ``train_tool_straight`` (tests/dist/conftest.py) runs
it once, so both modules form one group ([Note: test scheduling] in tests/scheduling.py).
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from msrun_harness import TIMEOUT_FACTOR, claim_job

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--config", str(REPO / "configs" / "train_lm.yaml"), "--world_size", "2", "--steps", "6",
         "--ckpt_interval", "3", "--n_layers", "1", "--d_model", "32", "--global_batch_size", "8",
         "--eval_batch_size", "8"]


def run_train(out: Path, *extra, timeout=480 * TIMEOUT_FACTOR) -> subprocess.CompletedProcess:
    """tools/train.py with ``SMALL``, ``--output_dir out`` and ``extra``, at ``GLOG_v=2`` (MindSpore's
    warnings, among them the compile cache's LOADED lines, reach the workers' logs), with no
    ``MS_COMPILER_CACHE_*`` variables of the caller's. Records the run with ``claim_job``: the same run
    twice in one suite run fails."""
    cmd = [sys.executable, str(REPO / "tools" / "train.py"), *SMALL, "--output_dir", str(out), *map(str, extra)]
    claim_job(REPO / "tools" / "train.py", 2, out, cmd[2:])
    env = dict(os.environ, GLOG_v="2", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"):
        env.pop(name, None)
    proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, "")


def explain(result, out: Path) -> str:
    """The exit status, the tool's output tail and each worker log's tail without MindSpore's warnings."""
    tails = []
    for log in sorted((out / "msrun_logs").glob("worker_*.log")):
        lines = [t for t in log.read_text(errors="replace").splitlines() if not t.startswith(("[WARNING]", "[INFO]"))]
        tails.append(f"--- {log.name}\n" + "\n".join(lines[-40:]))
    return f"exit {result.returncode}\n{result.stdout[-3000:]}\n" + "\n".join(tails)


def read_history(out: Path):
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


def cache_files(cache: Path) -> dict:
    """{path under ``cache``: modification time} of every file in the compile cache folder."""
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}


def run_straight(folder: Path) -> dict:
    """The shared straight run in ``folder``: {"out", "stdout", "cache", "cache_files"} (the cache's
    files right after it). Raises AssertionError with the logs if it fails."""
    out, cache = folder / "straight", folder / "cache"
    result = run_train(out, "--compile_cache", cache)
    assert result.returncode == 0, explain(result, out)
    return {"out": out, "stdout": result.stdout, "cache": cache, "cache_files": cache_files(cache)}
