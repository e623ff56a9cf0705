"""Gather units: the split parameters a Cell's subtree reads, in one all-gather and one reduce-scatter.

[Note: gather units]
``shard_network(..., gather_units=(Block,))`` makes every instance of ``Block`` a unit, as FSDP's
``transformer_layer_cls`` auto-wrap policy does: the split parameters read anywhere in the unit's
subtree (nested units excepted) are all-gathered in ONE collective when the unit's forward starts,
and their gradients are reduce-scattered in ONE collective (one of each per distinct gather
setting: group, parameter dtype, compute dtype). As in [Note: coalesced gathers], a parameter whose
padded tensor exceeds ``COALESCE_MAX_BYTES`` (1 MiB) is gathered alone, by its own ``GatherGroup`` of one,
and so is an element alone in its setting. Without units, each reading Cell gathers its own.

Why the gathered tensors are threaded as an argument: MindSpore's graph CSE merges identical
all-gathers after inlining, but autodiff expands each call site's custom ``bprop`` before that, so
a unit's gather called once per reading Cell would still reduce-scatter once per Cell (each moving
the whole unit); a shared mailbox object does not carry values in GRAPH_MODE. So the generic
rewrite ([Note: generic rewrite] in ``rewrite.py``) runs in *unit mode* for the Cells of a unit:

* the unit root's ``construct`` starts with ``zero3_unit = self.zero3_unit_gather((self.<path to
  p0>, self.<path to p1>, ...), x)``, a ``ZeroUnitGather`` over the unit's shards that waits for the
  construct's first input ``x`` ([Note: gather order] in param_wrapper.py);
* every read of a unit parameter in the unit's code becomes ``zero3_unit[k]``;
* every method that reads one (directly or through the methods and child Cells it calls) gets a
  parameter ``zero3_unit``, and every call of it from the unit's code passes it ([Note: unit
  argument] in ``unit_threading.py``). The code is plain Python: GRAPH_MODE and PYNATIVE_MODE both
  run it.

Cells inside a unit are not replaced by ``parallel_modules`` classes (their own ``construct`` runs,
rewritten as above). With ``reshard_after_forward=True`` the unit's ``ZeroUnitGather`` is
recomputed, not the unit's code ([Note: reshard after forward]): backward gathers each unit once
more, in one collective, and the unit's layers run once (a unit whose code transforms a gathered
tensor, or any unit in PYNATIVE_MODE, has its root recomputed instead).

Bit-identical to per-parameter gathers: each part's buffer has [Note: packed layout]
(``mindone_zero/core/packing.py``), so every element is summed with the same partners. One
exception: a parameter read at several places of one unit with ``reshard_after_forward=True`` gets
one gradient (summed by autodiff) reduce-scattered once, where per-reader wrappers reduce-scatter
each reader's part and sum the shards: equal up to rounding.

What raises (before anything is modified), naming the Cell and method: a Cell of a unit that reads
split parameters but is not called as ``self.<attribute>(...)`` from the unit's code (a loop over a
CellList or SequentialCell, ``getattr`` with a computed name), as its reads cannot be given the
unit's tensors; a method of a unit that reads them called from outside the unit; a Cell shared by
two units or by a unit and the rest; a Cell that gathers its own parameters (a ``parallel_modules``
layer built by the user) inside a unit. Put such Cells outside the unit, or make the loop's Cells
units themselves (``gather_units=(Block, Model)``: the Model's loop calls unit roots, which gather
for themselves).

Memory: a unit's parameters are all full at once (in forward, and again when backward re-gathers
them), so ``estimate_peak_memory``'s largest-layer term ``L`` is the largest unit's parameter count.

Compile time: a unit's code reads its k gathered tensors out of one tuple, the output of a Cell with
a custom bprop. MindSpore's autodiff gives each read (a TupleGetItem) the gradient of the whole tuple,
zeros but one (``bprop_tuple_getitem``); each zero is a small graph to infer, so a unit adds about
k * k of them. None of the ways around it is better: the recomputation is not what costs; loading
the shards in a Cell of their own before the gather (so that no UpdateState takes the gathered
tuple) moves the cost to the tuple of loaded shards; one flat buffer cut per reader, or a chain of
two-way splits, would trade the zeros for copies of the unit's gradient at every step; a ``fusion``
id on per-member collectives, for the backend to merge, merges no all-gathers on the CPU backend
(``tools/dev/comm_fusion_probe.py``; the design page, "Stage 3's groups by default"). So units
compile slower than per-layer gathers (the benchmark's page shows by how much). What they buy is
fewer, larger collectives, each a synchronization of the ranks on a device; packing and unpacking
costs a few kernels per member, so on the CPU backend a unit's step gains most where a unit holds
many tensors, and little where it holds few (``tools/bench/benchmark_compile.py``, ``--unit_cells``
for other unit classes; [Note: units by default] in ``auto_units.py``).
"""
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from mindspore import Parameter, nn, ops

from ..core.graph_tuples import each, hyper_map, take
from ..core.ms_internals import RECOMPUTE_WRAPPER, child_cells
from .coalesce import COALESCE_MAX_BYTES, ZeroGatherGroup, gather_settings
from .param_wrapper import param_gather

__all__ = ["GatherUnit", "ZeroUnitGather", "UNIT_ARG", "UNIT_GATHER_ATTR", "find_units",
           "attach_unit_gathers"]

UNIT_ARG = "zero3_unit"
UNIT_GATHER_ATTR = "zero3_unit_gather"


class GatherUnit:
    """One unit found by ``find_units``: its root Cell and, once planned, its elements, the (split
    parameter, compute dtype) pairs its code reads, in the order of the gathered tuple ``zero3_unit``."""

    def __init__(self, root: nn.Cell, path: str):
        self.root, self.path = root, path
        self.elements: List[Tuple[Parameter, object]] = []
        self._index: Dict[tuple, int] = {}

    def index(self, param: Parameter, compute_dtype) -> int:
        """The position of ``param`` read in ``compute_dtype`` in the gathered tuple (added if new)."""
        key = (id(param), compute_dtype)
        if key not in self._index:
            self._index[key] = len(self.elements)
            self.elements.append((param, compute_dtype))
        return self._index[key]

    def describe(self) -> str:
        return f"{self.path or '<top>'} ({type(self.root).__name__})"


def _unit_error(where: str, msg: str) -> ValueError:
    return ValueError(f"For '{where}', the argument 'gather_units' {msg}")


def find_units(network: nn.Cell, classes: tuple, where: str = "shard_network") -> Dict[int, GatherUnit]:
    """``{id(cell): its GatherUnit}`` for every Cell inside a unit (the roots included); nothing is modified.

    Raises:
        ValueError: a class has no instance in ``network``; a Cell is shared by two units or by a
            unit and the rest of the network; a Cell inside a unit gathers its own parameters.
    """
    owner: Dict[int, Optional[GatherUnit]] = {}
    found = set()

    def walk(cell, path, unit):
        if isinstance(cell, classes):
            unit = GatherUnit(cell, path)
            found.update(c for c in classes if isinstance(cell, c))
        if id(cell) in owner:
            if owner[id(cell)] is not unit:
                raise _unit_error(where, f"puts the Cell {path or '<top>'!r} in two places: it is shared between "
                                         f"units (or a unit and the rest of the network); a unit's Cells must be "
                                         f"its own.")
            return
        owner[id(cell)] = unit
        if unit is not None and getattr(cell, "zero3_gathers_itself", False):
            raise _unit_error(where, f"contains the Cell {path!r} ({type(cell).__name__}) that gathers its own "
                                     f"parameters, inside the unit {unit.describe()}; build the network from plain "
                                     f"Cells (shard_network replaces them outside units) or keep it out of the unit.")
        for name, child in child_cells(cell).items():
            if child is not None and name != RECOMPUTE_WRAPPER:  # MindSpore's wrapper of a recomputed Cell
                walk(child, f"{path}.{name}" if path else name, unit)

    walk(network, "", None)
    missing = [c.__name__ for c in classes if c not in found]
    if missing:
        raise _unit_error(where, f"names classes with no instance in the network: {missing} (got {classes!r}).")
    return {k: u for k, u in owner.items() if u is not None}


# Per-element work of a unit runs through hyper_map and take, not loops that grow tuples ([Note:
# per-tensor maps] in core/graph_tuples.py).
_cast_to = ops.MultitypeFuncGraph("cast_to")


@_cast_to.register("TypeType", "Tensor")
def _cast_to_tensor(dtype, x):
    return x.astype(dtype)


_RESHAPE = ops.Reshape()


class _UnitPart(ZeroGatherGroup):
    """The elements of one unit with one gather setting: one all-gather, one reduce-scatter."""

    def __init__(self, gathers: List, select: tuple, every: bool, build=None):
        super().__init__(gathers, "unit", build)
        self.select = select
        self.every = every  # select is every element, in order: no take ([Note: compile cost])

    def construct(self, xs, after):
        # the shards come reshaped ([Note: unit shards] in ZeroUnitGather); the collective waits for
        # ``after`` ([Note: gather order] in param_wrapper.py; PYNATIVE runs ops in program order)
        return self.gather.waiting(xs if self.every else take(xs, self.select), after)


class _UnitCasts(nn.Cell):
    """Elements that need no collective (a group of one rank): cast to the compute dtype only
    (nothing to order: ``after`` is not read)."""

    def __init__(self, gathers: List, select: tuple, every: bool):
        super().__init__(auto_prefix=False)
        self.select = select
        self.every = every
        self.compute_dtype = gathers[0].record.compute_dtype
        self.param_names = tuple(g.spec.name for g in gathers)

    def construct(self, xs, after):
        return hyper_map(ops.partial(_cast_to, self.compute_dtype), xs if self.every else take(xs, self.select))


class _UnitSingle(nn.Cell):
    """One large element gathered alone by its own ``GatherGroup`` of one (no copies into a buffer), built
    here from the element's ``ParamGather``."""

    def __init__(self, plan, index: int):
        super().__init__(auto_prefix=False)
        self.gather = gather = plan.build()
        self.index = index
        self.param_names = (gather.param_name,)
        self.gather_record = replace(gather.record, kind="unit")  # [Note: comm records]

    def construct(self, xs, after):
        # reshaped ([Note: unit shards] in ZeroUnitGather); waits as _UnitPart's collective does
        return (self.gather.waiting(xs[self.index], after),)


class ZeroUnitGather(nn.Cell):
    """All-gather a unit's shards: one collective per gather setting ([Note: gather units]).

    ``construct(xs, after=None)`` takes the unit's shards in element order (and the unit root's input
    as ``after``, which every collective waits for) and returns their full tensors (padding dropped,
    compute dtype) in the same order, bit for bit what per-parameter gathers return. Collective over
    the parameters' group. ``gathers``: one ``ParamGather`` per element, the parts are built from them;
    ``build``: the ``GatherBuild`` that builds the coalesced parts' gather Cells ([Note: gather Cells
    built once] in gather_build.py), None: built here.
    """

    def __init__(self, unit_path: str, gathers: List, build=None):
        super().__init__(auto_prefix=False)
        self.unit_path = unit_path
        keyed: Dict[tuple, List[int]] = {}
        parts, flat = [], []
        for i, g in enumerate(gathers):
            if g.record.gathers and g.record.gathered_nbytes > COALESCE_MAX_BYTES:
                parts.append(_UnitSingle(g, i))
                flat.append(i)
            else:
                keyed.setdefault(gather_settings(g) + (g.record.gathers,), []).append(i)
        everything = tuple(range(len(gathers)))
        for key, idx in keyed.items():
            members, every = [gathers[i] for i in idx], tuple(idx) == everything
            if key[-1] and len(idx) == 1:
                parts.append(_UnitSingle(members[0], idx[0]))
            else:
                parts.append(_UnitPart(members, tuple(idx), every, build) if key[-1]
                             else _UnitCasts(members, tuple(idx), every))
            flat += idx
        self.parts = nn.CellList(parts)
        self.order = tuple(flat.index(i) for i in range(len(gathers)))
        self.in_order = self.order == everything  # no take ([Note: compile cost] in core/graph_tuples.py)
        self.one_part = len(parts) == 1  # its outputs are in order: no loop, no take
        self.shard_shapes = tuple(tuple(g.spec.shard_shape) for g in gathers)
        self.param_names = tuple(g.spec.name for g in gathers)

    def construct(self, xs, after=None):
        # [Note: unit shards]
        # Every shard is reshaped to its own shape before any part sees it: PYNATIVE, so that the
        # custom bprop gets the shard's real shape (see ZeroParamWrapper); GRAPH_MODE, because passed
        # on as they are, the shards gave another first loss (tests/dist/test_gather_units.py). One
        # ``each`` (Map, with the Reshape primitive and static shapes: [Note: constants in a map] in
        # core/graph_tuples.py). Each part's collective waits for ``after`` inside its custom-bprop
        # Cell ([Note: gather order] in param_wrapper.py), not through a Depend per shard in this
        # map, which would cost autodiff graphs per shard.
        xs = each(_RESHAPE, xs, self.shard_shapes)
        if self.one_part:
            return self.parts[0](xs, after)
        outs = ()
        for part in self.parts:  # a few parts: one per gather setting
            outs = outs + part(xs, after)
        if self.in_order:
            return outs
        return take(outs, self.order)

    def groups(self) -> List[ZeroGatherGroup]:
        """The coalesced parts (one all-gather and one reduce-scatter each)."""
        return [p for p in self.parts if isinstance(p, _UnitPart)]

    @property
    def gather_records(self) -> tuple:
        """The records of the parts that gather, coalesced or alone ([Note: comm records] in
        core/comm_records.py)."""
        return tuple(p.gather_record for p in self.parts if isinstance(p, (_UnitPart, _UnitSingle)))


def attach_unit_gathers(units: List[GatherUnit], group: Optional[str], build) -> None:
    """Give each unit root with elements its ``ZeroUnitGather`` (attribute ``zero3_unit_gather``),
    built from its elements' ``ParamGather``s over ``group``, its coalesced parts' gather Cells by
    ``build`` (a ``GatherBuild``). Call after the parameters are sharded. Not collective.
    """
    for unit in units:
        if unit.elements:
            gathers = [param_gather(p, group, dtype) for p, dtype in unit.elements]
            setattr(unit.root, UNIT_GATHER_ATTR, ZeroUnitGather(unit.path, gathers, build))
