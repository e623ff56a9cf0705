"""Threading a unit's gathered tensors through its code: the last step of planning in unit mode.

See [Note: gather units] in ``units.py``. The analysis of ``rewrite.py`` hands over a
``RewriteAnalysis`` (``rewrite_plan.py``): every method reached from the unit roots' ``construct``,
each read of a unit parameter already rewritten to ``zero3_unit[k]``, every call of a method or Cell
recorded; ``thread_units`` does the rest.

[Note: unit argument]
A method that needs the unit's tuple gets ``zero3_unit`` as its last positional parameter when it has
no ``*args`` and no defaults (``def construct(self, x, zero3_unit)``), else as a keyword-only one
(``def construct(self, x, mask=None, *, zero3_unit)``). A call that passes every other parameter
positionally passes it positionally too (``self.fc1(h, zero3_unit)``); any other call passes
``zero3_unit=zero3_unit``. Why not always the keyword: the graph compiler turns every call with a
keyword into an ``UnpackCall`` of its own, more nodes to type-infer per call. What a caller sees: a
forward hook of a Cell inside a unit (PYNATIVE_MODE) gets the tuple as its Cell's last input.
"""
import ast
from typing import List, Optional

from mindspore import Parameter, nn

from ..core.ms_internals import RECOMPUTE_WRAPPER, child_cells, own_params
from .rewrite_plan import RewriteAnalysis
from .units import UNIT_ARG, UNIT_GATHER_ATTR

__all__ = ["thread_units", "unreached_note"]


def param_path(root: nn.Cell, param: Parameter) -> Optional[List]:
    """Steps (attribute names, or int indices of CellLists) from ``root`` to ``param``; None if not found."""
    seen = set()

    def search(cell, steps):
        if id(cell) in seen:
            return None
        seen.add(id(cell))
        for name, p in own_params(cell).items():
            if p is param:
                return steps + [name]
        for name, child in child_cells(cell).items():
            if child is None or name == RECOMPUTE_WRAPPER:
                continue
            step = int(name) if isinstance(cell, (nn.CellList, nn.SequentialCell)) and name.isdigit() else name
            found = search(child, steps + [step])
            if found is not None:
                return found
        return None

    return search(root, [])


def _error(msg: str) -> ValueError:
    return ValueError(f"For 'shard_network', the argument 'gather_units' {msg}")


def _needs_fixpoint(analysis: RewriteAnalysis) -> None:
    """``needs_unit``: the method reads a unit tensor or calls a method of its unit that needs one."""
    changed = True
    while changed:
        changed = False
        for plan in analysis.plans.values():
            unit = analysis.units.get(id(plan.cell))
            if unit is None:
                continue
            for key, m in plan.methods.items():
                if m.tree is None or m.needs_unit:
                    continue
                uses = m.reads_unit or any(
                    getattr(analysis.method(c, k), "needs_unit", False) and analysis.units.get(c) is unit
                    for _, c, k in m.calls)
                if not uses:
                    continue
                if unit.root is plan.cell and key == "construct":
                    m.provides_unit = True
                else:
                    m.needs_unit = changed = True


def _check_free_name(plan, m) -> None:
    code = m.func.__code__
    if UNIT_ARG in code.co_varnames or UNIT_ARG in code.co_names:
        raise _error(f"cannot rewrite {plan.where(m)}: it already uses the name {UNIT_ARG!r}.")


def _positional_params(tree: ast.FunctionDef) -> Optional[int]:
    """The number of parameters after ``self`` when ``zero3_unit`` can follow them as one more positional
    parameter (no ``*args``, no defaults), else None ([Note: unit argument])."""
    a = tree.args
    if a.vararg is not None or a.defaults:
        return None
    return len(a.posonlyargs) + len(a.args) - 1


def _passes_every_parameter(call: ast.Call, params: Optional[int]) -> bool:
    """Whether ``call`` passes each of ``params`` parameters positionally, and nothing else."""
    return (params is not None and not call.keywords and len(call.args) == params
            and not any(isinstance(a, ast.Starred) for a in call.args))


def _pass_tuple(analysis: RewriteAnalysis, plan, m) -> None:
    unit = analysis.units.get(id(plan.cell))
    for node, cell_id, key in m.calls:
        callee = analysis.method(cell_id, key)
        if callee is None or not callee.needs_unit:
            continue
        callee_unit = analysis.units[cell_id]
        if unit is not callee_unit or not (m.needs_unit or m.provides_unit):
            callee_plan = analysis.plans[cell_id]
            raise _error(
                f"makes {callee_plan.where(callee)} part of the unit {callee_unit.describe()}, but "
                f"{plan.where(m)} calls it from outside that unit, where the unit's gathered parameters do "
                f"not exist. Call the unit's Cells only from the unit's own code, or leave them out of units."
            )
        tuple_name = ast.Name(id=UNIT_ARG, ctx=ast.Load())
        if _passes_every_parameter(node, callee.unit_params):
            node.args.append(tuple_name)
        else:
            node.keywords.append(ast.keyword(arg=UNIT_ARG, value=tuple_name))


def _chain(self_name: str, steps: List) -> ast.expr:
    node: ast.expr = ast.Name(id=self_name, ctx=ast.Load())
    for step in steps:
        if isinstance(step, int):
            node = ast.Subscript(value=node, slice=ast.Constant(step), ctx=ast.Load())
        elif step.isidentifier():
            node = ast.Attribute(value=node, attr=step, ctx=ast.Load())
        else:
            raise _error(f"cannot reach a parameter of the unit through the child name {step!r} (not an identifier).")
    return node


def _prologue(unit, tree: ast.FunctionDef) -> None:
    """``zero3_unit = self.zero3_unit_gather((self.<path to p0>, ...), x)`` at the start of the root's
    construct, ``x`` its first input (none if it takes none)."""
    root = unit.root
    if (UNIT_GATHER_ATTR in root.__dict__ or UNIT_GATHER_ATTR in child_cells(root)
            or hasattr(type(root), UNIT_GATHER_ATTR)):
        raise _error(f"cannot add {UNIT_GATHER_ATTR!r} to the unit {unit.describe()}: the Cell already has one.")
    self_name = tree.args.args[0].arg
    shards = []
    for param, _ in unit.elements:
        steps = param_path(root, param)
        if steps is None:
            raise _error(f"reads the parameter {param.name!r} in the unit {unit.describe()}, which the unit root "
                         f"does not hold in its subtree.")
        shards.append(_chain(self_name, steps))
    # [Note: gather order] in param_wrapper.py: the gathers wait for the root's first input
    after = [ast.Name(id=tree.args.args[1].arg, ctx=ast.Load())] if len(tree.args.args) > 1 else []
    call = ast.Call(func=ast.Attribute(value=ast.Name(id=self_name, ctx=ast.Load()), attr=UNIT_GATHER_ATTR,
                                       ctx=ast.Load()),
                    args=[ast.Tuple(elts=shards, ctx=ast.Load())] + after, keywords=[])
    stmt = ast.Assign(targets=[ast.Name(id=UNIT_ARG, ctx=ast.Store())], value=call, lineno=0)
    body = tree.body
    at = 1 if (body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
               and isinstance(body[0].value.value, str)) else 0
    body.insert(at, stmt)


def thread_units(analysis: RewriteAnalysis) -> None:
    """Give ``zero3_unit`` to the methods that need it, pass it at their calls, and gather it in each
    unit root's ``construct`` ([Note: gather units]). Modifies only the planned syntax trees.

    Raises:
        ValueError: naming the Cell and method, for a call into a unit's code from outside the unit,
            or a name the rewrite needs that the code already uses.
    """
    _needs_fixpoint(analysis)
    for plan in analysis.plans.values():  # before any signature changes
        for m in plan.methods.values():
            if m.tree is not None and m.needs_unit:
                m.unit_params = _positional_params(m.tree)
    for plan in list(analysis.plans.values()):
        for m in plan.methods.values():
            if m.tree is None:
                continue
            _pass_tuple(analysis, plan, m)
            if m.needs_unit or m.provides_unit:
                _check_free_name(plan, m)
            if m.needs_unit and m.unit_params is not None:
                m.tree.args.args.append(ast.arg(arg=UNIT_ARG))
            elif m.needs_unit:
                m.tree.args.kwonlyargs.append(ast.arg(arg=UNIT_ARG))
                m.tree.args.kw_defaults.append(None)
            if m.provides_unit:
                _prologue(analysis.units[id(plan.cell)], m.tree)


def unreached_note(network, units: dict, missing: list) -> str:
    """A hint for split parameters no analysed code reads, when they sit in gather units."""
    if not units:
        return ""
    owners: Optional[dict] = {}
    for path, cell in network.cells_and_names():
        for p in own_params(cell).values():
            if p is not None and any(p is q for q in missing) and id(cell) in units:
                owners.setdefault(units[id(cell)].describe(), []).append(path or "<top>")
    if not owners:
        return ""
    where = "; ".join(f"unit {u}: Cells {sorted(set(c))}" for u, c in owners.items())
    return (f". Inside gather units ({where}) a Cell's code runs only when the unit's code calls it as "
            f"self.<attribute>(...) (a loop over a CellList or SequentialCell, or getattr with a computed name, "
            f"cannot be given the unit's gathered parameters; [Note: gather units] in mindone_zero/zero3/units.py): "
            f"make such Cells units themselves or keep them out of units")
