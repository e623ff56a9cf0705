"""Tuples of tensors in ``construct``: one map for per-tensor work, and picking by static indices.

[Note: per-tensor maps]
Work done on every gradient, parameter or buffer runs through ``hyper_map`` (``ops.HyperMap``) with
an ``ops.MultitypeFuncGraph``, not through a Python loop or comprehension in ``construct``. The graph
compiler (MindSpore 2.10) unrolls a loop into one growing tuple per iteration, and compiles a
comprehension at three to four times that cost; a HyperMap is one small graph per distinct element
signature. ``python tools/compile_cost.py`` (one process, this 2-core machine), compile time of one
pass that scales each tensor: 8 tensors, 0.08-0.11 s as a loop, 0.30-0.33 s as a comprehension,
0.03-0.05 s through ``hyper_map``; 64 tensors, 0.75-0.79 s, 2.9-3.0 s and 0.04-0.06 s. A train step
holds about a dozen such passes. What cannot be a map stays a short loop: ``take`` (a subset by
static indices) and sums that must keep their order (the global norm). The numbers do not change:
the same primitives run on the same tensors, and sums keep their order.
"""
from mindspore import ops

__all__ = ["hyper_map", "take"]

hyper_map = ops.HyperMap()


_item = ops.MultitypeFuncGraph("item")


@_item.register("Tuple", "Number")
def _item_of(xs, i):
    return xs[i]


def take(xs, index):
    """``(xs[i] for i in index)`` as a tuple, for a static tuple of indices ``index``: a map over
    ``index`` ([Note: picking by index])."""
    if not index:
        return ()
    if _is_every_index(index, len(xs)):
        return xs
    return hyper_map(ops.partial(_item, xs), index)


@ops.constexpr
def _is_every_index(index, n):
    """Whether ``index`` is 0, 1, ..., n - 1 (evaluated when the graph is built)."""
    return tuple(index) == tuple(range(n))
