"""The default gather units: a network's repeated blocks ([Note: units by default]).

[Note: units by default]
``gather_units="auto"``, the default of ``shard_network``, ``prepare_network`` and
``prepare_train_network``, makes the network's repeated blocks gather units ([Note: gather units]
in ``units.py``), as a DeepSpeed or FSDP user wraps each transformer layer. A repeated block is the
class of the elements of a ``CellList`` or ``SequentialCell`` that holds at least two Cells, all of
that one class, in each of which at least two Cells hold split parameters (a block of layers, not a
layer: a layer's own parameters are one coalesced group already, [Note: coalesced gathers] in
``coalesce.py``). Lists inside a chosen block are not searched (one level of units: the outermost
repeated block). The network's top Cell is never a unit. A block is chosen by structure, not by
size: pass a tuple of classes where a repeated Cell is too large to be gathered at once.

Why this default (measured by ``tools/bench/benchmark_compile.py``, the 24- and 48-block narrow LM,
N=2, on the CPU backend; the figures are on the compile page): a block of k tensors sends one
all-gather, one re-gather and one reduce-scatter instead of k of each. The step is faster with
units, and the first call slower (MindSpore's autodiff compiles about k * k small graphs per unit:
[Note: gather units], "Compile time"). A training run takes many steps and compiles once, so the
step decides.

What falls back to a gather per reading Cell, without an error: ZeRO++ options (their gathers are
per parameter), ``parallel_modules`` or ``special_cases_parallel_module`` given (the caller asked
for its layers to be replaced, which does not happen inside a unit), a network without a repeated
block, and a network whose blocks cannot be units (their code cannot be threaded, a Cell shared
between blocks, a layer that gathers itself: the reasons ``gather_units=(Block,)`` raises for; this
fallback is logged at INFO with the reason). Pass ``gather_units=None`` for a gather per reading
Cell, or a tuple of classes to choose the units.
"""
from typing import Callable, Set

from mindspore import nn

from ..core.ms_internals import RECOMPUTE_WRAPPER, child_cells, own_params

__all__ = ["repeated_blocks"]


def repeated_blocks(network: nn.Cell, is_split: Callable[[object], bool]) -> tuple:
    """The classes of ``network``'s repeated blocks ([Note: units by default]), in the order their
    lists are found; ``is_split(param)`` says whether a parameter is split. Nothing is modified."""
    found, seen = [], set()

    def walk(cell, top):
        if id(cell) in seen:
            return
        seen.add(id(cell))
        if isinstance(cell, (nn.CellList, nn.SequentialCell)) and not top:
            cls = _block_class(cell, is_split)
            if cls is not None:
                if cls not in found:
                    found.append(cls)
                return
        for child in _children(cell):
            walk(child, False)

    walk(network, True)
    return tuple(found)


def _block_class(cells: nn.Cell, is_split) -> type:
    """The one class of the Cells of the list ``cells`` when there are two or more and each holds two
    or more split parameters; else None."""
    items = _children(cells)
    if len(items) < 2 or len({type(c) for c in items}) != 1:
        return None
    if isinstance(items[0], (nn.CellList, nn.SequentialCell)):
        return None
    if any(_owners_of_split(c, is_split) < 2 for c in items):
        return None
    return type(items[0])


def _owners_of_split(cell: nn.Cell, is_split) -> int:
    """How many Cells of ``cell``'s subtree (itself included) hold a split parameter."""
    owners: Set[int] = set()

    def walk(c):
        if any(p is not None and is_split(p) for p in own_params(c).values()):
            owners.add(id(c))
        for child in _children(c):
            walk(child)

    walk(cell)
    return len(owners)


def _children(cell: nn.Cell) -> list:
    """``cell``'s child Cells, without empty slots and MindSpore's recompute wrapper."""
    return [c for name, c in child_cells(cell).items() if c is not None and name != RECOMPUTE_WRAPPER]
