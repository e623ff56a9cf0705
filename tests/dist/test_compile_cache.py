"""tools/train.py with ``--compile_cache``: a second run of the same config, a new process as a
restart is, loads the graphs the first run compiled and gives the same losses, bit for bit
([Note: compile cache] in tools/compile_cache.py). Two msrun jobs of 2 ranks, ZeRO stage 3: the
cold run is the session's shared straight run of tools/train.py (``train_tool_straight``,
tests/dist/train_tool_job.py: 6 steps, checkpoints at steps 3 and 6, a fresh cache folder), which
tests/dist/test_train_tool.py checks as the demo job; the warm run repeats it here.

"Loads" is MindSpore's own word: with WARNING logging (``GLOG_v=2``) each graph it takes from the
cache instead of compiling logs ``LOADED`` (``compile_cache_manager.cc``, MindSpore 2.10), so every
rank of the second run logs it once per cached graph of that rank, and the first run never."""
from pathlib import Path

from train_tool_job import cache_files, explain, read_history, run_train

LOADED = "Use the compilation cache and execute the backend actions only."


def _loaded(out: Path, rank: int) -> int:
    """How many graphs MindSpore took from the cache on ``rank`` (its LOADED lines)."""
    return (out / "msrun_logs" / f"worker_{rank}.log").read_text(errors="replace").count(LOADED)


def test_second_run_loads_the_cached_graphs_with_the_same_losses(train_tool_straight, tmp_path):
    cold, cache, written = train_tool_straight["out"], train_tool_straight["cache"], train_tool_straight["cache_files"]
    assert cache_files(cache) == written  # nothing but the cold run wrote there
    keys = [p.name for p in cache.iterdir()]
    assert len(keys) == 1, keys  # one subfolder: the key of this config
    for rank in (0, 1):
        assert any(name.startswith(f"{keys[0]}/rank_{rank}/graph_cache/") and "compile_cache_" in name
                   for name in written), written
    warm = tmp_path / "warm"
    result = run_train(warm, "--compile_cache", cache)
    assert result.returncode == 0, explain(result, warm)
    assert f"compile cache: {cache.resolve() / keys[0]}" in result.stdout
    assert cache_files(cache) == written  # loaded, not compiled and written again
    for rank in (0, 1):
        graphs = len(list((cache / keys[0] / f"rank_{rank}" / "graph_cache").glob("*compile_cache_*.mindir")))
        assert _loaded(cold, rank) == 0 and graphs > 0, rank
        assert _loaded(warm, rank) == graphs, (rank, graphs)  # every cached graph, each once
    assert [h["loss"] for h in read_history(warm)] == [h["loss"] for h in read_history(cold)]
