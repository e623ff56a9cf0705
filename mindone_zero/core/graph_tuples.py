"""Tuples of tensors in ``construct``: one map for per-tensor work, and picking by static indices.

[Note: per-tensor maps]
Work done on every gradient, parameter or buffer runs through ``hyper_map`` (``ops.HyperMap``) with
an ``ops.MultitypeFuncGraph``, not through a Python loop or comprehension in ``construct``. The graph
compiler (MindSpore 2.10) unrolls a loop into one growing tuple per iteration, and compiles a
comprehension at several times that cost; a HyperMap is one small graph per distinct element
signature, so its compile time hardly grows with the number of tensors (``tools/bench/compile_cost.py``).
What cannot be a map stays a short loop over static indices: sums that must keep their order (the
global norm). The numbers do not change: the same primitives run on the same tensors, and sums keep
their order.

[Note: compile cost]
Most of a train step's compile time is type inference, which visits every node of every graph
specialized for an element of a map; it grows with (maps x tensors x nodes per element). So a
per-tensor pass that does nothing is not built at all (a static check: the shard-shape check below
stage 3, padding where no tensor is padded, casts where no dtype differs), ``take`` returns the tuple
itself when it picks every index and is otherwise one map, not a loop of tuple concatenations, a
bucket's results are cut out, reshaped and ordered in one map ([Note: one map out of the buckets] in
train/fusion.py), and the hot maps call primitives (``ops.Mul()``, ...) rather than the functions
around them (``ops.cast``, ``*``, ``Tensor.all``), which are graphs of their own per tensor.
``tools/bench/compile_cost.py`` measures the train step's compile time at each stage
(docs/benchmarks/compile_cost.md).

[Note: constants in a map]
A MultitypeFuncGraph is specialized once per distinct signature of its arguments, and a constant
argument's signature is its value: a map whose elements carry per-tensor constants (an offset, a
width, a shape, an index) compiles one graph per tensor, and each of those graphs again calls the
functions around the primitives (``Tensor.reshape``, ``narrow``'s checks, ``getitem``). Such maps
call the primitive itself per element instead, through ``each`` (``ops.Map``, which does not
recurse into tuple arguments the way ``hyper_map`` does): ``slicing.narrow_each`` and ``copy_each``
call one Slice or StridedSlice per piece, their begins and sizes computed in Python when the Cell
is built (``narrow_args``, ``copy_args``). The TupleGetItem primitive cannot be called so, mapped
or in a MultitypeFuncGraph (MindSpore 2.10's backend then fails: "The node tuple_get_item must have
2 inputs"), so ``take`` keeps its graph per index, unless the indices are a run, which is one tuple
slice. A map over tensors that only differ in shape and dtype stays a MultitypeFuncGraph: it
specializes once per distinct shape.
"""
from mindspore import ops

__all__ = ["hyper_map", "each", "take"]

hyper_map = ops.HyperMap()

each = ops.Map()
"""``each(fn, xs, ys, ...)``: ``(fn(xs[0], ys[0], ...), fn(xs[1], ys[1], ...), ...)``, not recursing
into elements that are tuples; with a primitive ``fn`` no graph is specialized per element
([Note: constants in a map])."""

_item = ops.MultitypeFuncGraph("item")


@_item.register("Tuple", "Number")
def _item_of(xs, i):
    """``xs[i]`` (specialized per index: [Note: constants in a map])."""
    return xs[i]


def take(xs, index):
    """``(xs[i] for i in index)`` as a tuple, for a static tuple of indices ``index``: ``xs`` itself
    when ``index`` is every index in order, a slice of ``xs`` when it is a run ``a, a + 1, ..., b``,
    else a map over ``index`` ([Note: compile cost])."""
    if not index:
        return ()
    if _is_every_index(index, len(xs)):
        return xs
    if _is_a_run(index):  # one tuple slice, not a graph per index
        return xs[index[0]:index[-1] + 1]
    return hyper_map(ops.partial(_item, xs), index)


@ops.constexpr
def _is_every_index(index, n):
    """Whether ``index`` is 0, 1, ..., n - 1 (evaluated when the graph is built)."""
    return tuple(index) == tuple(range(n))


@ops.constexpr
def _is_a_run(index):
    """Whether ``index`` is a, a + 1, ..., b (evaluated when the graph is built)."""
    return tuple(index) == tuple(range(index[0], index[0] + len(index)))
