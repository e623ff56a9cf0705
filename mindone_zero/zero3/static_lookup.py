"""What an attribute chain in a Cell's code stands for, found without running the code: the generic
rewrite's lookups ([Note: generic rewrite] in rewrite.py).

``lookup`` finds ``obj.name`` without running ``__getattr__``; ``candidates`` follows a chain through
a local variable bound to one, or through a subscript whose key is not a constant (PEFT's
``lora_A = self.lora_A[active_adapter]``), to every object it may stand for: each value of the
container that is subscripted. A read of ``.dtype`` or ``.ndim`` of a shard is the full parameter's
(``METADATA``), so it needs no gather.
"""
import ast
import inspect
import types
from typing import List, Optional, Set

from mindspore import Parameter, ParameterTuple, nn

from ..core.ms_internals import cell_member

__all__ = ["MISSING", "METADATA", "Method", "lookup", "follow", "subscript_key", "contains_split", "candidates"]

MISSING = object()
METADATA = ("dtype", "ndim")
"""Attributes of a Parameter that a shard shares with the full tensor: reading one needs no gather."""


class Method:
    """A plain function found on a Cell's class: a call target to analyse."""

    def __init__(self, cell, name):
        self.cell, self.name = cell, name


def lookup(obj, name):
    """``obj.name`` found without running ``__getattr__`` or descriptors other than properties;
    ``Method`` for a plain method, ``MISSING`` when it cannot be found statically."""
    if isinstance(obj, nn.Cell):
        member = cell_member(obj, name, MISSING)
        if member is not MISSING:
            return member
        d = obj.__dict__
        if name in d:
            return d[name]
        cls_attr = inspect.getattr_static(type(obj), name, MISSING)
        if isinstance(cls_attr, types.FunctionType):
            return Method(obj, name)
        if isinstance(cls_attr, property):
            try:
                return getattr(obj, name)
            except Exception:  # a property that fails here cannot be followed statically
                return MISSING
        return cls_attr
    if isinstance(obj, (int, float, str, bool, type(None))):
        return MISSING
    try:
        return inspect.getattr_static(obj, name, MISSING)
    except Exception:
        return MISSING


def follow(obj, steps):
    """The object at the end of a chain that resolved entirely through Cells."""
    for _, step in steps:
        obj = lookup(obj, step) if isinstance(step, str) else obj[step]
    return obj


def subscript_key(node: ast.Subscript):
    """The constant key of ``x[key]`` (an int or a str), else ``MISSING``."""
    sl = node.slice
    if isinstance(sl, ast.Constant) and isinstance(sl.value, (int, str)):
        return sl.value
    return MISSING


def contains_split(obj, split_ids: Set[int]) -> bool:
    """Whether ``obj`` is a container holding a Parameter of ``split_ids``."""
    if isinstance(obj, (ParameterTuple, list, tuple)):
        return any(isinstance(p, Parameter) and id(p) in split_ids for p in obj)
    if isinstance(obj, dict):
        return any(isinstance(p, Parameter) and id(p) in split_ids for p in obj.values())
    return False


def _values(container) -> Optional[list]:
    """Every value a subscript of ``container`` with an unknown key may give; None when unknown."""
    if isinstance(container, nn.CellDict):
        return list(container.values())
    if isinstance(container, (nn.CellList, nn.SequentialCell)):
        return list(container)
    return None


def _step(objs: list, node) -> Optional[list]:
    out = []
    for obj in objs:
        if isinstance(node, ast.Attribute):
            found = lookup(obj, node.attr)
            if found is MISSING or isinstance(found, Method):
                return None
            out.append(found)
            continue
        key = subscript_key(node)
        if key is not MISSING:
            try:
                out.append(obj[key])
            except Exception:
                return None
            continue
        values = _values(obj)
        if values is None:
            return None
        out += values
    return out


def candidates(node, self_name: str, cell: nn.Cell, local_names: dict) -> Optional[List]:
    """Every object the chain ``node`` (attributes and subscripts over ``self`` or a local name in
    ``local_names``, a dict name -> its candidates) may stand for; None when it cannot be known."""
    steps = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        steps.append(node)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    if node.id == self_name:
        objs = [cell]
    elif local_names.get(node.id) is not None:
        objs = local_names[node.id]
    else:
        return None
    for step in reversed(steps):
        objs = _step(objs, step)
        if objs is None:
            return None
    return objs
