"""The plans of the generic rewrite: what analysis found, what threading and application use.

``rewrite.py`` analyses Cells into these plans ([Note: generic rewrite], steps 1 and 2);
``unit_threading.py`` completes the plans of gather units ([Note: gather units] in ``units.py``);
``rewrite.py`` then applies them (step 3). Plain data: nothing here analyses or modifies a Cell.
"""
import ast
import types
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mindspore import Parameter, nn

__all__ = ["ParamRead", "MethodPlan", "RewritePlan", "RewriteAnalysis"]


@dataclass
class ParamRead:
    """One wrapper a rewritten Cell needs: attribute ``attr`` on the reader gathers ``param``."""

    attr: str
    param: Parameter
    compute_dtype: object


@dataclass
class MethodPlan:
    """One method of one Cell: its original function and, once analysed, its rewritten syntax tree."""

    key: str  # attribute on the dynamic class
    func: types.FunctionType  # the original function
    defining_cls: type
    tree: Optional[ast.FunctionDef] = None  # the rewritten function, None when unreadable
    has_reads: bool = False
    super_keys: List[str] = field(default_factory=list)
    emit: bool = False
    # [Note: gather units]: reads of the unit's tensors, calls (node, callee cell id, callee key),
    # whether the method takes `zero3_unit` (needs) or defines it (provides: the root's construct).
    reads_unit: bool = False
    calls: List[tuple] = field(default_factory=list)
    needs_unit: bool = False
    provides_unit: bool = False
    # its parameters after `self` when it takes `zero3_unit` as one more positional parameter, else
    # None (keyword-only): [Note: unit argument] in unit_threading.py
    unit_params: Optional[int] = None


@dataclass
class RewritePlan:
    """What ``apply_rewrites`` will do to one Cell: its new methods and the wrappers they call."""

    cell: nn.Cell
    path: str
    original_class: type
    methods: Dict[str, MethodPlan] = field(default_factory=dict)
    reads: Dict[str, ParamRead] = field(default_factory=dict)

    def emitted(self) -> List[MethodPlan]:
        return [m for m in self.methods.values() if m.emit]

    def where(self, m: MethodPlan) -> str:
        """The Cell and method, as error messages name them."""
        return f"{self.path or '<top>'} ({self.original_class.__name__}.{m.func.__name__})"


@dataclass
class RewriteAnalysis:
    """Every analysed Cell's plan, ``{id(cell): RewritePlan}``, and the gather units
    ``{id(cell): GatherUnit}`` of the Cells inside units (``units.find_units``; empty without)."""

    plans: Dict[int, RewritePlan]
    units: Dict[int, object]

    def method(self, cell_id: int, key: str) -> Optional[MethodPlan]:
        """The plan of method ``key`` of the Cell ``cell_id``, or None when it was not analysed."""
        plan = self.plans.get(cell_id)
        return plan.methods.get(key) if plan is not None else None
