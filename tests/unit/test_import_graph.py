"""The import structure of ``mindone_zero`` and ``parallel_modules``.

* Every module imports on its own, first, in a process that has imported nothing of ours.
* The graph of imports between packages (every ``import`` statement, inside functions too) has
  no cycle: ``core`` at the bottom, ``parallel_modules`` on top of ``zero3``, and so on.
* No import of our own modules is hidden inside a function, and no package has a module-level
  ``__getattr__`` (the two ways a cycle was dodged before).
"""
import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set


REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("mindone_zero", "parallel_modules")


def _module_files() -> Dict[str, Path]:
    """module name -> source file, for every module of PACKAGES (packages as their __init__)."""
    found = {}
    for top in PACKAGES:
        for path in sorted((REPO / top).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _module_files()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _package_of(name: str) -> str:
    """The package a module belongs to: itself for a package, else its parent."""
    return name if _is_package(name) else name.rsplit(".", 1)[0]


def _absolute(name: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package_of(name).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _ours(target: str) -> str:
    """The longest prefix of ``target`` that is one of our modules, or ''."""
    parts = target.split(".")
    for k in range(len(parts), 0, -1):
        candidate = ".".join(parts[:k])
        if candidate in MODULES:
            return candidate
    return ""


def imports_of(name: str):
    """(imported module, line, inside a function) for every import of our modules in ``name``."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    in_function: Set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(fn) if n is not fn)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, node)
            # "from pkg import sub" imports the submodule sub when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            mod = _ours(target)
            if mod:
                yield mod, node.lineno, id(node) in in_function


def package_graph() -> Dict[str, Set[str]]:
    """package -> the other packages its modules import."""
    graph: Dict[str, Set[str]] = {_package_of(m): set() for m in MODULES}
    for name in MODULES:
        for target, _, _ in imports_of(name):
            src, dst = _package_of(name), _package_of(target)
            if src != dst:
                graph[src].add(dst)
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_find_cycles_sees_a_cycle_and_a_clean_graph():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_scanner_sees_imports_inside_functions(tmp_path):
    # the graph is only as good as its scanner: an import inside a function counts
    MODULES["mindone_zero._probe"] = tmp_path / "probe.py"
    try:
        (tmp_path / "probe.py").write_text("def f():\n    from .core import comm\n    from . import zero3\n")
        found = sorted(imports_of("mindone_zero._probe"))
        assert found == [("mindone_zero.core.comm", 2, True), ("mindone_zero.zero3", 3, True)]
    finally:
        del MODULES["mindone_zero._probe"]


def test_no_cycle_between_packages():
    graph = package_graph()
    assert {"mindone_zero.core", "mindone_zero.zero3", "mindone_zero.train", "parallel_modules"} <= set(graph)
    assert find_cycles(graph) == [], graph
    # the layering docs/design.md describes
    assert graph["mindone_zero.core"] == set()
    assert graph["mindone_zero.zero3"] == {"mindone_zero.core"}
    assert graph["parallel_modules"] == {"mindone_zero.zero3"}


def test_no_import_of_ours_inside_a_function():
    hidden = [f"{name}:{line} imports {target}" for name in sorted(MODULES)
              for target, line, inside in imports_of(name) if inside]
    assert hidden == []


def test_no_module_level_getattr():
    offenders = [name for name, path in MODULES.items()
                 if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
                        for n in ast.parse(path.read_text()).body)]
    assert offenders == []


def import_each_first() -> List[str]:
    """Import every module first, each in a forked child of this process, which must hold none of
    ours yet (MindSpore takes seconds to import: forking after it is what makes one process per
    module cheap). Returns "module: error" for each that fails.

    Python imports ``a.b.c`` by importing ``a`` first, then ``a.b``, then ``a.b.c``, whatever
    asked for it. So a process that has imported ``a`` and nothing else of ours is exactly the
    state in which a fresh process's ``import a.b.c`` reaches ``a.b``: each module's child is
    forked from one that imported its top package alone (``mindone_zero`` imports most modules,
    so the children have little left to do), and when the top package fails, every module under
    it fails with that error, as it would in a fresh process."""
    import mindspore  # noqa: F401
    import numpy  # noqa: F401
    import yaml  # noqa: F401

    held = [m for m in sys.modules if m.split(".")[0] in PACKAGES]
    if held:
        raise RuntimeError(f"the parent already holds {held[:3]}")
    failed = []
    for top in PACKAGES:
        names = [name for name in sorted(MODULES) if name.split(".")[0] == top]
        pid, read = _fork(lambda: _import_each_under(top, names), limit=None)
        with os.fdopen(read, "rb") as f:  # read it all before the wait: it can outgrow a pipe
            message = f.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            failed.extend(message.split("\0"))
    return failed


def _fork(work, limit=2000):
    """Run ``work`` (returning "" or a report) in a forked child that leaves without running any exit
    handlers, exiting 1 with the report (its first ``limit`` bytes) on the pipe when there is one, or
    when ``work`` raises. Returns (pid, read end of the pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            message = work()
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            message = f"{type(err).__name__}: {err}"
        data = message.encode()
        data = data if limit is None else data[:limit]
        while data:
            data = data[os.write(write, data):]
        os._exit(1 if message else 0)
    os.close(write)
    return pid, read


def _import_each_under(top: str, names: List[str]) -> str:
    """In a child: import ``top``, then each of ``names`` first in a child of this one, two at a
    time (the machine's cores). Returns the failures, "module: error" joined by NUL."""
    try:
        __import__(top)
    except BaseException as err:  # noqa: BLE001 - what a fresh process importing any of them meets
        return "\0".join(f"{name}: {type(err).__name__}: {err}"[:2000] for name in names)
    failed, running = [], {}  # pid -> (module, read end of its pipe)

    def reap():
        pid, status = os.wait()
        name, read = running.pop(pid)
        with os.fdopen(read, "rb") as f:
            message = f.read().decode(errors="replace")
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(f"{name}: {message}")

    def import_one(name):
        __import__(name)
        return ""

    for name in names:
        if len(running) >= 2:
            reap()
        pid, read = _fork(lambda name=name: import_one(name))
        running[pid] = (name, read)
    while running:
        reap()
    return "\0".join(failed)


def test_every_module_imports_alone_and_first():
    # a fresh interpreter: pytest's own process has imported our packages already
    proc = subprocess.run([sys.executable, __file__], cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"imported {len(MODULES)} modules"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    errors = import_each_first()
    print("\n".join(errors) if errors else f"imported {len(MODULES)} modules")
    sys.exit(1 if errors else 0)
