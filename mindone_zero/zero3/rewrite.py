"""Generic ZeRO-3 path: rewrite Cell code so that every read of a sharded Parameter gathers it.

[Note: generic rewrite]
A Cell that reads a sharded Parameter in its ``construct`` (a LayerNorm's ``gamma``, a bare
``self.scale``, a subclass of a wrapped layer with its own ``construct``) must see the full
tensor in forward and send a reduce-scattered gradient back. ``shard_network`` does this without
touching the user's classes:

1. Analysis (nothing is modified). For every Cell of the network, the source of ``construct`` is
   parsed with ``ast``, and so is, transitively, every method it calls as ``self.m(...)``,
   ``self.child.m(...)`` or ``super().m(...)``. Each attribute chain rooted at ``self`` (through
   child Cells and constant subscripts of CellLists) is resolved statically on the instance; a
   load that ends on a sharded Parameter becomes ``self.<chain>_zero_gather(self.<chain>, x)``
   (``x``: ``construct``'s first input, [Note: gather order] in param_wrapper.py; none in other
   methods), a ``ZeroParamWrapper`` held by the reading Cell (``apply_rewrites`` says which readers
   share one). ``self.<p>.shape`` becomes the full shape as a constant (no gather), and
   ``self.<p> is None``, ``.dtype`` and ``.ndim`` are left alone (a shard's are the parameter's).
   A chain through a local variable bound to one, or through a subscript whose key is known only
   when the code runs (PEFT's ``lora_A = self.lora_A[adapter]``), stands for every value of the
   container (``static_lookup.candidates``): its metadata reads are handled the same way, and
   calling such a Cell is a call like any other.
2. Unsupported uses raise at this point, naming the Cell, the method and the parameter: a store
   or ``del`` of a sharded parameter, an in-place op (``assign``, ``scatter_*``) on it, a read of
   a container (ParameterTuple, list, dict) holding one, a decorated method that must be
   rewritten. A sharded parameter that no analysed code reads as ``self.<chain>`` (for example
   one used only through ``getattr`` with a computed name, a loop over ``self.cells()``, or from
   outside the network) raises too: it would otherwise be used as a shard, or never synchronised.
   Set ``param.parallel_optimizer = False`` on such a parameter to keep it whole.
3. Application. Each method that changed is written to a real ``.py`` file (so that
   ``inspect.getsource``, which MindSpore's graph parser uses, finds it), compiled, and rebuilt as
   a function with the original function's module globals, closure values and defaults. The
   Cell's ``__class__`` is then set to a dynamic subclass of its class holding those methods, so
   the instance keeps its state, its parameters (and their names), ``isinstance`` checks and every
   other method. ``super()`` calls in rewritten code are routed to ``self._zero3_super_<i>_<m>``,
   an alias of the next class's (possibly rewritten) method, and ``self.__x`` is name-mangled as
   the class body would have done.

What the rewrite makes lives as long as the network that uses it, and nothing of it is kept at
module level: the generated functions are held by their dynamic class, the class by its Cells,
and the files of one ``shard_network`` call by every class of that call (``_SourceFiles``): their
temporary folder is removed when the last of those classes is collected, or at exit. MindSpore's
graph parser reads a function's source again whenever it parses it, so a file must outlive
nothing but its function. MindSpore 2.10 keys what it parsed by object id; a new network whose
Cells and generated functions take the ids of a freed one's compiles its own code
(tests/unit/test_rewrite_lifetime.py builds, runs and frees networks until that happens and
checks every result). Within a network, Cells that MindSpore may have parsed stay referenced as
long as the network does (the replaced originals: ``shard.py``).

Methods that read a parameter but are not reachable from ``construct`` (``extend_repr``,
initialisers) are not rewritten: outside the graph they see the shard.

Unit mode ([Note: gather units] in ``units.py``): inside a gather unit a read becomes an element
of the unit's gathered tuple instead of a wrapper call, the Cells of the unit are analysed only
through the calls of the unit's code, and ``unit_threading.py`` passes the tuple along those calls.
The steps hand each other plans (``rewrite_plan.py``).
"""
import ast
import copy
import inspect
import os
import re
import shutil
import tempfile
import textwrap
import types
import weakref
from typing import Dict, List, Optional, Set, Tuple

from mindspore import Parameter, nn

from ..core.ms_internals import lazy_inline_key, own_params
from ..core.to_float import compute_dtype_of
from .carry import is_recompute_scoped
from .param_wrapper import GATHER_SUFFIX, ZeroParamWrapper
from .rewrite_plan import MethodPlan, ParamRead, RewriteAnalysis, RewritePlan
from .static_lookup import METADATA, MISSING, Method, candidates, contains_split, follow, lookup, subscript_key
from .unit_threading import thread_units, unreached_note
from .units import UNIT_ARG

__all__ = ["RewritePlan", "plan_rewrites", "apply_rewrites", "SUPER_PREFIX"]

SUPER_PREFIX = "_zero3_super_"
_INPLACE_WORDS = ("assign", "scatter")


def _zero_error(msg: str) -> ValueError:
    return ValueError(f"For 'shard_network', the argument 'network' {msg}")


class _ChainReads(ast.NodeTransformer):
    """Rewrites the reads of split parameters in one method body of one Cell instance ([Note: generic
    rewrite]); ``_ChainRewriter`` adds the calls."""

    def __init__(self, planner, plan: RewritePlan, mplan: MethodPlan, self_name: str, after: Optional[str] = None):
        self.planner, self.plan, self.mplan, self.self_name = planner, plan, mplan, self_name
        self.after = after  # construct's first input: each gather waits for it ([Note: gather order])
        self.unit = planner.units.get(id(plan.cell))
        self.where = plan.where(mplan)
        self.locals = {}  # local name -> the objects it may stand for (static_lookup.candidates)

    def visit_FunctionDef(self, node):
        if not self.locals:
            self.locals = self._local_candidates(node)
        return self.generic_visit(node)

    def _local_candidates(self, func: ast.FunctionDef) -> dict:
        """{local name: the objects it may stand for} for names bound only by plain assignments
        (``lora_A = self.lora_A[adapter]``), over all of them; a name bound otherwise is unknown."""
        stores, assigns = {}, []
        for node in ast.walk(func):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                stores[node.id] = stores.get(node.id, 0) + 1
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigns.append(node)
        plain = {}
        for node in assigns:
            plain[node.targets[0].id] = plain.get(node.targets[0].id, 0) + 1
        found = {}
        for node in assigns:
            name = node.targets[0].id
            objs = candidates(node.value, self.self_name, self.plan.cell, found)
            ok = objs is not None and plain[name] == stores[name] and found.get(name, ()) is not None
            found[name] = found.get(name, []) + objs if ok else None
        return {k: v for k, v in found.items() if v is not None}

    def _chain(self, node):
        """[(node, step)] from ``self`` outwards, or None when not rooted at ``self``."""
        steps = []
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Attribute):
                steps.append((node, node.attr))
            else:
                key = subscript_key(node)
                if key is MISSING:
                    return None
                steps.append((node, key))
            node = node.value
        if not (isinstance(node, ast.Name) and node.id == self.self_name):
            return None
        return list(reversed(steps))

    def _resolve(self, steps):
        """Walk ``steps`` on the instance; return (index, object) at the first non-Cell, or (-1, None)."""
        obj = self.plan.cell
        for i, (_, step) in enumerate(steps):
            if isinstance(step, str):
                obj = lookup(obj, step)
            else:
                try:
                    obj = obj[step]
                except Exception:
                    return i, MISSING
            if not isinstance(obj, nn.Cell):
                return i, obj
        return -1, None

    def _gather_call(self, steps, i, param):
        node, _ = steps[i]
        if not isinstance(node, ast.Attribute):
            raise _zero_error(
                f"reads the sharded parameter {param.name!r} through a subscript in {self.where}; "
                f"read it as an attribute, or set its parallel_optimizer to False."
            )
        if self.unit is not None:  # [Note: gather units]: the unit's gathered tuple
            self.planner.referenced.add(id(param))
            self.mplan.reads_unit = self.mplan.has_reads = True
            k = self.unit.index(param, compute_dtype_of(self.plan.cell))
            return ast.Subscript(value=ast.Name(id=UNIT_ARG, ctx=ast.Load()), slice=ast.Constant(k), ctx=ast.Load())
        path = "__".join(re.sub(r"\W", "_", str(s)) for _, s in steps[: i + 1])
        attr = path + GATHER_SUFFIX
        existing = lookup(self.plan.cell, attr)
        if existing is not MISSING and attr not in self.plan.reads:
            raise _zero_error(f"already has an attribute {attr!r} in {self.where}; cannot add a gather for it.")
        self.plan.reads[attr] = ParamRead(attr, param, compute_dtype_of(self.plan.cell))
        self.planner.referenced.add(id(param))
        self.mplan.has_reads = True
        func = ast.Attribute(value=ast.Name(id=self.self_name, ctx=ast.Load()), attr=attr, ctx=ast.Load())
        after = [ast.Name(id=self.after, ctx=ast.Load())] if self.after else []
        return ast.Call(func=func, args=[node] + after, keywords=[])

    def visit_Attribute(self, node):
        steps = self._chain(node)
        if steps is None:
            return self._indirect_read(node)
        return self._rewrite_chain(node, steps)

    def _indirect_read(self, node):
        """A chain through a local variable or a subscript whose key is known only when the code runs
        (PEFT's ``lora_A = self.lora_A[adapter]; lora_A.weight.dtype``): what it may stand for
        (``candidates``) decides. ``.dtype`` and ``.ndim`` of a shard are the full parameter's, ``.shape``
        becomes a constant when every candidate has the same full shape; a value read of a sharded
        parameter this way cannot be gathered and raises (calling the Cell that holds it is fine)."""
        meta = node.attr in METADATA + ("shape",) and isinstance(node.value, (ast.Attribute, ast.Subscript))
        target = node.value if meta else node
        found = candidates(target, self.self_name, self.plan.cell, self.locals)
        split = [p for p in found or () if isinstance(p, Parameter) and id(p) in self.planner.split_ids]
        named = found is None and isinstance(target, ast.Attribute) and target.attr in self.planner.split_attr_names
        if meta and (split or named):
            if node.attr in METADATA:
                return node
            shapes = {tuple(p.shape) for p in split}
            if len(split) == len(found or ()) and len(shapes) == 1:
                self.mplan.has_reads = True  # the unrewritten code would see the shard's shape
                return ast.Tuple(elts=[ast.Constant(int(d)) for d in shapes.pop()], ctx=ast.Load())
        if found is None:
            self._check_unresolved(node)
        elif split and isinstance(node.ctx, ast.Load):
            raise _zero_error(
                f"reads the sharded parameter(s) {sorted({p.name for p in split})} through `{ast.unparse(node)}` "
                f"(a local variable or a subscript whose key is known only when the code runs) in {self.where}; "
                f"a gather cannot be put there. Call the Cell that holds it, read it as self.<child>.<name> "
                f"(constant keys are fine), or set its parallel_optimizer to False."
            )
        return self.generic_visit(node)

    def _check_unresolved(self, node):
        """A read like ``layer.weight`` on a local cannot be resolved; if the name is that of a
        sharded parameter somewhere, it may read a shard: refuse rather than guess."""
        if node.attr not in self.planner.split_attr_names or not isinstance(node.ctx, ast.Load):
            return
        root = node.value
        while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
            root = root.func if isinstance(root, ast.Call) else root.value
        if isinstance(root, ast.Name) and root.id != self.self_name and root.id in self.mplan.func.__globals__:
            return  # a module-level object, not a Cell of this network
        raise _zero_error(
            f"reads '.{node.attr}' (the name of a sharded parameter) on an object that cannot be resolved "
            f"statically, in {self.where}: `{ast.unparse(node)}`. Read parameters as self.<child>.<name> "
            f"(constant CellList indices are fine), or set parallel_optimizer to False on them."
        )

    def visit_Subscript(self, node):
        steps = self._chain(node)
        if steps is None:
            return self.generic_visit(node)
        return self._rewrite_chain(node, steps)

    def _rewrite_chain(self, node, steps):
        i, obj = self._resolve(steps)
        if isinstance(obj, Parameter) and id(obj) in self.planner.split_ids:
            if not isinstance(steps[i][0].ctx, ast.Load) or (i + 1 < len(steps) and
                                                            not isinstance(node.ctx, ast.Load)):
                raise _zero_error(f"stores to or deletes the sharded parameter {obj.name!r} in {self.where}.")
            if i + 1 < len(steps) and steps[i + 1][1] in METADATA:
                return node  # a shard's dtype and ndim are the full parameter's: no gather
            if i + 1 < len(steps) and steps[i + 1][1] == "shape":
                self.planner.referenced.add(id(obj))
                self.mplan.has_reads = True  # the unrewritten code would see the shard's shape
                shape = ast.Tuple(elts=[ast.Constant(int(d)) for d in obj.shape], ctx=ast.Load())
                return self._replace_prefix(node, steps, i + 1, shape)
            return self._replace_prefix(node, steps, i, self._gather_call(steps, i, obj))
        if contains_split(obj, self.planner.split_ids):
            raise _zero_error(
                f"reads a container holding sharded parameters (self.{'.'.join(str(s) for _, s in steps[:i + 1])})"
                f" in {self.where}; parameters must be read one by one as attributes, or set their "
                f"parallel_optimizer to False."
            )
        return node

    @staticmethod
    def _replace_prefix(node, steps, i, new):
        """``node`` with the chain prefix ending at ``steps[i]`` replaced by ``new``."""
        if steps[i][0] is node:
            return new
        steps[i + 1][0].value = new
        return node


class _ChainRewriter(_ChainReads):
    """Rewrites one method body of one Cell instance: its reads (``_ChainReads``) and its calls
    (methods and ``super()`` calls followed into their code, gathers written by hand left alone,
    in-place updates of a shard refused); see [Note: generic rewrite]."""

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 2 and not node.keywords:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and self._chain(node.args[0]) is not None:
                return self.visit(ast.copy_location(ast.Attribute(node.args[0], name.value, ast.Load()), node))
        if isinstance(func, ast.Attribute) and self._is_super(func.value):
            return self._route_super(node)
        self._check_inplace(node)
        if isinstance(func, ast.Attribute):
            steps = self._chain(func)
            if steps is not None:
                i, obj = self._resolve(steps)
                if isinstance(obj, Method) and i == len(steps) - 1:
                    self.planner.schedule(obj.cell, obj.name)
                    self.mplan.calls.append((node, id(obj.cell), obj.name))
                target = follow(self.plan.cell, steps) if i == -1 else None
                if isinstance(target, ZeroParamWrapper):
                    # Hand-written ZeRO-3 code (`self.w_gather(self.w)`) already gathers: leave it.
                    self._mark_args(node)
                    return node
                if i == -1 and id(target) in self.planner.units:
                    # A Cell of a unit runs its construct in unit mode ([Note: gather units]).
                    self.planner.schedule(target, "construct")
                    self.mplan.calls.append((node, id(target), "construct"))
        return self.generic_visit(node)

    def _mark_args(self, node):
        for arg in node.args:
            steps = self._chain(arg)
            if steps is not None:
                _, obj = self._resolve(steps)
                if isinstance(obj, Parameter):
                    self.planner.referenced.add(id(obj))

    def _check_inplace(self, node):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if not any(w in name.lower() for w in _INPLACE_WORDS) or not node.args:
            return
        steps = self._chain(node.args[0])
        if steps is None:
            return
        _, obj = self._resolve(steps)
        if isinstance(obj, Parameter) and id(obj) in self.planner.split_ids:
            raise _zero_error(
                f"updates the sharded parameter {obj.name!r} in place ({name}) in {self.where}; a gathered copy "
                f"cannot be updated in place. Set its parallel_optimizer to False to keep it whole."
            )

    def _is_super(self, node) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"

    def _route_super(self, node):
        call = node.func.value
        start = self.mplan.defining_cls
        if call.args:
            start = self._eval_name(call.args[0])
        method = node.func.attr
        mro = self.plan.original_class.__mro__
        if start not in mro:
            raise _zero_error(f"calls super() with a class outside {self.plan.original_class} in {self.where}.")
        for idx in range(mro.index(start) + 1, len(mro)):
            if method in mro[idx].__dict__:
                key = f"{SUPER_PREFIX}{idx}_{method}"
                self.planner.schedule(self.plan.cell, key, mro[idx], method)
                self.mplan.super_keys.append(key)
                self.mplan.calls.append((node, id(self.plan.cell), key))
                node.func = ast.Attribute(value=ast.Name(id=self.self_name, ctx=ast.Load()), attr=key, ctx=ast.Load())
                return self.generic_visit(node)
        raise _zero_error(f"calls super().{method} which no base class defines, in {self.where}.")

    def _eval_name(self, node):
        if isinstance(node, ast.Name):
            func = self.mplan.func
            if node.id in func.__code__.co_freevars and func.__closure__:
                return func.__closure__[func.__code__.co_freevars.index(node.id)].cell_contents
            if node.id in func.__globals__:
                return func.__globals__[node.id]
        raise _zero_error(f"calls super() with a first argument that is not a class name, in {self.where}.")

    def visit_Compare(self, node):
        # `self.bias is None` asks about presence, not the value: no gather for it.
        if (len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot))
                and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None
                and self._chain(node.left) is not None):
            return node
        return self.generic_visit(node)


class _Mangler(ast.NodeTransformer):
    """Private names (``self.__x``) as the class body of ``cls`` would have compiled them."""

    def __init__(self, cls):
        self.prefix = "_" + cls.__name__.lstrip("_")

    def visit_Attribute(self, node):
        if node.attr.startswith("__") and not node.attr.endswith("__"):
            node.attr = self.prefix + node.attr
        return self.generic_visit(node)


def _parse(func, parsed: Dict[types.FunctionType, ast.FunctionDef]) -> ast.FunctionDef:
    """A fresh copy of ``func``'s parsed ``def``; ``parsed`` caches the parses of one analysis."""
    if func not in parsed:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
        if not tree.body or not isinstance(tree.body[0], ast.FunctionDef):
            raise TypeError(f"the source of {func.__qualname__} is not a plain def")
        parsed[func] = tree.body[0]
    return copy.deepcopy(parsed[func])


def _find_method(cls, method, start=None):
    """(function, defining class) of ``method`` on ``cls`` (or exactly on ``start``); (None, None)
    for anything that is not a plain function defined below ``nn.Cell``."""
    owners = [start] if start is not None else cls.__mro__
    for owner in owners:
        if method in owner.__dict__:
            func = owner.__dict__[method]
            if owner in nn.Cell.__mro__ or not isinstance(func, types.FunctionType):
                return None, None
            return func, owner
    return None, None


class _Planner:
    """Step 1 and 2 of [Note: generic rewrite]: analyse every Cell, modify nothing."""

    def __init__(self, cells: tuple, split_ids: Set[int], replaced: Set[int], units=None):
        self.split_ids = split_ids
        self.replaced = replaced
        self.units = units or {}  # id(cell) -> GatherUnit ([Note: gather units])
        self.paths = {id(c): name for name, c in cells}
        self.plans: Dict[int, RewritePlan] = {}
        self.queue: List[Tuple[RewritePlan, MethodPlan]] = []
        self.referenced: Set[int] = set()
        self.unreadable: List[str] = []
        self.parsed: Dict[types.FunctionType, ast.FunctionDef] = {}  # each method parsed once per analysis
        self.split_attr_names = {
            name for _, c in cells for name, p in own_params(c).items()
            if p is not None and id(p) in split_ids
        }

    def skip(self, cell) -> bool:
        """A Cell that gathers its own parameters: about to be replaced by a layer Cell, or of a
        class that says so (``zero3_gathers_itself = True``)."""
        return id(cell) in self.replaced or getattr(cell, "zero3_gathers_itself", False)

    def schedule(self, cell, key, start=None, method=None):
        if self.skip(cell):
            return
        plan = self.plans.get(id(cell))
        if plan is None:
            plan = RewritePlan(cell, self.paths.get(id(cell), "?"), type(cell))
            self.plans[id(cell)] = plan
        if key in plan.methods:
            return
        func, owner = _find_method(plan.original_class, method or key, start)
        if func is None:
            if start is not None:
                # A super() target that is not user Python code (a Cell base method, a builtin):
                # the alias keeps pointing at it unchanged.
                plan.methods[key] = MethodPlan(key, start.__dict__[method], start)
            return
        plan.methods[key] = MethodPlan(key, func, owner)
        self.queue.append((plan, plan.methods[key]))

    def run(self, cells: tuple):
        for _, cell in cells:
            unit = self.units.get(id(cell))
            if unit is not None and unit.root is not cell:
                continue  # reached (in unit mode) through the calls of its unit's code
            if self.skip(cell):
                self.referenced.update(id(p) for p in own_params(cell).values() if p is not None)
            else:
                self.schedule(cell, "construct")
        while self.queue:
            self._analyse(*self.queue.pop())
        if self.units:
            thread_units(RewriteAnalysis(self.plans, self.units))
        self._decide_emission()
        return [p for p in self.plans.values() if p.emitted() or p.reads]

    def _analyse(self, plan: RewritePlan, mplan: MethodPlan):
        try:
            tree = _parse(mplan.func, self.parsed)
        except (OSError, TypeError, SyntaxError) as err:
            self.unreadable.append(f"{plan.path or '<top>'}.{mplan.func.__name__}: {err}")
            return
        if not tree.args.args:
            return
        tree = _Mangler(mplan.defining_cls).visit(tree)
        after = tree.args.args[1].arg if mplan.func.__name__ == "construct" and len(tree.args.args) > 1 else None
        mplan.tree = _ChainRewriter(self, plan, mplan, tree.args.args[0].arg, after).visit(tree)

    def _decide_emission(self):
        changed = True
        while changed:
            changed = False
            for plan in self.plans.values():
                for m in plan.methods.values():
                    emit = m.tree is not None and (m.has_reads or m.needs_unit or m.provides_unit
                                                   or any(plan.methods[k].emit for k in m.super_keys))
                    if emit and not m.emit:
                        m.emit, changed = True, True
        for plan in self.plans.values():
            for m in plan.emitted():
                if m.tree.decorator_list:
                    raise _zero_error(
                        f"has a decorated method {plan.original_class.__name__}.{m.func.__name__} (in "
                        f"{plan.path or '<top>'}) that reads sharded parameters; it cannot be rewritten."
                    )


def plan_rewrites(network: nn.Cell, cells: tuple, params: tuple, split_ids: Set[int], replaced: Set[int],
                  units=None) -> List[RewritePlan]:
    """Analyse ``network`` (step 1 and 2 of [Note: generic rewrite]); nothing is modified.

    Args:
        network: the network, before any parameter is sharded.
        cells, params: its ``cells_and_names()`` and its Parameters, in its order.
        split_ids: ``id()`` of every Parameter that will be split.
        replaced: ``id()`` of every Cell about to be replaced by a layer Cell. Their code is not
            analysed, nor that of a class with ``zero3_gathers_itself = True``: they gather their
            parameters themselves.
        units: ``{id(cell): GatherUnit}`` from ``units.find_units`` for the Cells of gather units,
            whose code is rewritten in unit mode ([Note: gather units] in ``units.py``); None: none.

    Returns:
        The plans of the Cells that need new methods or gather wrappers.

    Raises:
        ValueError: for an unsupported use of a sharded parameter, or a sharded parameter that
            no analysed code reads (the message names the Cell, method and parameter).
    """
    planner = _Planner(cells, split_ids, replaced, units)
    plans = planner.run(cells)
    missing = [p for p in params if id(p) in split_ids and id(p) not in planner.referenced]
    if missing:
        notes = ("; code that could not be read: " + "; ".join(planner.unreadable)) if planner.unreadable else ""
        notes += unreached_note(network, planner.units, missing)
        raise _zero_error(
            f"holds sharded parameters that no construct (or method it calls) reads as self.<attribute>: "
            f"{[p.name for p in missing]}. They would be used as shards or never synchronised. Read them as "
            f"self.<child>.<name> in construct, or set param.parallel_optimizer = False to keep them whole{notes}."
        )
    return plans


class _SourceFiles:
    """The source files of the methods one ``apply_rewrites`` call generates, in a temporary folder
    of their own, removed when this object is collected (or at exit). Every dynamic class of the
    call holds it, so the files last as long as the code read from them ([Note: generic rewrite])."""

    def __init__(self):
        self.folder: Optional[str] = None
        self.count = 0

    def write(self, stem: str, src: str) -> str:
        """Write ``src`` to a new file named after ``stem``; returns its path."""
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="mindone_zero_zero3_")
            weakref.finalize(self, shutil.rmtree, self.folder, True)
        self.count += 1
        path = os.path.join(self.folder, f"{stem}_{self.count}.py")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(src)
        os.replace(path + ".tmp", path)
        return path


def _compile(plan: RewritePlan, mplan: MethodPlan, files: _SourceFiles) -> types.FunctionType:
    """Step 3 of [Note: generic rewrite] for one method: a real file, the original globals."""
    func, tree = mplan.func, ast.fix_missing_locations(mplan.tree)
    code = func.__code__
    freevars = [v for v in code.co_freevars if v != "__class__"]
    factory = f"_zero3_make_{tree.name}"
    src = (
        f"# Generated by mindone_zero.zero3.rewrite for ZeRO-3 from {code.co_filename}:{code.co_firstlineno}\n"
        f"# ({plan.original_class.__module__}.{func.__qualname__}): sharded parameter reads gather.\n\n\n"
        f"def {factory}({', '.join(freevars)}):\n{textwrap.indent(ast.unparse(tree), '    ')}\n"
        f"    return {tree.name}\n"
    )
    path = files.write(f"{plan.original_class.__name__}_{mplan.key}", src)
    namespace: dict = {}
    exec(compile(src, path, "exec"), namespace)  # only defines the factory
    make = types.FunctionType(namespace[factory].__code__, func.__globals__, factory)
    try:
        values = [c.cell_contents for v, c in zip(code.co_freevars, func.__closure__ or ()) if v != "__class__"]
    except ValueError as err:
        raise _zero_error(f"has a method {func.__qualname__} whose closure is not filled yet ({err}).") from err
    new = make(*values)
    new.__defaults__, new.__kwdefaults__, new.__doc__ = func.__defaults__, func.__kwdefaults__, func.__doc__
    return new


def apply_rewrites(plans: List[RewritePlan], group: Optional[str], reshard_after_forward: bool) -> None:
    """Step 3 of [Note: generic rewrite]: add the gather wrappers and swap each Cell's class.

    A wrapper is shared between the readers of one parameter in one dtype that are recomputed alike;
    with ``reshard_after_forward`` each reader may be marked on its own, so each gets its own.

    Args:
        plans: from ``plan_rewrites``.
        group: the group the parameters are sharded over.
        reshard_after_forward: the stage-3 option.
    """
    wrappers, files = {}, _SourceFiles()

    def make_wrapper(param, compute_dtype, reader):
        key = (id(param), compute_dtype, id(reader) if reshard_after_forward else is_recompute_scoped(reader))
        if key not in wrappers:
            wrappers[key] = ZeroParamWrapper(param, group, compute_dtype)
        return wrappers[key]

    for plan in plans:
        methods = {}
        for m in plan.emitted():
            methods[m.key] = _compile(plan, m, files)
            for key in m.super_keys:
                target = plan.methods[key]
                if not target.emit:
                    methods[key] = target.func
        for read in plan.reads.values():
            _attach_wrapper(plan.cell, read.attr, make_wrapper(read.param, read.compute_dtype, plan.cell), read.param)
        if methods:
            object.__setattr__(plan.cell, "__class__", _dynamic_class(plan.original_class, methods, files))


# [Note: lazy_inline key]
# MindSpore's ``@lazy_inline`` (on a Cell's ``__init__``; Ascend) gives the Cell a key,
# ``cell_init_args`` = "lazy_inline_<class>" + its init arguments, and compiles Cells with equal keys
# as one reusable subgraph. Every child Cell later set as an attribute of such a Cell appends its
# repr to the key (``Cell._set_attr_for_cell``). ZeRO-3 keeps the decorated Cell itself (its class,
# or a subclass: [Note: generic rewrite]) and replaces child layers in place (``_cells``, which
# appends nothing), so the key keeps the decorator's prefix and ``no_inline`` (``policy="front"``)
# stays. Two attributes do append: the gather wrapper of a parameter the Cell reads itself (here)
# and a unit's ``ZeroUnitGather`` (units.py), which names no parameter. A wrapper's repr names its
# parameter ("blocks.3.scale"), which would give every block its own key, so it is appended with
# that name taken out. (tests/unit/test_lazy_inline.py checks the keys on CPU; that Ascend then
# compiles one block is MindSpore's contract.)
def _attach_wrapper(cell: nn.Cell, attr: str, wrapper: nn.Cell, param: Parameter) -> None:
    """``cell.<attr> = wrapper``, keeping a ``@lazy_inline`` key free of the parameter's name
    ([Note: lazy_inline key])."""
    key = lazy_inline_key(cell)
    setattr(cell, attr, wrapper)
    if isinstance(key, str):
        cell.cell_init_args = key + str({attr: repr(wrapper).replace(param.name, "")})


def _dynamic_class(original: type, methods: Dict[str, types.FunctionType], files: _SourceFiles) -> type:
    namespace = dict(methods)
    namespace.update(__module__=original.__module__, __qualname__=original.__qualname__,
                     zero3_original_class=original, _zero3_source_files=files)
    return type(original)(original.__name__, (original,), namespace)
