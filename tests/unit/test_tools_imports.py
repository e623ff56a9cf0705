"""How ``tools/`` and ``tests/`` depend on each other: one way, through public names.

* The scripts of ``tools/`` import each other without a cycle (every ``import`` statement, inside
  functions too): shared code lives in modules such as ``tools/launch.py`` and
  ``tools/bench_common.py``, not in another script.
* ``tools/`` imports nothing of ``tests/``; the tests import only public names of ``tools/``.
* The unit tests leave ``sys.path`` alone (``tests/conftest.py`` puts the repository and
  ``tests/`` on it) and import no module of the msrun workers: models both need live in
  ``tests/`` (``models.py``, ``zero3_models.py``) or in ``tools/``.
"""
import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

REPO = Path(__file__).resolve().parents[2]
TOOLS = sorted((REPO / "tools").glob("*.py"))
TESTS = sorted((REPO / "tests").rglob("*.py"))
# what a test may import by its bare name: the helper modules of tests/ and tests/dist/ (both on
# sys.path for the tests) and the workers' own modules (their folder is on sys.path for a worker)
TEST_HELPERS = {p.stem for folder in ("tests", "tests/dist", "tests/dist/workers") for p in (REPO / folder).glob("*.py")}
WORKER_MODULES = {p.stem for p in (REPO / "tests" / "dist" / "workers").glob("*.py")}


def imports_in(source: str) -> Iterator[Tuple[str, List[str], int]]:
    """(module, names imported from it, line) for every ``import`` of ``source``, in functions too;
    ``import a.b`` gives ("a.b", [], line). Relative imports are skipped: tools/ and tests/ have none."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.module, [a.name for a in node.names], node.lineno


def tools_imported(module: str, names: List[str], stems: Set[str]) -> Set[str]:
    """The tools modules (stems) one import statement reaches: ``tools.x``, ``from tools import x``,
    or ``x`` alone (a script's own folder is first on ``sys.path``)."""
    parts = module.split(".")
    if parts[0] == "tools":
        return {parts[1]} if len(parts) > 1 else {n for n in names if n in stems}
    return {parts[0]} if parts[0] in stems else set()


def tools_graph(files: List[Path]) -> Dict[str, Set[str]]:
    """tools module -> the tools modules it imports."""
    stems = {f.stem for f in files}
    graph = {}
    for f in files:
        graph[f.stem] = set()
        for module, names, _ in imports_in(f.read_text()):
            graph[f.stem] |= tools_imported(module, names, stems) - {f.stem}
    return graph


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
    graph = tools_graph(sorted(tmp_path.glob("*.py")))
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert sorted(find_cycle(graph)[:-1]) == ["a", "b", "c"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
    assert private_imports("def f():\n    from tools.benchmark import _free_port, run\n") == ["tools.benchmark._free_port"]
    assert sys_path_changes("import sys\nsys.path.insert(0, 'x')\nif __name__ == '__main__':\n"
                            "    sys.path.append('y')\n") == [2]


def test_no_import_cycle_among_the_tools():
    graph = tools_graph(TOOLS)
    assert {"launch", "bench_common", "benchmark", "train"} <= set(graph)
    assert find_cycle(graph) == [], graph
    # the shared modules sit below the scripts that use them
    assert graph["launch"] == set()
    assert graph["bench_common"] <= {"launch", "train_config"}


def test_tools_import_nothing_of_the_tests():
    found = [f"{f.name}:{line} imports {module}" for f in TOOLS for module, _, line in imports_in(f.read_text())
             if module.split(".")[0] == "tests" or module.split(".")[0] in TEST_HELPERS]
    assert found == []


def test_the_tests_import_only_public_names_of_the_tools():
    found = [f"{f.relative_to(REPO)} imports {name}" for f in TESTS for name in private_imports(f.read_text())]
    assert found == []


def test_unit_tests_leave_sys_path_alone_and_import_no_worker_module():
    unit = sorted((REPO / "tests" / "unit").glob("*.py"))
    changes = [f"{f.name}:{line}" for f in unit for line in sys_path_changes(f.read_text())]
    assert changes == []
    workers = [f"{f.name}:{line} imports {module}" for f in unit for module, _, line in imports_in(f.read_text())
               if module.split(".")[0] in WORKER_MODULES or module.startswith("tests.dist.workers")]
    assert workers == []
