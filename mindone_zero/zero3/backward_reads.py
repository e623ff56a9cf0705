"""Whether backward reads a gathered tensor: the re-gathers that MindSpore's GRAPH_MODE drops.

[Note: dropped re-gathers]
``reshard_after_forward`` marks a gather for recomputation ([Note: reshard after forward] in
reshard.py). MindSpore's recompute pass (GRAPH_MODE, 2.10) then gives a second copy of the gather to
each backward op that reads the gathered tensor, and to none other: a gather whose tensor no backward
op reads runs once. Whether a backward op reads an input is the primitive's: its bprop registration
(MindSpore's C++ ``REG_BPROP_BUILDER(...).SetUnusedInputs``) declares the inputs its gradient does
not need. In the compiled graph of the demo LM at stage 3 (``graph_build_*.ir``,
tests/dist/test_comm_graph.py) no re-gather runs for its LayerNorm betas (``LayerNorm``'s input 2),
its token embedding table (``Gather``'s input 0) or its positional embedding
(``self.pos_embedding[:n]``, a ``StridedSlice``'s input 0). Nor would one for a Dense's bias
gathered alone, a ``BiasAdd``'s input 1, whose bprop reads only the incoming gradient.

The rule (``backward_reads``), for a gather Cell held as ``attr`` by the Cell that calls it: backward
reads what it gathers unless every use of its result in that Cell's ``construct``, and in the methods
it calls as ``self.<method>(...)``, is

* an argument at a position of ``UNREAD_INPUTS`` of a primitive the Cell holds (``self.<op>(...)``),
  a dtype cast first followed to the op that takes its result, as a cast to the same dtype is
  removed by the compiler (so a cast to another dtype, whose own bprop reads nothing, is counted
  conservatively when the op after it reads its input);
* or sliced (``w[:n]``, a ``StridedSlice``).

Branches on a constant attribute of the Cell (``if self.has_bias:``) are folded as the compiler folds
them, and a method that no live code calls does not run. Anything else (an operand, a child Cell's
argument, a method it is returned from, a gather unit's tuple, a source that cannot be read) counts
as read: the plan may then count a re-gather that does not run, never miss one that does. Where the
reader is recomputed whole (its code is not direct, a user's ``recompute()``, PYNATIVE_MODE), its
recomputed forward needs every gathered tensor again, so every marked gather counts as re-gathered
(``train/comm_accounting.py``). Known and counted although it does not run: a MatMul's backward
reads its weight only for the gradient of its other input, so a first layer fed the network's
inputs (which need no gradient) re-gathers nothing either; nor does a frozen layer whose input
needs no gradient (in a LoRA fine-tune, frozen layers before the first trainable parameter). A
frozen parameter's gather sends no gradient back, so it has no reduce-scatter to count.
"""
import ast
import inspect
import textwrap
from typing import Dict, Iterator, Optional, Set, Tuple

from mindspore import nn, ops

from .direct_reads import gather_call_test, gathered_values

__all__ = ["UNREAD_INPUTS", "backward_reads"]

UNREAD_INPUTS = {"LayerNorm": (2,), "BiasAdd": (1,), "Gather": (0,), "GatherV2": (0,)}
"""Inputs (by position) whose value the bprop of the primitive (by name) does not read in MindSpore
2.10: LayerNorm's beta, BiasAdd's bias, the table of a Gather ([Note: dropped re-gathers]). A slice
(``StridedSlice``, input 0) is recognised by its syntax."""

_CASTS = frozenset({"astype", "cast"})
_CONSTANTS = (bool, int, float, str, type(None))


def _tree(func, parsed: Dict[object, Optional[ast.FunctionDef]]) -> Optional[ast.FunctionDef]:
    """``func``'s parsed ``def`` (None when its source cannot be read); ``parsed`` caches the parses
    of one walk (``backward_reads``)."""
    if func not in parsed:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]
        except (OSError, TypeError, SyntaxError, IndexError):
            tree = None
        parsed[func] = tree if isinstance(tree, ast.FunctionDef) and tree.args.args else None
    return parsed[func]


def _self_attr(node: ast.AST, self_name: str) -> Optional[str]:
    """``name`` of ``self.name``, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name:
        return node.attr
    return None


def _dead_nodes(tree: ast.FunctionDef, cell: nn.Cell, self_name: str) -> Set[int]:
    """ids of the nodes in branches never taken: ``if self.flag:`` / ``if not self.flag:`` on a
    constant attribute of ``cell``, folded as the graph compiler folds it."""
    dead = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test, negate = node.test, False
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, negate = test.operand, True
        name = _self_attr(test, self_name)
        value = getattr(cell, name, inspect) if name is not None else inspect
        if not isinstance(value, _CONSTANTS):
            continue
        taken = bool(value) != negate
        for stmt in node.orelse if taken else node.body:
            dead.update(id(n) for n in ast.walk(stmt))
    return dead


def _methods(cell: nn.Cell, parsed: dict) -> Iterator[Tuple[ast.FunctionDef, Set[int]]]:
    """(parsed method, ids of its dead nodes) of every method of ``cell`` that its ``construct`` reaches
    through live calls ``self.<method>(...)``, each once; (None, None) for one whose source cannot be
    read. Methods never called from ``construct`` do not run in the graph."""
    todo, seen = ["construct"], set()
    while todo:
        name = todo.pop()
        method = getattr(cell, name, None)
        if name in seen or not inspect.ismethod(method) or method.__self__ is not cell:
            continue
        seen.add(name)
        tree = _tree(method.__func__, parsed)
        if tree is None:
            yield None, None
            continue
        self_name = tree.args.args[0].arg
        dead = _dead_nodes(tree, cell, self_name)
        yield tree, dead
        todo += [n.func.attr for n in ast.walk(tree) if id(n) not in dead and isinstance(n, ast.Call)
                 and _self_attr(n.func, self_name) is not None]


def _unread(value: ast.AST, cell: nn.Cell, self_name: str, parents: dict) -> bool:
    """Whether the op that takes ``value`` does not read it in backward ([Note: dropped re-gathers])."""
    parent = parents.get(value)
    while True:  # a dtype cast: its result is what the op gets
        if isinstance(parent, ast.Attribute) and parent.attr in _CASTS and isinstance(parents.get(parent), ast.Call):
            value, parent = parents[parent], parents.get(parents[parent])
        elif (isinstance(parent, ast.Call) and parent.args and parent.args[0] is value
              and isinstance(parent.func, ast.Attribute) and parent.func.attr in _CASTS):
            value, parent = parent, parents.get(parent)
        else:
            break
    if isinstance(parent, ast.Subscript) and parent.value is value:
        parts = parent.slice.elts if isinstance(parent.slice, ast.Tuple) else [parent.slice]
        return all(isinstance(p, ast.Slice) for p in parts)
    if not isinstance(parent, ast.Call) or not any(a is value for a in parent.args):
        return False
    op = getattr(cell, _self_attr(parent.func, self_name) or "", None)
    position = next(i for i, a in enumerate(parent.args) if a is value)
    return isinstance(op, ops.Primitive) and position in UNREAD_INPUTS.get(op.name, ())


def backward_reads(cell: nn.Cell, attr: str, parsed: Optional[dict] = None) -> bool:
    """Whether a backward op may read the tensor(s) that ``cell``'s gather Cell ``attr`` returns: False
    only when every use of them in ``cell``'s code is known not to be read ([Note: dropped
    re-gathers]). Not collective.

    Args:
        cell: the Cell whose code calls the gather Cell.
        attr: the attribute of ``cell`` that holds the gather Cell.
        parsed: a dict the caller owns and passes to every call of one walk, so that each method's
            source is parsed once (``{function: its parsed def}``); None: parse afresh.
    """
    parsed = {} if parsed is None else parsed
    uses = 0
    for tree, dead in _methods(cell, parsed):
        if tree is None:
            return True
        self_name = tree.args.args[0].arg
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        live = gather_call_test(self_name, (attr,))
        for value in gathered_values(tree, lambda node: id(node) not in dead and live(node), parents):
            if id(value) in dead:
                continue
            if not _unread(value, cell, self_name, parents):
                return True
            uses += 1
    return uses == 0
