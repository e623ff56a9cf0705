"""[Note: coalesced gathers] in one process: which wrappers coalesce. The buffer layout is tested in
test_packing.py ([Note: packed layout])."""
from types import SimpleNamespace

import mindspore as ms
import pytest

from mindone_zero.core.partition import ShardSpec
from mindone_zero.zero3.coalesce import COALESCE_MAX_BYTES, build_gather_group


def _wrapper(name="w", shape=(6, 4), gathers=True, dtype=ms.float32, zeropp=None, hpz=False):
    spec = ShardSpec(name, shape, 2, 0, True)
    gather = SimpleNamespace(gathers=gathers, zeropp=zeropp, spec=spec, param_dtype=dtype, compute_dtype=dtype,
                             cast_before_gather=False, group_name=None, group_size=2)
    return SimpleNamespace(gather=gather, hpz=hpz)


@pytest.mark.parametrize("wrappers", [
    [],
    [_wrapper()],  # a single parameter keeps the per-parameter path (no concat, no split)
    [_wrapper(), _wrapper("b", gathers=False)],
    [_wrapper(), _wrapper("b", zeropp=object())],
    [_wrapper(), _wrapper("b", hpz=True)],
    [_wrapper(), _wrapper("b", dtype=ms.float16)],
    [_wrapper(), _wrapper("big", shape=(COALESCE_MAX_BYTES // 4 + 2, 1))],
])
def test_wrappers_that_cannot_share_a_collective_are_not_coalesced(wrappers):
    assert build_gather_group(wrappers) is None
