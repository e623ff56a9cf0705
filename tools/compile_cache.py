"""MindSpore's compile cache for ``tools/train.py`` (config key ``train.compile_cache``), made safe.

[Note: compile cache]
MindSpore 2.10 saves every graph a process compiles (``MS_COMPILER_CACHE_ENABLE=1``, or
``ms.set_context(enable_compile_cache=True)``) under ``MS_COMPILER_CACHE_PATH/rank_<r>/graph_cache/``
as ``<role>compile_cache_<k>.mindir`` (role ``MS_WORKER`` under msrun), ``k`` counting the process's compiles in order, with
``compile_dependency.hash``. A later process with the same settings loads graph ``k`` instead of
compiling its ``k``-th graph: on the CPU backend, at N=2, a restart's first train step then takes
a fraction of the cold compile (``python tools/bench/benchmark_compile.py``, "Restart with the
compile cache"), at every ZeRO stage, with the same loss.

What MindSpore checks before loading (``mindspore/graph/api.py``, ``_get_compile_cache_dep_files``):
only a hash of the entry script and of the Python files it imports that lie *outside* every
``sys.path`` entry at MindSpore's import. An installed library, or one on ``PYTHONPATH`` (as msrun
jobs here put the repository), is not in the hash; nor are the network's shapes, the config, the
world size or MindSpore's version. Measured here: a cache written for Dense(16) loaded for
Dense(24) ran without an error and gave a wrong loss, and so did one written before an edit of a
module on ``PYTHONPATH``. MindSpore itself therefore invalidates almost nothing.

So ``tools/train.py`` never points MindSpore at the folder it is given but at a subfolder named by a
hash of everything that decides its graphs (``cache_key``): the config (less the keys that do not
change a graph: ``GRAPH_FREE_KEYS``), the world size, MindSpore's and Python's versions, and the
source of this library and of the tools that build the model. A change of any of these starts an
empty subfolder (a cold compile); old subfolders stay until removed by hand. What the key cannot
see, and what therefore needs a fresh folder: a change of MindSpore's own installation under the
same version, environment variables that change compilation (``MS_DEV_*``, ``MS_JIT_*``), and a
change of the order in which a run compiles its graphs (the ``k``-th graph is loaded for the
``k``-th compile).
"""
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Dict

REPO = Path(__file__).resolve().parents[1]
# config keys that change no compiled graph: a run differing only in these shares the cache
GRAPH_FREE_KEYS = ("steps", "ckpt_interval", "output_dir", "seed", "init_seed", "compile_cache", "world_size")
# sources that build the graphs of tools/train.py (the library, MindOne's face, the demo model and job)
SOURCES = ("mindone_zero", "parallel_modules", "tools/lm_model.py", "tools/train.py", "tools/compile_cache.py")


def source_digest(root: Path = REPO, sources=SOURCES) -> str:
    """SHA-256 of the ``*.py`` files under ``sources`` (relative to ``root``), names and contents."""
    digest = hashlib.sha256()
    for source in sources:
        path = root / source
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def cache_key(cfg: Dict[str, Dict], world: int) -> str:
    """The name of the cache subfolder for a run of ``cfg`` on ``world`` ranks ([Note: compile cache])."""
    import mindspore

    graph_cfg = {section: {k: v for k, v in values.items() if k not in GRAPH_FREE_KEYS}
                 for section, values in cfg.items()}
    parts = {"config": graph_cfg, "world": world, "mindspore": mindspore.__version__,
             "python": platform.python_version(), "sources": source_digest()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def enable_compile_cache(root, cfg: Dict[str, Dict], world: int) -> Path:
    """Turn on MindSpore's compile cache in ``root/<cache_key>`` for this process; returns that folder.
    Must run before the process compiles its first graph. Not collective (every rank calls it with
    the same arguments and gets the same folder; MindSpore keeps one ``rank_<r>`` inside per rank)."""
    folder = Path(root).resolve() / cache_key(cfg, world)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
    os.environ["MS_COMPILER_CACHE_PATH"] = str(folder)
    return folder
