"""Whether a Cell's code hands its gathered parameters straight to the ops that consume them.

[Note: direct reads]
``reshard_after_forward`` frees a gathered tensor by recomputing only its gather in backward
([Note: reshard after forward] in ``reshard.py``). That frees the memory only if the op that keeps
the tensor for its backward (a MatMul keeps its weight input) receives the gathered tensor itself.
When the code first transforms it (``self.weight.T``, ``w.reshape(...)``, ``w * scale``,
``ops.transpose(w, ...)``), backward keeps the transformed tensor, a full-size copy the gather's
recompute does not free; such a Cell is recomputed whole instead, and ``shard_network`` names it.

A read is *direct* when the gathered value is a positional or keyword argument of a call whose
callee is not a layout or dtype transform (``TRANSFORMS``), either as the gathering expression
itself or through a local name bound or unpacked from it (``w = self.w_zero_gather(...)``,
``w, b = self.zero_gather_group.waiting_for(x, ...)``). Any other use (an attribute, a subscript,
an operand, a return, a container, a transform's argument) is *indirect*. A dtype cast
(``self.gamma.astype(x.dtype)``, as ``nn.LayerNorm`` writes it; ``ops.cast``) is followed to the op
that consumes its result: a cast to the same dtype is removed by the graph compiler, and one to a
narrower dtype leaves backward holding that copy (set the compute dtype with ``to_float`` instead:
the gather then casts). The rule looks at syntax only: it is conservative for transforms whose
backward keeps nothing (an ``Add`` of a reshaped bias), and it trusts a callee it does not know,
such as a child Cell handed a gathered weight.

Inside a gather unit ([Note: gather units] in ``units.py``) the gathered values are the subscripts
``zero3_unit[k]``; passing the tuple on to a method or Cell of ``self`` ([Note: unit argument] in
``unit_threading.py``) is direct (the callee's own reads are checked), any other use of the tuple
is not.
"""
import ast
import inspect
import textwrap
from typing import Callable, List

from mindspore import nn

from ..core.ms_internals import child_cells
from .coalesce import ZeroGatherGroup
from .param_wrapper import ZeroParamWrapper
from .units import UNIT_ARG

__all__ = ["TRANSFORMS", "indirect_uses", "gathered_values", "gather_call_test", "unit_read_test",
           "source_indirect_reads", "record_rewritten_reads", "gather_attrs", "INDIRECT_ATTR"]

INDIRECT_ATTR = "zero3_indirect_reads"
"""Attribute set on a reader Cell by ``shard_network``: the indirect reads of its code (a tuple of
strings; empty when every read is direct)."""

TRANSFORMS = frozenset({
    "T", "mT", "t", "transpose", "permute", "swapaxes", "swapdims", "moveaxis", "reshape", "view", "view_as",
    "flatten", "ravel", "squeeze", "unsqueeze", "expand_dims", "expand", "expand_as", "broadcast_to", "tile",
    "repeat", "repeat_interleave", "narrow", "split", "chunk", "unbind", "slice", "strided_slice", "tensor_split",
    "contiguous", "flip", "roll", "pad", "concat", "cat", "stack", "clone", "copy", "deepcopy",
})
"""Callee names treated as producing a full-size tensor from their input rather than consuming it
(a row lookup such as ``gather`` consumes: what it keeps is small)."""

CASTS = frozenset({"astype", "cast", "to", "float", "half", "bfloat16"})
"""Callee names of dtype casts, which are followed to the op that consumes their result."""


def _callee_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _is_argument(node: ast.expr, parent: ast.AST) -> bool:
    """``node`` is a positional or keyword argument of the call ``parent``."""
    if not isinstance(parent, ast.Call):
        return False
    return any(a is node for a in parent.args) or any(k.value is node for k in parent.keywords)


def _describe(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 100 else text[:97] + "..."


def gathered_values(tree: ast.FunctionDef, is_gathered: Callable[[ast.AST], bool], parents: dict) -> List[ast.AST]:
    """The expressions of ``tree`` that hold a gathered value: a gathering expression, or a load of a
    local name bound (or unpacked) from one. ``parents``: each node's parent in ``tree``."""
    values, names = [], set()
    for node in ast.walk(tree):
        if not is_gathered(node):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1:
            target = parent.targets[0]
            elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            if all(isinstance(e, ast.Name) for e in elts):
                names.update(e.id for e in elts)
                continue
        values.append(node)
    return values + [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                     and n.id in names]


def indirect_uses(tree: ast.FunctionDef, is_gathered: Callable[[ast.AST], bool]) -> List[str]:
    """The indirect uses ([Note: direct reads]) of the gathered values in ``tree``, each as the
    source text of the expression that uses it; empty when every use is direct."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    values = gathered_values(tree, is_gathered, parents)
    found = []
    while values:
        node = values.pop()
        parent = parents.get(node)
        cast = _cast_of(node, parent, parents)
        if cast is not None:  # followed: its result is the value the consumer gets
            values.append(cast)
            continue
        call = parents.get(parent) if isinstance(parent, ast.keyword) else parent
        if _is_argument(node, call) and _callee_name(call) not in TRANSFORMS:
            continue
        text = _describe(parent if parent is not None else node)
        if text not in found:
            found.append(text)
    found += _unit_tuple_uses(tree, parents)
    return found


def _cast_of(node: ast.AST, parent: ast.AST, parents: dict):
    """The call that casts ``node`` (``node.astype(t)``, ``ops.cast(node, t)``), or None."""
    if isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in CASTS:
        call = parents.get(parent)
        return call if isinstance(call, ast.Call) and call.func is parent else None
    if isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and _callee_name(parent) in CASTS:
        return parent
    return None


def _unit_tuple_uses(tree: ast.FunctionDef, parents: dict) -> List[str]:
    """Uses of the unit tuple ``zero3_unit`` other than a constant subscript or passing it on."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == UNIT_ARG and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node and isinstance(parent.slice, ast.Constant):
            continue
        if isinstance(parent, ast.keyword) and parent.arg == UNIT_ARG:
            continue
        if _passed_on(node, parent, tree.args.args[0].arg if tree.args.args else None):
            continue
        found.append(_describe(parents.get(parent, parent) if isinstance(parent, ast.keyword) else parent))
    return found


def _passed_on(node: ast.Name, call: ast.AST, self_name) -> bool:
    """``node`` is the last positional argument of a call of a method or Cell of ``self``
    (``self.fc(x, zero3_unit)``, ``super().m(x, zero3_unit)``: [Note: unit argument] in
    unit_threading.py)."""
    if not (isinstance(call, ast.Call) and call.args and call.args[-1] is node):
        return False
    func = call.func
    while isinstance(func, (ast.Attribute, ast.Subscript)):
        func = func.value
    if isinstance(func, ast.Call):  # super().m(...)
        return isinstance(func.func, ast.Name) and func.func.id == "super"
    return isinstance(func, ast.Name) and func.id == self_name and call.func is not func


def _gather_called(node: ast.AST, self_name: str):
    """The attribute ``attr`` of ``self.<attr>(...)`` or ``self.<attr>.waiting_for(...)`` (a coalesced
    group tied to the layer's input: [Note: gather order] in param_wrapper.py); None for anything else."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    func = node.func.value if node.func.attr == "waiting_for" else node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == self_name:
        return func.attr
    return None


def gather_call_test(self_name: str, attrs) -> Callable[[ast.AST], bool]:
    """Recognises ``self.<attr>(...)`` (and ``self.<attr>.waiting_for(...)``) for ``attr`` in ``attrs``:
    a call of a gather Cell."""
    attrs = frozenset(attrs)
    return lambda node: _gather_called(node, self_name) in attrs


def unit_read_test(node: ast.AST) -> bool:
    """Recognises ``zero3_unit[k]``: an element of a gather unit's tuple."""
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == UNIT_ARG
            and isinstance(node.slice, ast.Constant))


def gather_attrs(cell: nn.Cell) -> List[str]:
    """Attribute names of the gather Cells ``cell`` holds: its sharded wrappers and coalesced group."""
    return [name for name, c in child_cells(cell).items()
            if (isinstance(c, ZeroParamWrapper) and c.sharded) or isinstance(c, ZeroGatherGroup)]


def source_indirect_reads(cell: nn.Cell, gather_attrs) -> List[str]:
    """The indirect reads of ``cell``'s own ``construct`` (read from its source) through the gather
    Cells it holds as ``gather_attrs``; a reason to recompute the Cell when the source cannot be
    read or does not call every one of them."""
    func = getattr(type(cell), "construct", None)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return [f"the source of {type(cell).__name__}.construct cannot be read"]
    if not isinstance(tree, ast.FunctionDef) or not tree.args.args:
        return [f"{type(cell).__name__}.construct is not a plain method"]
    self_name = tree.args.args[0].arg
    called = {_gather_called(n, self_name) for n in ast.walk(tree)}
    missing = sorted(set(gather_attrs) - called)
    if missing:
        return [f"{type(cell).__name__}.construct does not itself call {missing}"]
    return indirect_uses(tree, gather_call_test(self_name, gather_attrs))


def record_rewritten_reads(plans, units: dict) -> None:
    """Set ``INDIRECT_ATTR`` on every reader the generic rewrite made ([Note: generic rewrite] in
    ``rewrite.py``): a rewritten Cell for its own wrappers, a unit root for all of its unit's code.
    ``plans``: the applied ``RewritePlan``s; ``units``: ``{id(cell): GatherUnit}``. Not collective."""
    found = {}
    for plan in plans:
        unit = units.get(id(plan.cell))
        owner = unit.root if unit is not None else plan.cell
        reasons = found.setdefault(id(owner), (owner, []))[1]
        for m in plan.emitted():
            test = unit_read_test if unit is not None else gather_call_test(m.tree.args.args[0].arg, plan.reads)
            reasons += [f"{plan.where(m)} uses a gathered parameter in {text}" for text in indirect_uses(m.tree, test)]
    for owner, reasons in found.values():
        object.__setattr__(owner, INDIRECT_ATTR, tuple(reasons))
