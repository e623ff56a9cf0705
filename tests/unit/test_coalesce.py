"""[Note: coalesced gathers] in one process: which wrappers coalesce. The buffer layout is tested in
test_packing.py ([Note: packed layout])."""
from types import SimpleNamespace

import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor

from mindone_zero.core.comm_records import GatherRecord
from mindone_zero.core.partition import ShardSpec
from mindone_zero.zero3.coalesce import COALESCE_MAX_BYTES, build_gather_group
from mindone_zero.zero3.param_wrapper import ZeroParamWrapper, shard_parameter
from mindone_zero.zero3.zeropp import ZeroPPConfig


def _wrapper(name="w", shape=(6, 4), gathers=True, dtype=ms.float32, zeropp=None, hpz=False):
    spec = ShardSpec(name, shape, 2, 0, True)
    record = GatherRecord("layer", "g", 2, (name,), (spec.padded_shape,), (spec.shard_shape,), dtype, dtype, gathers)
    gather = SimpleNamespace(gathers=gathers, zeropp=zeropp, spec=spec, param_dtype=dtype, compute_dtype=dtype,
                             cast_before_gather=False, group_name=None, group_size=2, record=record)
    return SimpleNamespace(gather=gather, hpz=hpz)


@pytest.mark.parametrize("wrappers", [
    [],
    [_wrapper()],  # a single parameter keeps the per-parameter path (no concat, no split)
    [_wrapper(), _wrapper("b", gathers=False)],
    [_wrapper(), _wrapper("b", zeropp=object())],
    [_wrapper(), _wrapper("b", dtype=ms.float16)],
    [_wrapper(), _wrapper("big", shape=(COALESCE_MAX_BYTES // 4 + 2, 1))],
])
def test_wrappers_that_cannot_share_a_collective_are_not_coalesced(wrappers):
    # the layer decides from its parameters' gathers (ParamGather) before building any gather Cell
    assert build_gather_group([w.gather for w in wrappers]) is None


def test_a_coalescing_layer_builds_its_group_and_no_per_parameter_wrapper():
    """No gather Cell is built and left idle: a layer that coalesces holds its group only; one
    turned to per-parameter gathers (ZeRO++ on a layer built before shard_network) holds wrappers
    only."""
    from mindspore import nn
    import parallel_modules as pm
    from mindone_zero.zero3.param_wrapper import ParamGather
    assert build_gather_group([_wrapper().gather, _wrapper("b", shape=(6,)).gather]) is not None
    layer = pm.Dense(nn.Dense(4, 6), zero_stage=3)  # one process: nothing gathers, per parameter
    assert not layer.zero_coalesce and layer.zero_gather_group is None
    assert isinstance(layer.weight_zero_gather, ZeroParamWrapper)
    specs = [ParamGather(ShardSpec(n, s, 2, 0, True), ms.float32, None, None) for n, s in (("w", (6, 4)), ("b", (6,)))]
    layer.zero_gather_group, layer.zero_coalesce = build_gather_group(specs), True
    layer.gather_per_parameter()
    assert not layer.zero_coalesce and layer.zero_gather_group is None
    assert isinstance(layer.bias_zero_gather, ZeroParamWrapper)


def test_wrappers_read_the_zeropp_options_from_their_parameter_record():
    """[Note: ZeRO++ at build]: a wrapper's gather is built with the options of its parameter's record
    (so no group is built to be switched off); a parameter sharded without them has none."""
    config = ZeroPPConfig(quantize_weights=True)
    with_options, without = (Parameter(Tensor(np.ones((4, 2), np.float32)), name=name) for name in ("with", "without"))
    shard_parameter(with_options, zeropp=config)
    assert with_options.zero_param.zeropp is config and without.__dict__.get("zero_param") is None
    assert ZeroParamWrapper(with_options).gather.zeropp is config
    assert ZeroParamWrapper(without).gather.zeropp is None


def test_a_layer_with_a_frozen_parameter_decides_its_gathers_from_the_parameter_layout():
    """A frozen weight is split by the same rule as the trainable bias ([Note: split rule]), but the two
    are never coalesced: their gathers differ in whether a gradient goes back (``gather_settings``).
    The frozen one's gather sends zeros back without a collective; the layer computes what the layer
    it took over computes."""
    from mindspore import nn
    import parallel_modules as pm
    from mindone_zero.zero3.coalesce import gather_settings
    from mindone_zero.zero3.param_wrapper import param_gather
    dense = nn.Dense(4, 3)
    dense.weight.requires_grad = False
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    expected = dense(x).asnumpy()
    layer = pm.Dense(dense, zero_stage=3)
    assert not layer.zero_coalesce and layer.weight.zero_spec.split and layer.bias.zero_spec.split
    frozen, trainable = (param_gather(p, None, None) for p in (layer.weight, layer.bias))
    assert frozen.frozen and not frozen.record.reduces and trainable.record.reduces
    assert gather_settings(frozen) != gather_settings(trainable)
    grad = layer.weight_zero_gather.gather.shard_grad(Tensor(np.ones((3, 4), np.float32)))
    assert grad.shape == (3, 4) and not grad.asnumpy().any()
    np.testing.assert_allclose(layer(x).asnumpy(), expected, rtol=1e-6)

