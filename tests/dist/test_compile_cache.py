"""tools/train.py with ``--compile_cache``: a second run of the same config, a new process as a
restart is, loads the graphs the first run compiled and gives the same losses, bit for bit
([Note: compile cache] in tools/compile_cache.py). Two msrun jobs of 2 ranks, ZeRO stage 3.

"Loads" is MindSpore's own word: with WARNING logging (``GLOG_v=2``) each graph it takes from the
cache instead of compiling logs ``LOADED`` (``compile_cache_manager.cc``, MindSpore 2.10), so every
rank of the second run logs it once per cached graph of that rank, and the first run never."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from msrun_harness import TIMEOUT_FACTOR

REPO = Path(__file__).resolve().parents[2]
LOADED = "Use the compilation cache and execute the backend actions only."
SMALL = ["--config", str(REPO / "configs" / "train_lm.yaml"), "--world_size", "2", "--steps", "2",
         "--ckpt_interval", "0", "--n_layers", "1", "--d_model", "32", "--global_batch_size", "8",
         "--eval_batch_size", "8"]


def _train(out: Path, cache: Path):
    cmd = [sys.executable, str(REPO / "tools" / "train.py"), *SMALL, "--output_dir", str(out),
           "--compile_cache", str(cache)]
    # GLOG_v=2: MindSpore's warnings, among them LOADED, reach the workers' logs
    env = dict(os.environ, GLOG_v="2", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"):
        env.pop(name, None)
    proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=480 * TIMEOUT_FACTOR)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
    assert proc.returncode == 0, stdout[-4000:]
    return stdout


def _files(cache: Path) -> dict:
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}


def _loaded(out: Path, rank: int) -> int:
    """How many graphs MindSpore took from the cache on ``rank`` (its LOADED lines)."""
    return (out / "msrun_logs" / f"worker_{rank}.log").read_text(errors="replace").count(LOADED)


def test_second_run_loads_the_cached_graphs_with_the_same_losses(tmp_path):
    cache = tmp_path / "cache"
    _train(tmp_path / "cold", cache)
    written = _files(cache)
    keys = [p.name for p in cache.iterdir()]
    assert len(keys) == 1, keys  # one subfolder: the key of this config
    for rank in (0, 1):
        assert any(name.startswith(f"{keys[0]}/rank_{rank}/graph_cache/") and "compile_cache_" in name
                   for name in written), written
    stdout = _train(tmp_path / "warm", cache)
    assert f"compile cache: {cache.resolve() / keys[0]}" in stdout
    assert _files(cache) == written  # loaded, not compiled and written again
    for rank in (0, 1):
        graphs = len(list((cache / keys[0] / f"rank_{rank}" / "graph_cache").glob("*compile_cache_*.mindir")))
        assert _loaded(tmp_path / "cold", rank) == 0 and graphs > 0, rank
        assert _loaded(tmp_path / "warm", rank) == graphs, (rank, graphs)  # every cached graph, each once
    cold, warm = ([json.loads(line) for line in (tmp_path / run / "history.jsonl").read_text().splitlines()]
                  for run in ("cold", "warm"))
    assert [h["loss"] for h in warm] == [h["loss"] for h in cold]
