"""What ``recompute()`` marks will be on the network's Cells, predicted before any is made.

[Note: predicted recompute marks]
``plan_gathers`` (``reshard.py``) decides which Cells to mark before it marks any ([Note: a frozen
gather plan]). Each decision reads the marks the earlier ones will have made: a Cell inside a region
recomputed whole is not a reader of its own, and a gather inside a recomputed region gets hpZ. So
the plan keeps the marks it has decided beside the ones the network has, and reads both.

MindSpore 2.10 marks a Cell for GRAPH_MODE's recompute pass in ``Cell._recompute``: a Cell already
configured is left as it is (and its Cells below it too); any other gets the configured flag and
the recompute scope, and so does every Cell below it, recursively. ``Cell.recompute()`` calls it on
the Cell; ``mark_recomputed_child`` (``core/ms_internals.py``) calls it on a child the user's
``recompute()`` did not reach (``spread_recompute_scope`` in ``carry.py``). ``RecomputeMarks``
follows that rule over the live Cells; what it adds, it adds to its own sets, not to the Cells.
tests/unit/test_recompute_marks.py checks it against MindSpore's own marks.
"""
from typing import List

from mindspore import nn

from ..core.ms_internals import has_config_recompute, in_recompute_scope

__all__ = ["RecomputeMarks"]


class RecomputeMarks:
    """The recompute marks of the Cells as they are, plus the marks decided for them. Not collective."""

    def __init__(self):
        self._configured = set()  # ids of the Cells decided to be configured (and scoped)

    def configured(self, cell: nn.Cell) -> bool:
        """Whether ``recompute()`` configured ``cell``, or will have."""
        return has_config_recompute(cell) or id(cell) in self._configured

    def scoped(self, cell: nn.Cell) -> bool:
        """Whether GRAPH_MODE recomputes ``cell``, or will (``is_recompute_scoped`` after the marks)."""
        return in_recompute_scope(cell) or id(cell) in self._configured

    def marked(self, cell: nn.Cell) -> bool:
        """Either of the above: the Cell is inside a recomputed region."""
        return self.configured(cell) or self.scoped(cell)

    def recompute(self, cell: nn.Cell) -> None:
        """Decide the marks ``cell.recompute(...)`` or ``mark_recomputed_child(cell)`` makes."""
        if self.configured(cell):
            return
        self._configured.add(id(cell))
        for child in cell.cells():
            self.recompute(child)

    def spread(self, cell: nn.Cell) -> List[nn.Cell]:
        """Decide the marks ``spread_recompute_scope(cell)`` makes: the children it marks, in order
        (``mark_recomputed_child`` on each); none when ``cell`` is not scoped."""
        if not self.scoped(cell):
            return []
        marked = []
        for child in cell.cells():
            if not self.configured(child):
                self.recompute(child)
                marked.append(child)
        return marked
