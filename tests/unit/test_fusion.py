"""Bucket planning and MindOne's comm_fusion dict (pure; one process)."""
import pytest

from mindone_zero.fusion import DEFAULT_BUCKET_SIZE, FusionConfig, plan_buckets


def test_twenty_tensors_in_three_buckets():
    sizes = [100] * 20
    buckets = plan_buckets(sizes, ["float32"] * 20, bucket_size=700)
    assert buckets == [list(range(0, 7)), list(range(7, 14)), list(range(14, 20))]


def test_no_fusion_is_one_bucket_per_tensor():
    assert plan_buckets([5, 6, 7], ["float32"] * 3, None) == [[0], [1], [2]]


def test_large_tensor_gets_its_own_bucket_and_order_is_kept():
    assert plan_buckets([10, 500, 10, 10], ["float32"] * 4, 100) == [[0], [1], [2, 3]]


def test_dtypes_never_share_a_bucket():
    buckets = plan_buckets([4, 2, 4, 2], ["float32", "float16", "float32", "float16"], 100)
    assert buckets == [[0, 2], [1, 3]]


def test_mindone_dict_is_parsed():
    cfg = FusionConfig.from_mindone({"allreduce": {"openstate": True, "bucket_size": 5e8},
                                     "reduce_scatter": {"openstate": False, "bucket_size": 10},
                                     "allgather": {"bucket_size": 64}})
    assert cfg == FusionConfig(allreduce=500_000_000, reduce_scatter=None, allgather=64)


def test_default_buckets_by_25_mib_and_empty_dict_turns_fusion_off():
    assert DEFAULT_BUCKET_SIZE == 25 * 1024 * 1024
    assert FusionConfig.from_mindone(None) == FusionConfig(DEFAULT_BUCKET_SIZE, DEFAULT_BUCKET_SIZE, DEFAULT_BUCKET_SIZE)
    assert FusionConfig.from_mindone({}) == FusionConfig(None, None, None)
    assert FusionConfig.from_mindone({"allreduce": {"openstate": False}}) == FusionConfig(None, None, None)


@pytest.mark.parametrize("value, words", [
    ("fuse", ["'comm_fusion'", "fuse"]),
    ({"broadcast": {}}, ["'comm_fusion'", "broadcast"]),
    ({"allreduce": 5}, ["comm_fusion['allreduce']", "5"]),
    ({"allgather": {"bucket_size": 0}}, ["comm_fusion['allgather']['bucket_size']", "0"]),
])
def test_bad_fusion_dicts_name_key_and_value(value, words):
    with pytest.raises((TypeError, ValueError)) as info:
        FusionConfig.from_mindone(value)
    for word in words:
        assert word in str(info.value)
