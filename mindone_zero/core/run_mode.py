"""Work that only PYNATIVE_MODE needs, left out of GRAPH_MODE graphs at no cost.

[Note: mode property]
A Cell that builds some work only in PYNATIVE_MODE (``TrainOneStepWrapper``'s map that gives a
ZeRO-3 parameter without a gradient a zero gradient of its shard's shape) reads ``self._pynative``
(the ``IN_PYNATIVE`` property) and builds the work under ``if self._pynative:``. The graph compiler
reads a Cell's attributes when it parses ``construct``, property getters included, so in GRAPH_MODE
the condition is the constant False and the branch is dropped before type inference: it costs no
node. A function with the same test (an ``ops.constexpr`` returning the mode) is not dropped: its
call and both branches are compiled, more nodes than a small per-tensor op saves. In PYNATIVE_MODE
``construct`` runs as Python and reads True; a graph compiled from PYNATIVE_MODE (a ``jit``
function) reads True too and keeps the work. The mode of the call counts, not the mode in which the
Cell was built.

Not everything that looks PYNATIVE-only is: the same-shape reshape of the shards before a ZeRO-3
gather (``ZeroParamWrapper``, ``ZeroGatherGroup``, ``ZeroUnitGather``) is needed in GRAPH_MODE too:
without it a stage-3 step with gather units computes another loss (tests/dist/test_gather_units.py).
"""
import mindspore as ms

__all__ = ["IN_PYNATIVE", "in_pynative"]


def in_pynative(_cell=None) -> bool:
    """Whether MindSpore's context is in PYNATIVE_MODE now."""
    return ms.get_context("mode") == ms.PYNATIVE_MODE


IN_PYNATIVE = property(in_pynative, doc="Whether the call runs in PYNATIVE_MODE ([Note: mode property] in "
                                        "mindone_zero/core/run_mode.py); False when a graph parses it in "
                                        "GRAPH_MODE.")
