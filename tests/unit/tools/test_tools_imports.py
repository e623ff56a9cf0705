"""How ``tools/`` and ``tests/`` depend on each other: one way, through public names.

``tools/`` holds the scripts for users (the demo job ``train.py`` and its model and config,
``convert_checkpoints.py``, ``estimate_memory.py``, ``device_check.py``); ``tools/bench/`` the
benchmarks; ``tools/dev/`` the development and test infrastructure (the msrun launcher, the
compile census, the profiler).

* The scripts of ``tools/`` import each other without a cycle (every ``import`` statement, inside
  functions too): shared code lives in modules such as ``tools/dev/launch.py`` and
  ``tools/bench/bench_common.py``, not in another script.
* The user scripts import nothing of ``tools/bench/``: a user's command never needs a benchmark.
* ``tools/`` imports nothing of ``tests/``; the tests import only public names of ``tools/``.
* Only the tests of the tools (``tests/unit/tools/``) import ``tools/bench/``: a test of the
  library does not depend on benchmark code (KNOWN_BENCH_USERS: the one that still does, through
  ``tools/dev/profile_step.py``, and why).
* The unit tests leave ``sys.path`` alone (``tests/conftest.py`` puts the repository and
  ``tests/`` on it) and import no module of the msrun workers: models both need live in
  ``tests/`` (``models.py``, ``zero3_models.py``) or in ``tools/``.
"""
import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

REPO = Path(__file__).resolve().parents[3]
TOOLS = sorted((REPO / "tools").rglob("*.py"))
TESTS = sorted((REPO / "tests").rglob("*.py"))
# what a test may import by its bare name: the helper modules of tests/ and tests/dist/ (both on
# sys.path for the tests) and the workers' own modules (their folder is on sys.path for a worker)
TEST_HELPERS = {p.stem for folder in ("tests", "tests/dist", "tests/dist/workers") for p in (REPO / folder).glob("*.py")}
WORKER_MODULES = {p.stem for p in (REPO / "tests" / "dist" / "workers").glob("*.py")}
# test modules outside tests/unit/tools/ that reach tools/bench/ through another tool, and why
KNOWN_BENCH_USERS = {
    # profile_step runs its settings through the benchmark's worker (tools/bench/benchmark_worker.py)
    "tests/dist/test_profile_collectives.py",
}


def imports_in(source: str) -> Iterator[Tuple[str, List[str], int]]:
    """(module, names imported from it, line) for every ``import`` of ``source``, in functions too;
    ``import a.b`` gives ("a.b", [], line). Relative imports are skipped: tools/ and tests/ have none."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.module, [a.name for a in node.names], node.lineno


def module_name(path: Path, root: Path) -> str:
    """A tools module's name below ``tools``: "train", "bench.benchmark", "dev.launch"."""
    return ".".join(path.relative_to(root).with_suffix("").parts)


def tools_imported(module: str, names: List[str], known: Set[str], folder: str = "") -> Set[str]:
    """The tools modules (names below ``tools``) one import statement reaches: ``tools.bench.x``,
    ``from tools.bench import x``, or ``x`` alone (a script's own ``folder`` is first on ``sys.path``)."""
    parts = module.split(".")
    if parts[0] == "tools":
        below = ".".join(parts[1:])
        if below in known:
            return {below}
        return {f"{below}.{n}" if below else n for n in names} & known
    bare = f"{folder}.{parts[0]}" if folder else parts[0]
    return {bare} if bare in known else set()


def tools_graph(files: List[Path], root: Path = REPO / "tools") -> Dict[str, Set[str]]:
    """tools module -> the tools modules it imports (names below ``root``)."""
    known = {module_name(f, root) for f in files}
    graph = {}
    for f in files:
        name = module_name(f, root)
        folder = name.rpartition(".")[0]
        graph[name] = set()
        for module, names, _ in imports_in(f.read_text()):
            graph[name] |= tools_imported(module, names, known, folder) - {name}
    return graph


def reached(graph: Dict[str, Set[str]], start: Set[str]) -> Set[str]:
    """Every module of ``graph`` that ``start`` imports, directly or through others."""
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One cycle of ``graph`` as a path that ends where it starts, or [] when there is none."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        return list(err.args[1])
    return []


def private_imports(source: str) -> List[str]:
    """``module.name`` for each name starting with ``_`` that ``source`` imports from tools/."""
    return [f"{module}.{name}" for module, names, _ in imports_in(source)
            if module.split(".")[0] == "tools" for name in names if name.startswith("_")]


def sys_path_changes(source: str) -> List[int]:
    """Lines of ``source`` that change ``sys.path``, outside an ``if __name__ == "__main__":`` block."""
    tree = ast.parse(source)
    main_blocks = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    in_main = {id(n) for block in main_blocks for n in ast.walk(block)}
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and id(n) not in in_main and ast.unparse(n.func).startswith("sys.path.")]


def test_the_checks_see_a_cycle_a_hidden_import_and_a_private_name(tmp_path):
    (tmp_path / "a.py").write_text("import os\n\ndef f():\n    from tools.b import g\n")
    (tmp_path / "b.py").write_text("from tools import c\n")
    (tmp_path / "c.py").write_text("def h():\n    import a\n")
    graph = tools_graph(sorted(tmp_path.glob("*.py")), tmp_path)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x.py").write_text("import y\nfrom tools.bench import z\n")
    (tmp_path / "bench" / "y.py").write_text("from tools import a\n")
    (tmp_path / "bench" / "z.py").write_text("")
    nested = tools_graph(sorted(tmp_path.rglob("*.py")), tmp_path)
    assert nested["bench.x"] == {"bench.y", "bench.z"} and nested["bench.y"] == {"a"}
    assert reached(nested, {"bench.y"}) == {"bench.y", "a", "b", "c"}
    assert sorted(find_cycle(graph)[:-1]) == ["a", "b", "c"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
    assert (private_imports("def f():\n    from tools.bench.benchmark import _free_port, run\n")
            == ["tools.bench.benchmark._free_port"])
    assert sys_path_changes("import sys\nsys.path.insert(0, 'x')\nif __name__ == '__main__':\n"
                            "    sys.path.append('y')\n") == [2]


def test_no_import_cycle_among_the_tools():
    graph = tools_graph(TOOLS)
    assert {"dev.launch", "bench.bench_common", "bench.benchmark", "bench.report", "train"} <= set(graph)
    assert find_cycle(graph) == [], graph
    # the shared modules sit below the scripts that use them
    assert graph["dev.launch"] == set()
    assert graph["bench.report"] == set()
    assert graph["bench.bench_common"] <= {"dev.launch", "bench.report", "bench.pages", "train_config"}
    assert graph["bench.pages"] <= {"bench.report", "bench.plots"} and graph["bench.plots"] <= {"bench.report"}


def test_the_user_scripts_import_no_benchmark():
    graph = tools_graph(TOOLS)
    users = {m for m in graph if "." not in m}
    assert {"train", "convert_checkpoints", "estimate_memory", "device_check"} <= users
    found = {m: sorted(b for b in reached(graph, graph[m]) if b.startswith("bench.")) for m in users}
    assert {m: b for m, b in found.items() if b} == {}


def test_only_the_tests_of_the_tools_import_benchmark_code():
    graph = tools_graph(TOOLS)
    known = set(graph)
    found = set()
    for f in TESTS:
        if (REPO / "tests" / "unit" / "tools") in f.parents:
            continue
        direct = set()
        for module, names, _ in imports_in(f.read_text()):
            direct |= tools_imported(module, names, known)
        if any(m.startswith("bench.") for m in reached(graph, direct)):
            found.add(f.relative_to(REPO).as_posix())
    assert found == KNOWN_BENCH_USERS


def test_tools_import_nothing_of_the_tests():
    found = [f"{f.name}:{line} imports {module}" for f in TOOLS for module, _, line in imports_in(f.read_text())
             if module.split(".")[0] == "tests" or module.split(".")[0] in TEST_HELPERS]
    assert found == []


def test_the_tests_import_only_public_names_of_the_tools():
    found = [f"{f.relative_to(REPO)} imports {name}" for f in TESTS for name in private_imports(f.read_text())]
    assert found == []


def test_unit_tests_leave_sys_path_alone_and_import_no_worker_module():
    unit = sorted((REPO / "tests" / "unit").rglob("*.py"))
    changes = [f"{f.name}:{line}" for f in unit for line in sys_path_changes(f.read_text())]
    assert changes == []
    workers = [f"{f.name}:{line} imports {module}" for f in unit for module, _, line in imports_in(f.read_text())
               if module.split(".")[0] in WORKER_MODULES or module.startswith("tests.dist.workers")]
    assert workers == []
