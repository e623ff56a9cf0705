"""MindSpore's private API in one place ([Note: MindSpore internals] in
mindone_zero/core/ms_internals.py): every internal the package relies on is still what MindSpore
2.10 had, and no module of the package but ms_internals touches a private MindSpore name."""
import ast
from pathlib import Path

import numpy as np
import pytest
from mindspore import Parameter, ParameterTuple, Tensor, mint, nn, ops

from mindone_zero.core import ms_internals

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("mindone_zero", "parallel_modules")
INTERNALS_MODULE = Path("mindone_zero/core/ms_internals.py")


@pytest.mark.parametrize("internal", ms_internals.INTERNALS, ids=lambda internal: internal.name)
def test_each_internal_is_still_there(internal):
    found = ms_internals.problem(internal)
    assert found is None, found


def test_a_missing_internal_names_itself_its_place_and_its_users():
    def gone():
        return nn.Cell()._no_such_thing

    internal = ms_internals.Internal("nn.Cell._no_such_thing", "mindspore/nn/cell.py, Cell.__init__", "dict",
                                     "child_cells: shard_network finds no layer.", gone)
    message = ms_internals.problem(internal)
    for part in ("nn.Cell._no_such_thing", "MindSpore 2.10.0, mindspore/nn/cell.py", "shard_network finds no layer",
                 "mindone_zero/core/ms_internals.py", "AttributeError"):
        assert part in message
    wrong_kind = ms_internals.Internal("x", "y", "dict", "z", lambda: [])
    assert "not dict" in ms_internals.problem(wrong_kind)


def _private(names) -> set:
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _mindspore_private_names() -> set:
    """The private names of the MindSpore objects the package works with (Cells, containers,
    Parameters, Tensors, optimizers, primitives, mint layers, a recomputed Cell)."""
    state = np.random.get_state()
    param = Parameter(Tensor(np.zeros(2, np.float32)), name="p")
    recomputed = nn.SequentialCell([nn.ReLU()])
    recomputed.recompute()
    objects = [nn.Cell(), nn.Cell, recomputed, nn.CellList([nn.ReLU()]), param, type(param), Parameter, Tensor,
               ParameterTuple, nn.SGD([param]), nn.Optimizer, ops.Primitive, ops.AllGather(),
               mint.nn.Conv1d(1, 1, 3, padding=1, padding_mode="reflect")]
    np.random.set_state(state)
    names = set()
    for obj in objects:
        names |= _private(dir(obj)) | _private(getattr(obj, "__dict__", {}))
    return names


def private_uses(source: str, private_names: set) -> list:
    """(line, what) for each private MindSpore name ``source`` touches: imports from private modules
    or of private names, attributes and strings spelled as a private MindSpore name, and private
    attributes of anything imported from mindspore."""
    tree = ast.parse(source)
    from_mindspore = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mindspore":
            for alias in node.names:
                from_mindspore.add(alias.asname or alias.name)
                if any(part.startswith("_") for part in node.module.split(".") + [alias.name]):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mindspore":
                    from_mindspore.add((alias.asname or alias.name).split(".")[0])
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        found.append((node.lineno, f"import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private_names:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Attribute) and _private([node.attr]):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in from_mindspore:
                found.append((node.lineno, f"{root.id}...{node.attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in private_names:
            found.append((node.lineno, repr(node.value)))
    return sorted(set(found))


def test_the_check_finds_each_form_of_use():
    source = (
        "import mindspore as ms\nfrom mindspore.parallel._utils import _get_parallel_mode\n"
        "from mindspore.common.recompute import _RecomputeCell\nimport mindspore._c_expression\n"
        "x = cell._cells\ny = getattr(cell, '_recompute_cell', None)\nz = ms._c_expression\n"
        "w = own._mine\n"
    )
    found = private_uses(source, _mindspore_private_names())
    assert [line for line, _ in found] == [2, 3, 4, 5, 6, 7], found


def test_no_module_but_ms_internals_touches_mindspore_internals():
    names = _mindspore_private_names()
    assert {"_cells", "_params", "_scope", "_recompute_cell", "_parameters", "_reversed_padding"} <= names
    found = []
    for top in PACKAGES:
        for path in sorted((REPO / top).rglob("*.py")):
            relative = path.relative_to(REPO)
            if relative == INTERNALS_MODULE:
                continue
            found += [f"{relative}:{line}: {what}" for line, what in private_uses(path.read_text(), names)]
    assert not found, (
        "These lines use MindSpore's private API; reach it through a function or constant of "
        f"{INTERNALS_MODULE} and list it in its INTERNALS ([Note: MindSpore internals]):\n" + "\n".join(found)
    )
