"""Slicing a tensor in a graph: when to slice, and ``narrow`` and ``copy_slice``, slices that cost little to compile.

[Note: slices]
On the CPU backend (MindSpore 2.10, GRAPH_MODE) a slice that cuts nothing, ``x[:x.shape[0]]``,
costs about 20-40 ms for a (1024, 1024) float32 tensor, a hundred times a real slice
(``x[512:]``, ``ops.slice``, ``narrow``: 0.2-0.5 ms) or a copy. Every slice on a hot path
is therefore taken only when it cuts something (a static check: shapes and padding are known
when the graph is built), with ``narrow``; a Cast to the dtype a tensor already has is
skipped too.

[Note: a view keeps its base]
``narrow`` (like ``ops.narrow``: both are the Slice primitive) returns a view in GRAPH_MODE (2.10):
the block it selects keeps the whole tensor it was cut from alive for as long as the block lives.
The emulated reduce-scatter therefore cuts this rank's block out of the all-reduced tensor with a
copying slice (``x[a:b]``, a StridedSlice): at ZeRO-3 the block is a gradient held until the
optimizer step, and as a view it kept every layer's full all-reduced gradient alive as well
(measured: 8 x Dense(2048) at N=4, peak 134 MB higher per rank, the whole model's gradients).
Narrow stays where the block is used at once (unpacking a bucket, copying into a parameter).

[Note: compiling a narrow]
``ops.narrow`` (MindSpore 2.10) checks its arguments with Python validators that the graph compiler
parses and type-infers again at every call with new arguments. ``narrow`` here computes the Slice's
begin and size in Python once (``ops.constexpr``) and runs the same Slice primitive, so its results
and views are the same. ``python tools/bench/compile_cost.py`` (one process, this 2-core machine): 20
slices at different offsets added 1.2-1.5 s of compile time with ``ops.narrow`` and 0.4 s with
``narrow``. A fused all-reduce bucket cuts each of its tensors with two or three slices.
Indexing (``x[a:b]``, ``x[:, a:b]``) is the same story: the graph compiler runs MindSpore's tensor
indexing code (``tensor_index_by_tuple`` and its helpers) for every call, then emits one
StridedSlice. ``copy_slice`` emits that StridedSlice directly (begin, end and strides computed
once), for the copying slices: the emulated reduce-scatter's block, the padding rows cut off a
ZeRO-3 gather, the packed layout's kept pieces. Nodes after type inference of a ZeRO-3 step on the
parity tests' TinyNet at N=2: 4547 -> 4319 (8777 -> 8210 with gather units, 2 micro-steps, clipping).
"""
from typing import Sequence, Tuple

from mindspore import ops

from .graph_tuples import each

__all__ = ["narrow", "copy_slice", "slice_bounds", "narrow_args", "copy_args", "narrow_each", "copy_each"]

_SLICE = ops.Slice()
_STRIDED_SLICE = ops.StridedSlice()
_RESHAPE = ops.Reshape()


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
            f"For '{caller}', 'start' {start} and 'length' {length} must cut inside axis {axis} of shape {tuple(shape)}."
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
