"""Gradient scaling and the inf/nan check, per tensor or on whole buckets.

[Note: unscale and check in the buckets]
A step with a loss scale multiplies every gradient by ``1 / scale`` and then asks whether any
reduced gradient holds an inf or a nan. Done per tensor, that is a Mul, an IsFinite and a ReduceAll
for each of the model's gradients (the per-tensor flags are stacked as booleans and reduced once:
``any_nonfinite``, two kernels per tensor fewer than summing them as floats), in maps the graph
compiler type-infers per tensor ([Note: compile cost] in graph_tuples.py). Where the gradients are
reduced in buckets ([Note: buckets] in train/fusion.py), both run on the packed buffers instead: the
factor multiplies a bucket's buffer before its collective, and the check reads the bucket's result,
so each costs one kernel per bucket.

The numbers are the same. A product is computed per element, so multiplying the concatenated
buffer gives every element the bits it gets alone (the factor is cast to the bucket's dtype, as
``times`` casts it to the tensor's). A bucket's result holds every element of its tensors' results
(their blocks of it, after a reduce-scatter), so it holds an inf or a nan exactly when one of them
does. A buffer also holds what its tensors do not: zeros of the padding (ring chunks, dim-0 padding
rows). A zero times a finite factor stays zero. A factor that is inf or nan (a scale of 0 or nan, or
one so small that its inverse overflows) makes every element inf or nan, padding or not, so the
check's answer is the same.

Stage 3 reduce-scatters its split parameters' gradients in their own bprops ([Note: gradient
reduction] in train/grad_sync.py), and a step that accumulates before it reduces (stages 0-1) checks
its local gradients: neither has a bucket of its own to read. There the unscale stays per tensor (at
stage 3 it divides by the group size too: ``unscaled``, [Note: the group mean in the step] in
zero3/gather_group.py), and
the check packs the gradients into buffers of its own (``PackedBuffers``): each bucket's tensors
flattened and concatenated, then one IsFinite and one ReduceAll per bucket. The clip's global norm
reads such buffers at every stage (the split gradients' and the whole ones apart, as their sums are
reduced differently): one Square and one ReduceSum per bucket (``squared_sum``). The buckets are
those of [Note: buckets] (dtype, ``DEFAULT_BUCKET_SIZE``, a tensor of ``LARGE_TENSOR_BYTES`` or more
alone and not copied), so a buffer copies at most a bucket's bytes. The check's answer is again the
same: a buffer holds exactly its tensors' elements, no padding. The norm is the same sum of squares
added in another order, so it agrees with the per-tensor sums within float32 rounding, not bit for
bit.
"""
from typing import Sequence

import mindspore as ms
from mindspore import nn, ops

from .comm import cast_if_needed, divide
from .graph_tuples import hyper_map, take
from .packing import PackedLayout

__all__ = ["times", "scaled", "unscaled", "any_nonfinite", "squared_sum", "PackedBuffers"]

# Primitives called directly: ``g * ...``, ``ops.cast`` and ``Tensor.all`` are functions the graph
# compiler parses and type-infers again for every tensor of a map ([Note: compile cost] in
# graph_tuples.py); these are the primitives they run.
_MUL, _IS_FINITE, _ALL, _NOT = ops.Mul(), ops.IsFinite(), ops.ReduceAll(), ops.LogicalNot()

times = ops.MultitypeFuncGraph("times")


@times.register("Tensor", "Tensor")
def _times_tensor(factor, g):
    """``g`` times the 0-d ``factor``, in ``g``'s dtype."""
    return _MUL(g, cast_if_needed(factor, g.dtype))


def scaled(x, factor):
    """``x`` times the 0-d ``factor`` in ``x``'s dtype; ``x`` itself when ``factor`` is None (static)."""
    if factor is None:
        return x
    return _MUL(x, cast_if_needed(factor, x.dtype))


def unscaled(xs, factor, summed_by=None, factor_index=None):
    """Each tensor of the tuple ``xs`` times the 0-d ``factor``: one Mul per tensor. Where
    ``summed_by`` (a static group size N) is not None, the split parameters' gradients, which still
    need the division by N ([Note: the group mean in the step] in zero3/gather_group.py), take
    ``factor / N`` instead: every tensor where ``factor_index`` is None, else those whose entry in that
    static tuple is 1."""
    if summed_by is None:
        return hyper_map(ops.partial(times, factor), xs)
    split_factor = divide(factor, summed_by)
    if factor_index is None:
        return hyper_map(ops.partial(times, split_factor), xs)
    return hyper_map(times, take((factor, split_factor), factor_index), xs)


_finite = ops.MultitypeFuncGraph("finite")


@_finite.register("Tensor")
def _finite_tensor(g):
    """True if ``g`` holds no inf and no nan."""
    return _ALL(_IS_FINITE(g))


_STACK = ops.Stack()


def any_nonfinite(xs):
    """True if any tensor of the tuple ``xs`` holds an inf or nan (this rank only); False for ()."""
    if not xs:
        return ops.zeros((), ms.bool_)
    return _NOT(_ALL(_STACK(hyper_map(_finite, xs))))


class PackedBuffers(nn.Cell):
    """A fixed tuple of tensors as the buffers of its buckets ([Note: unscale and check in the
    buckets]): the tensors of each bucket flattened and concatenated, a bucket of one as it is. No
    communication.

    Args:
        buckets: the indices of the tensors in each bucket (tensors of one dtype each).
        numels: the elements of every tensor, in the order of the tuple packed.
    """

    def __init__(self, buckets: Sequence[Sequence[int]], numels: Sequence[int]):
        super().__init__(auto_prefix=False)
        self.buckets = tuple(tuple(int(i) for i in b) for b in buckets)
        # n=1: a layout's pack is the flat concatenation ([Note: packed layout] in packing.py)
        self.layouts = nn.CellList([PackedLayout([numels[i] for i in b], 1) for b in self.buckets])

    def construct(self, xs):
        buffers = ()
        for k in range(len(self.buckets)):
            bucket = self.buckets[k]
            if len(bucket) == 1:
                buffers += (xs[bucket[0]],)
            else:
                buffers += (self.layouts[k].pack(take(xs, bucket)),)
        return buffers


def squared_sum(xs):
    """The sum of the squares of every element of the tuple ``xs``, in float32 (0 for ()): one
    Square and one ReduceSum per tensor, the tensors' sums added in order."""
    total = ops.zeros((), ms.float32)
    for x in xs:
        total = total + _SUM(_SQUARE(cast_if_needed(x, ms.float32)))
    return total


_SUM, _SQUARE = ops.ReduceSum(), ops.Square()
