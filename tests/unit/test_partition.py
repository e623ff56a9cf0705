"""Shard arithmetic of mindone_zero/core/partition.py: [Note: padding] on shapes that do not divide."""
import dataclasses
import json

import numpy as np
import pytest

from mindone_zero.core.partition import (
    ShardSpec,
    merge_arrays,
    pad_rows,
    padding_rows,
    row_range,
    shard_rows,
    split_all,
    split_array,
    whole_candidates,
)

SHAPES = [(7,), (13,), (1,), (7, 15), (15, 3), (0,), (2, 3, 5)]
GROUP_SIZES = [1, 2, 3, 4]


def _array(shape, dtype=np.float32):
    # Values start at 1 so that a padding row (all zeros) cannot be mistaken for data.
    return (np.arange(int(np.prod(shape)), dtype=np.float64) + 1).astype(dtype).reshape(shape)


@pytest.mark.parametrize("d0,n,rows,pad", [(7, 1, 7, 0), (7, 2, 4, 1), (7, 3, 3, 2), (7, 4, 2, 1),
                                          (13, 4, 4, 3), (1, 4, 1, 3), (0, 3, 0, 0), (8, 4, 2, 0), (3, 7, 1, 4)])
def test_rows_and_padding(d0, n, rows, pad):
    assert shard_rows(d0, n) == rows
    assert padding_rows(d0, n) == pad
    assert rows * n == d0 + pad


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", GROUP_SIZES)
def test_split_merge_round_trip_is_exact(shape, n):
    full = _array(shape)
    blocks = split_all(full, n)
    rows = -(-shape[0] // n)
    assert len(blocks) == n
    assert all(b.shape == (rows,) + shape[1:] and b.dtype == full.dtype for b in blocks)
    merged = merge_arrays(blocks, shape[0])
    assert merged.shape == full.shape and merged.dtype == full.dtype
    np.testing.assert_array_equal(merged, full)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", GROUP_SIZES)
def test_blocks_are_the_padded_rows_in_rank_order_and_padding_is_zero(shape, n):
    full = _array(shape)
    padded = pad_rows(full, n)
    pad = padding_rows(shape[0], n)
    assert padded.shape == (shape[0] + pad,) + shape[1:]
    np.testing.assert_array_equal(padded[: shape[0]], full)
    assert not padded[shape[0]:].any()
    for r in range(n):
        start, stop = row_range(shape[0], n, r)
        assert (start, stop) == (r * shard_rows(shape[0], n), (r + 1) * shard_rows(shape[0], n))
        np.testing.assert_array_equal(split_array(full, n, r), padded[start:stop])
    # Data rows of a block are never zero (values start at 1); padding rows always are.
    for r, block in enumerate(split_all(full, n)):
        start, _ = row_range(shape[0], n, r)
        for i in range(block.shape[0]):
            assert (block[i].all() if start + i < shape[0] else not block[i].any()), (r, i)


def test_split_keeps_dtype_and_blocks_are_independent_copies():
    full = _array((7, 3), np.float16)
    blocks = split_all(full, 4)
    assert all(b.dtype == np.float16 and b.flags.c_contiguous for b in blocks)
    blocks[0][0, 0] = -1
    assert full[0, 0] == 1


def test_pad_rows_returns_the_input_when_no_padding_is_needed():
    full = _array((8, 2))
    assert pad_rows(full, 4) is full


def test_merge_of_mindone_style_even_blocks():
    full = _array((8, 3))
    np.testing.assert_array_equal(merge_arrays(np.split(full, 4), 8), full)


@pytest.mark.parametrize("bad", [0, -1, 2.0, "2", None])
def test_bad_group_size_names_argument_and_value(bad):
    for call in (lambda: shard_rows(7, bad), lambda: split_array(_array((7,)), bad, 0),
                 lambda: row_range(7, bad, 0), lambda: pad_rows(_array((7,)), bad)):
        with pytest.raises(ValueError, match=rf"'group_size' must be a positive integer, but got {bad!r}\."):
            call()


@pytest.mark.parametrize("bad", [-1, 4, 10, 1.0, None])
def test_bad_rank_names_argument_and_value(bad):
    for call in (lambda: split_array(_array((7,)), 4, bad), lambda: row_range(7, 4, bad),
                 lambda: ShardSpec("w", (7,), 4, bad, True)):
        with pytest.raises(ValueError, match=rf"'rank' must be an integer in \[0, 4\), but got {bad!r}\."):
            call()


def test_zero_dim_is_rejected():
    with pytest.raises(ValueError, match=r"'arr' must have ndim >= 1, but got a 0-d array"):
        pad_rows(np.float32(3.0), 2)
    with pytest.raises(ValueError, match=r"'arr' must have ndim >= 1"):
        split_array(np.array(3.0), 2, 0)
    with pytest.raises(ValueError, match=r"0-d blocks"):
        merge_arrays([np.array(1.0), np.array(2.0)], 1)
    with pytest.raises(ValueError, match=r"0-d tensor 'scale' cannot be split"):
        ShardSpec("scale", (), 2, 0, True)


def test_mismatched_blocks_are_rejected():
    with pytest.raises(ValueError, match=r"'blocks' must not be empty"):
        merge_arrays([], 3)
    with pytest.raises(ValueError, match=r"same shape, but got \[\(2, 3\), \(3, 3\)\]"):
        merge_arrays([np.zeros((3, 3)), np.zeros((2, 3))], 5)
    # Two blocks of 2 rows cannot hold 7 rows ...
    with pytest.raises(ValueError, match=r"2 blocks of 2 rows cannot hold a dim 0 of 7"):
        merge_arrays(split_all(_array((4,)), 2), 7)
    # ... and blocks of 4 rows are not how 3 rows are split over 2 ranks (that is 2 rows each).
    with pytest.raises(ValueError, match=r"expected blocks of ceil\(3 / 2\) = 2 rows"):
        merge_arrays(split_all(_array((8,)), 2), 3)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", GROUP_SIZES)
def test_shard_spec_shapes_agree_with_split(shape, n):
    full = _array(shape)
    for r in range(n):
        spec = ShardSpec("layer.weight", shape, n, r, True)
        assert spec.shard_shape == split_array(full, n, r).shape
        assert spec.padded_shape == pad_rows(full, n).shape
        assert spec.pad == padding_rows(shape[0], n) and spec.rows == shard_rows(shape[0], n)
    whole = ShardSpec("layer.weight", shape, n, n - 1, False)
    assert (whole.rows, whole.pad, whole.shard_shape, whole.padded_shape) == (shape[0], 0, shape, shape)


@pytest.mark.parametrize(
    "spec",
    [
        ShardSpec("net.w", (7, 15), 4, 3, True),
        ShardSpec("adam_m.net.w", (13,), 3, 1, True),
        ShardSpec("net.b", (15, 3), 2, 0, False),
        ShardSpec("net.scale", (), 2, 1, False),
        ShardSpec("net.empty", (0, 4), 4, 2, True),
    ],
)
def test_shard_spec_json_round_trip(spec):
    entry = json.loads(json.dumps(spec.to_json()))
    assert set(entry) == {"split", "group_size", "rank_id", "shape", "pad"}
    assert entry["rank_id"] == spec.rank and entry["pad"] == spec.pad and entry["shape"] == list(spec.shape)
    back = ShardSpec.from_json(spec.name, entry)
    assert back == spec and isinstance(back.shape, tuple)


def test_shard_spec_is_frozen_and_normalises_shape():
    spec = ShardSpec("w", [np.int64(7), 3], 2, 1, True)
    assert spec.shape == (7, 3) and all(type(s) is int for s in spec.shape)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'rank'"):
        spec.rank = 0
    with pytest.raises(ValueError, match=r"'group_size' must be a positive integer, but got 0\."):
        ShardSpec("w", (7,), 0, 0, True)


def test_mindone_entry_without_shape_raises_key_error_on_shape():
    with pytest.raises(KeyError, match="shape"):
        ShardSpec.from_json("w", {"split": True, "group_size": 2, "rank_id": 0})


@pytest.mark.parametrize("bad", [-1, 7.9, "7", True])
def test_bad_dim0_names_argument_and_value(bad):
    with pytest.raises(ValueError, match=rf"'d0' must be a non-negative integer, but got {bad!r}\."):
        shard_rows(bad, 2)
    with pytest.raises(ValueError, match=rf"'d0' must be a non-negative integer, but got {bad!r}\."):
        row_range(bad, 2, 0)


def test_bad_shard_spec_shape_and_bool_group_size():
    with pytest.raises(ValueError, match=r"'shape' must hold non-negative integers, but got \(-3,\)\."):
        ShardSpec("w", (-3,), 2, 0, True)
    with pytest.raises(ValueError, match=r"'group_size' must be a positive integer, but got True\."):
        shard_rows(7, True)


class _P:
    """Just the attributes the split rule reads."""

    def __init__(self, shape, requires_grad=True, parallel_optimizer=True):
        self.shape, self.requires_grad, self.parallel_optimizer = shape, requires_grad, parallel_optimizer


@pytest.mark.parametrize("shape,n,mindone,padded", [
    ((8, 5), 2, True, True), ((5, 3), 2, False, True), ((3,), 2, False, True), ((12,), 4, True, True),
    ((6, 2), 4, False, True), ((), 2, False, False), ((7,), 1, True, True),
])
def test_split_rule_mindone_by_default_padded_on_request(shape, n, mindone, padded):
    """[Note: split rule]: by default only a dim 0 that divides by N is split (MindOne's rule)."""
    from mindone_zero.core.partition import splits_over

    p = _P(shape)
    assert splits_over(p, n) is mindone
    assert splits_over(p, n, pad_uneven=True) is padded
    assert splits_over(p, n, pad_uneven=False) is mindone


@pytest.mark.parametrize("p", [_P((8,), requires_grad=False), _P((8,), parallel_optimizer=False)])
def test_split_rule_never_splits_frozen_or_opted_out(p):
    from mindone_zero.core.partition import splits_over

    assert not splits_over(p, 2) and not splits_over(p, 2, pad_uneven=True)


def test_uneven_split_names_lists_the_padded_shards():
    from mindone_zero.core.partition import uneven_split_names

    specs = [ShardSpec("a", (5, 3), 2, 0, True), ShardSpec("b", (4, 3), 2, 0, True), ShardSpec("c", (5,), 2, 0, False)]
    assert uneven_split_names(specs) == ["a"]


def test_whole_candidates_lists_big_whole_parameters_largest_first():
    specs = [("a", ShardSpec("a", (7, 100), 4, 0, False), 4), ("b", ShardSpec("b", (8, 100), 4, 0, True), 4),
             ("c", ShardSpec("c", (3,), 4, 0, False), 4), ("d", ShardSpec("d", (9, 100), 4, 0, False), 2)]
    total = (700 + 800 + 3) * 4 + 900 * 2
    assert whole_candidates(specs, 0.01) == [("a", 2800, 2800 / total), ("d", 1800, 1800 / total)]
    assert [n for n, _, _ in whole_candidates(specs, 0.0)] == ["a", "d", "c"]
    assert whole_candidates(specs, 0.5) == []
    assert whole_candidates([], 0.01) == []
