"""Slicing a tensor in a graph: when to slice, and ``narrow`` and ``copy_slice``, slices that cost little to compile.

[Note: slices]
On the CPU backend (MindSpore 2.10, GRAPH_MODE) a slice that cuts nothing, ``x[:x.shape[0]]``,
costs far more than a real slice (``x[512:]``, ``ops.slice``, ``narrow``) or a copy.
Every slice on a hot path is therefore taken only when it cuts something (a static check: shapes
and padding are known when the graph is built), with ``narrow``; a Cast to the dtype a tensor
already has is skipped too.

[Note: a view keeps its base]
``narrow`` (like ``ops.narrow``: both are the Slice primitive) returns a view in GRAPH_MODE (2.10):
the block it selects keeps the whole tensor it was cut from alive for as long as the block lives.
The emulated reduce-scatter therefore cuts this rank's block out of the all-reduced tensor with a
copying slice (``x[a:b]``, a StridedSlice): at ZeRO-3 the block is a gradient held until the
optimizer step, and as a view it would keep every layer's full all-reduced gradient alive as well.
Narrow stays where the block is used at once (unpacking a bucket, copying into a parameter).

[Note: compiling a narrow]
``ops.narrow`` (MindSpore 2.10) checks its arguments with Python validators that the graph compiler
parses and type-infers again at every call with new arguments. ``narrow`` here computes the Slice's
begin and size in Python once (``ops.constexpr``) and runs the same Slice primitive, so its results
and views are the same, and it compiles faster (``tools/bench/compile_cost.py``).
Indexing (``x[a:b]``, ``x[:, a:b]``) is the same story: the graph compiler runs MindSpore's tensor
indexing code (``tensor_index_by_tuple`` and its helpers) for every call, then emits one
StridedSlice. ``copy_slice`` emits that StridedSlice directly (begin, end and strides computed
once), for the copying slices: the emulated reduce-scatter's block, the padding rows cut off a
ZeRO-3 gather, the packed layout's kept pieces.
"""
from typing import Sequence, Tuple

from mindspore import ops

from .graph_tuples import each

__all__ = ["narrow", "copy_slice", "slice_bounds", "narrow_args", "copy_args", "narrow_each", "copy_each", "run_args",
           "narrow_runs", "MAX_RUNS", "runs_pay", "cut_args", "narrow_cut"]

MAX_RUNS = 16
"""Pieces in more runs than this are cut one Slice each ([Note: runs of pieces])."""


def runs_pay(pieces: int, runs: int) -> bool:
    """Whether ``pieces`` pieces in ``runs`` runs are cut in runs: at most ``MAX_RUNS`` runs of two
    pieces or more on average ([Note: runs of pieces])."""
    return runs <= MAX_RUNS and 2 * runs <= pieces

_SLICE = ops.Slice()
_STRIDED_SLICE = ops.StridedSlice()
_RESHAPE = ops.Reshape()
_UNSTACK = (ops.Unstack(0), ops.Unstack(1))


@ops.constexpr
def _slice_args(shape, axis, start, length, caller="narrow"):
    """``slice_bounds``, evaluated when the graph is built."""
    return slice_bounds(shape, axis, start, length, caller)


def slice_bounds(shape, axis, start, length, caller="narrow"):
    """(begin, size) of the Slice that keeps ``length`` entries of ``axis`` from ``start``; raises
    ValueError for a cut outside ``shape``."""
    ndim = len(shape)
    if not -ndim <= axis < ndim:
        raise ValueError(f"For '{caller}', the argument 'axis' must be in [{-ndim}, {ndim}), but got {axis}.")
    axis %= ndim
    if start < 0 or length < 1 or start + length > shape[axis]:
        raise ValueError(
            f"For '{caller}', 'start' {start} and 'length' {length} must cut inside axis {axis} of shape "
            f"{tuple(shape)}."
        )
    begin = [0] * ndim
    begin[axis] = start
    size = list(shape)
    size[axis] = length
    return tuple(begin), tuple(size)


def narrow(x, axis: int, start: int, length: int):
    """``ops.narrow(x, axis, start, length)``: entries ``start .. start + length - 1`` of ``axis``, as
    a view in GRAPH_MODE ([Note: a view keeps its base]); the arguments are static. Cheaper to compile
    ([Note: compiling a narrow])."""
    begin, size = _slice_args(x.shape, axis, start, length)
    return _SLICE(x, begin, size)


@ops.constexpr
def _strided_args(shape, axis, start, length):
    """(begin, end, strides) of the StridedSlice that copies ``length`` entries of ``axis`` from
    ``start``; raises ValueError for a cut outside ``shape`` (evaluated when the graph is built)."""
    begin, size = _slice_args(shape, axis, start, length, "copy_slice")
    return begin, tuple(b + n for b, n in zip(begin, size)), (1,) * len(shape)


def copy_slice(x, axis: int, start: int, length: int):
    """Entries ``start .. start + length - 1`` of ``axis`` of ``x``, copied: the StridedSlice that
    ``x[start:start + length]`` runs, so a block that is kept does not keep ``x`` alive ([Note: a view
    keeps its base]); the arguments are static, and it compiles as one node ([Note: compiling a narrow])."""
    begin, end, strides = _strided_args(x.shape, axis, start, length)
    return _STRIDED_SLICE(x, begin, end, strides)


def narrow_args(shape: Sequence[int], axis: int, offsets: Sequence[int],
                widths: Sequence[int]) -> Tuple[tuple, tuple]:
    """(begins, sizes) of the Slices that cut a tensor of ``shape`` into pieces along ``axis``, piece
    i ``widths[i]`` entries from ``offsets[i]``: ``narrow_each``'s static arguments, computed in
    Python when a Cell is built ([Note: constants in a map] in graph_tuples.py).

    Raises:
        ValueError: a piece outside ``shape``.
    """
    cuts = [slice_bounds(tuple(shape), axis, int(o), int(w), "narrow_args") for o, w in zip(offsets, widths)]
    return tuple(b for b, _ in cuts), tuple(n for _, n in cuts)


def copy_args(shape: Sequence[int], axis: int, offsets: Sequence[int],
              widths: Sequence[int]) -> Tuple[tuple, ...]:
    """(begins, ends, strides) of the StridedSlices that copy the pieces of ``narrow_args``:
    ``copy_each``'s static arguments."""
    begins, sizes = narrow_args(shape, axis, offsets, widths)
    ends = tuple(tuple(b + n for b, n in zip(begin, size)) for begin, size in zip(begins, sizes))
    return begins, ends, tuple((1,) * len(shape) for _ in begins)


def narrow_each(x, begins, sizes, shapes=None):
    """Every piece of ``x`` given by ``narrow_args`` as a view (one Slice each, as ``narrow``; [Note: a
    view keeps its base]), each reshaped to ``shapes[i]`` if ``shapes`` is given."""
    pieces = each(ops.partial(_SLICE, x), begins, sizes)
    if shapes is None:
        return pieces
    return each(_RESHAPE, pieces, shapes)


def copy_each(x, begins, ends, strides):
    """Every piece of ``x`` given by ``copy_args``, copied (one StridedSlice each, as ``copy_slice``)."""
    return each(ops.partial(_STRIDED_SLICE, x), begins, ends, strides)


def run_args(shape: Sequence[int], axis: int, offsets: Sequence[int], widths: Sequence[int],
             shapes: Sequence[Sequence[int]]) -> tuple:
    """The static arguments of ``narrow_runs``: the pieces of ``narrow_args(shape, axis, offsets, widths)``, piece i
    to be reshaped to ``shapes[i]``, grouped into runs of consecutive pieces that lie one after the other with one
    width and one shape ([Note: runs of pieces]). Each run is (begin, size, stacked, shape): the Slice that cuts
    the run's region, the region's shape with ``axis`` split into (pieces, width), and the pieces' shape.

    Raises:
        ValueError: an axis outside ``shape`` (0 or 1 only), or a piece outside ``shape``.
    """
    if axis not in (0, 1) or axis >= len(shape):
        raise ValueError(f"For 'run_args', the argument 'axis' must be 0 or 1 and inside shape {tuple(shape)}, but "
                         f"got {axis}.")
    runs, i, count = [], 0, len(offsets)
    while i < count:
        j = i
        while (j + 1 < count and widths[j + 1] == widths[i] and tuple(shapes[j + 1]) == tuple(shapes[i])
               and offsets[j + 1] == offsets[j] + widths[j]):
            j += 1
        pieces, width = j - i + 1, int(widths[i])
        begin, size = slice_bounds(tuple(shape), axis, int(offsets[i]), pieces * width, "run_args")
        stacked = size[:axis] + (pieces, width) + size[axis + 1:]
        runs.append((begin, size, stacked, tuple(int(d) for d in shapes[i])))
        i = j + 1
    return tuple(runs)


_reshaped = ops.MultitypeFuncGraph("reshaped")


@_reshaped.register("Tuple", "Tensor")
def _reshaped_tensor(shape, x):
    """``x`` reshaped to the static ``shape`` (one graph per run: every piece of a run has its shape)."""
    return _RESHAPE(x, shape)


def narrow_runs(x, runs, axis: int):
    """Every piece of ``x`` given by ``run_args`` (with the same ``axis``), in order, each reshaped to its shape.

    [Note: runs of pieces]
    Cutting n pieces out of a buffer with a Slice each (``narrow_each``) gives the graph compiler n calls with n
    different constant arguments (the offsets), and it infers each call apart ([Note: constants in a map] in
    graph_tuples.py). A run of equal pieces laid out one after the other compiles faster as one Slice (a view, as
    ``narrow``), one Reshape that stacks its pieces along ``axis`` and one Unstack (``tools/bench/compile_cost.py``,
    ``docs/benchmarks/compile_cost.md``). Along axis 0 that Reshape gives the stacked pieces their shape already;
    along axis 1 each piece is reshaped after the Unstack (a map whose Reshapes share one shape), unless its shape
    is the Unstack's (rows, width), as the stage 1-2 parameter all-gather asks (``BucketedComm.all_gather_rows``:
    the caller's own map reshapes them, one map less to compile). A run of one piece is a Slice and a Reshape.
    The elements are the same: only their copies differ (Unstack copies a run once, where the Slices were views).
    The runs are a loop the compiler unrolls, each turn growing the tuple of pieces, so many short runs cost more
    than the Slices (a model's tensors in their own order make nearly one run each). ``cut_args`` therefore takes
    runs only where they pay (``runs_pay``: at most ``MAX_RUNS`` runs, of two pieces or more on average), and a
    bucket's buffer holds its tensors by shape where that makes such runs ([Note: buckets] in train/fusion.py).
    """
    pieces = ()
    for r in range(len(runs)):
        begin, size, stacked, shape = runs[r]
        region = _SLICE(x, begin, size)
        if stacked[axis] == 1:
            pieces = pieces + (_RESHAPE(region, shape),)
        elif axis == 0:  # the pieces lie one after the other: one Reshape stacks them in their shape
            pieces = pieces + _UNSTACK[0](_RESHAPE(region, (stacked[0],) + shape))
        elif shape == stacked[:1] + stacked[2:]:  # the Unstack gives the pieces their shape
            pieces = pieces + _UNSTACK[1](_RESHAPE(region, stacked))
        else:
            pieces = pieces + each(ops.partial(_reshaped, shape), _UNSTACK[axis](_RESHAPE(region, stacked)))
    return pieces


def cut_args(shape: Sequence[int], axis: int, offsets: Sequence[int], widths: Sequence[int],
             shapes: Sequence[Sequence[int]]) -> tuple:
    """The static arguments of ``narrow_cut``: (``run_args``, None) where the runs pay (``runs_pay``),
    else (None, ``narrow_args`` and ``shapes``) ([Note: runs of pieces]).

    Raises:
        ValueError: as ``run_args``.
    """
    runs = run_args(shape, axis, offsets, widths, shapes)
    if runs_pay(len(offsets), len(runs)):
        return runs, None
    return None, narrow_args(shape, axis, offsets, widths) + (tuple(tuple(int(d) for d in s) for s in shapes),)


def narrow_cut(x, cuts, axis: int):
    """Every piece of ``x`` given by ``cut_args`` (with the same ``axis``), in order, each reshaped to its shape:
    ``narrow_runs`` or ``narrow_each``, as ``cut_args`` chose (a static choice)."""
    runs, pieces = cuts
    if runs is not None:
        return narrow_runs(x, runs, axis)
    begins, sizes, shapes = pieces
    return narrow_each(x, begins, sizes, shapes)
