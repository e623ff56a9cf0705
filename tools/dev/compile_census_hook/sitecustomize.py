"""For developers: test infrastructure, loaded only by ``tools/dev/compile_census.py``'s runs.

The probe of ``tools/dev/compile_census.py``: that tool puts this folder first on ``PYTHONPATH``, so
every Python process of its run (pytest, its workers, msrun and the ranks) loads this file at start.

With ``MINDONE_ZERO_CENSUS_DIR`` set, a process appends to ``<dir>/<pid>.tsv``:
* ``compile<TAB>cell type<TAB>CPU s`` for every graph MindSpore compiles (a Cell's, or a
  ``jit`` function's as ``jit:<name>``), timed around ``_CellGraphExecutor.compile`` and
  ``_JitExecutor.compile``;
* ``exit<TAB>CPU s<TAB>command line`` at a normal exit (its own CPU, children not included).
Without it, this file does nothing. It shadows any other ``sitecustomize`` for that run only.
"""
import atexit
import builtins
import os
import resource
import sys
import time

_FOLDER = os.environ.get("MINDONE_ZERO_CENSUS_DIR")


def _write(line: str) -> None:
    with open(os.path.join(_FOLDER, f"{os.getpid()}.tsv"), "a") as f:
        f.write(line + "\n")


def _timed(api, original, label, compiled):
    """``original`` that logs its CPU seconds when ``compiled(result, cache size before)`` says it
    compiled (not when MindSpore found the graph already compiled)."""

    def compile_(self, *args, **kwargs):
        cache, start = len(api.ms_compile_cache), time.process_time()
        result = original(self, *args, **kwargs)
        if compiled(result, cache):
            what = label(args[0] if args else kwargs.get("obj", kwargs.get("method_name")))
            _write(f"compile\t{what}\t{time.process_time() - start:.4f}")
        return result

    return compile_


def _patch(api) -> None:
    # a Cell's compile returns (phase, True) when it compiled; a jit function's adds its phase to the cache
    api._CellGraphExecutor.compile = _timed(api, api._CellGraphExecutor.compile, lambda cell: type(cell).__name__,
                                            lambda result, _: bool(result[1]))
    api._JitExecutor.compile = _timed(api, api._JitExecutor.compile, lambda method: f"jit:{method}",
                                      lambda _, before: len(api.ms_compile_cache) > before)


def _at_exit() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _write(f"exit\t{usage.ru_utime + usage.ru_stime:.3f}\t{' '.join(sys.argv)[:400]}")


def _install() -> None:
    original_import = builtins.__import__
    patched = []

    def import_(name, *args, **kwargs):
        module = original_import(name, *args, **kwargs)
        api = sys.modules.get("mindspore.graph.api")
        # once, although imports nest: every import running when the executors appear returns here
        if not patched and api is not None and hasattr(api, "_CellGraphExecutor") and hasattr(api, "_JitExecutor"):
            patched.append(api)
            builtins.__import__ = original_import
            _patch(api)
        return module

    builtins.__import__ = import_
    atexit.register(_at_exit)


if _FOLDER:
    _install()
