"""ZeRO++ in one process: blockwise int8 round trips ([Note: block quantization] in
mindone_zero/core/quantize.py), the comm-plan arithmetic, and bad ``zeropp`` values rejected before
anything is modified. The multi-process runs are in tests/dist/test_zeropp.py."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from models import LossNet, TinyNet, init_weights, make_optimizer
from mindone_zero import ZeroPPConfig, estimate_peak_memory, prepare_network, prepare_train_network
from mindone_zero.core.comm import CommPlan
from mindone_zero.core.quantize import block_layout, dequantize_blocks, quantize_blocks, quantized_nbytes
from parallel_modules import shard_network

ms.set_device("CPU")


pytestmark = pytest.mark.usefixtures("pynative_mode")


def _round_trip(x, block_size, carrier=ms.int8):
    numel = x.shape[-1]
    block, blocks, pad = block_layout(numel, block_size)
    q, s = quantize_blocks(Tensor(x), block, blocks, carrier)
    return q.asnumpy(), s.asnumpy(), dequantize_blocks(q, s, block, numel).asnumpy(), block


def _blocks_of(x, block):
    """(rows, blocks, block) view of ``x`` zero-padded like the quantizer does."""
    rows = x.reshape(-1, x.shape[-1])
    pad = -rows.shape[1] % block
    return np.pad(rows, ((0, 0), (0, pad))).reshape(rows.shape[0], -1, block)


@pytest.mark.parametrize("shape", [(1,), (7,), (2047,), (2048,), (2049,), (5000,), (3, 1000), (4, 33)])
@pytest.mark.parametrize("block_size", [1, 64, 2048])
@pytest.mark.parametrize("carrier", [ms.int8, ms.float16], ids=["int8", "float16"])
def test_round_trip_within_the_int8_bound_per_block(shape, block_size, carrier):
    rng = np.random.default_rng(sum(shape) + block_size)
    # magnitudes that differ by orders between elements, so per-block scales matter
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 3, shape)).astype(np.float32)
    x.reshape(-1)[: min(100, x.size) // 2] = 0.0  # a run of zeros (a whole zero block for small blocks)
    q, s, back, block = _round_trip(x, block_size, carrier)
    numel = shape[-1]
    assert block == min(block_size, numel)
    assert back.shape == x.shape and back.dtype == np.float32
    assert np.all(np.abs(q.astype(np.float32)) <= 127) and np.array_equal(q, np.round(q))
    amax = np.abs(_blocks_of(x, block)).max(-1, keepdims=True)
    bound = np.broadcast_to(amax / 254.0 * (1 + 1e-5) + 1e-30, _blocks_of(x, block).shape)
    err = np.abs(_blocks_of(back, block) - _blocks_of(x, block))
    assert np.all(err <= bound), float((err - bound).max())
    assert np.array_equal(back[x == 0], np.zeros(int((x == 0).sum()), np.float32))
    np.testing.assert_allclose(s.reshape(amax.shape), amax / 127.0, rtol=1e-6)


def test_block_layout_and_native_bytes():
    assert block_layout(5000, 2048) == (2048, 3, 1144)
    assert block_layout(32, 2048) == (32, 1, 0)  # a small tensor is one block, not padded to 2048
    assert quantized_nbytes(5000, 2048) == 3 * 2048 + 3 * 4
    assert quantized_nbytes(4096, 2048) == 4096 + 2 * 4  # 4096 fp32 bytes * 4 / (4 + 4/2048 ...)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_values_stay_non_finite_in_their_block_only(bad):
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    x[130] = bad
    _, _, back, _ = _round_trip(x, 100)
    assert not np.isfinite(back[100:200]).any()  # the whole block: an overflow check still sees it
    assert np.isfinite(back[:100]).all() and np.isfinite(back[200:]).all()
    assert np.all(np.abs(back[:100] - x[:100]) <= np.abs(x[:100]).max() / 254 * (1 + 1e-5))


def test_comm_plan_quantized_entries_and_volume_outside():
    plan = CommPlan()
    plan.add_quantized("all_gather", "world", 4, numel=4 * 2048, blocks=4)
    plan.add("all_gather", "node", 32768, 2)
    assert plan.entries == [("all_gather", "world", 8192, 4), ("all_gather", "world", 16, 4),
                            ("all_gather", "node", 32768, 2)]
    assert plan.volume_outside({"node"}) == pytest.approx((8192 + 16) * 3 / 4)
    assert plan.volume() == pytest.approx((8192 + 16) * 3 / 4 + 32768 / 2)


def test_vectors_and_small_tensors_stay_in_full_precision():
    """[Note: full-precision tensors]: biases and norm weights are never quantized; 2-D and larger
    tensors are, from ``min_quantize_numel`` elements on."""
    default = ZeroPPConfig(quantize_weights=True)
    assert default.min_quantize_numel == 0
    assert not default.quantizes((30,)) and not default.quantizes((4096,)) and not default.quantizes(())
    assert default.quantizes((7, 15)) and default.quantizes((3, 1, 3, 3))
    threshold = ZeroPPConfig(quantize_weights=True, min_quantize_numel=1000)
    assert not threshold.quantizes((16, 30))  # 480 elements: a small position table stays exact
    assert threshold.quantizes((32, 32)) and threshold.quantizes((1000, 1))


BAD = [
    ({"quantize_weights": True, "block_size": 0}, ValueError, "'zeropp.block_size' must be a positive int, but got 0."),
    ({"quantize_gradients": True, "block_size": -3}, ValueError, "'zeropp.block_size' must be a positive int, but got -3."),
    ({"quantize_weights": True, "block_size": 1.5}, TypeError, "'zeropp.block_size' must be a positive int, but got 1.5."),
    ({"quantize_weights": True, "min_quantize_numel": -1}, ValueError,
     "'zeropp.min_quantize_numel' must be a non-negative int, but got -1."),
    ({"quantize_gradients": True, "min_quantize_numel": 1.5}, TypeError,
     "'zeropp.min_quantize_numel' must be a non-negative int, but got 1.5."),
    ({"quantize_weights": "yes"}, TypeError, "'zeropp.quantize_weights' must be a bool, but got 'yes'."),
    ({"quantise_weights": True}, ValueError, "'zeropp' has unknown keys ['quantise_weights']"),
    ({"hpz_group": 2}, TypeError, "'zeropp.hpz_group' must be None or a group name (str), but got 2."),
    (ZeroPPConfig(hpz_group="node"), ValueError, "'zeropp.hpz_group' ('node') needs GRAPH_MODE"),
    ([1], TypeError, "'zeropp' must be None, a ZeroPPConfig or a dict, but got [1]."),
]


def _snapshot(net):
    return {p.name: (tuple(p.shape), p.asnumpy().copy()) for p in net.get_parameters()}


def _assert_untouched(net, before):
    after = _snapshot(net)
    for name, (shape, value) in before.items():
        assert after[name][0] == shape and np.array_equal(after[name][1], value), name
        assert getattr(net.parameters_dict()[name], "zero_spec", None) is None
    assert not any(c._has_config_recompute for _, c in net.cells_and_names())


ENTRIES = [
    (lambda n, z: prepare_train_network(n, make_optimizer(n.trainable_params()), zero_stage=3, zeropp=z),
     "prepare_train_network"),
    (lambda n, z: prepare_network(n, 3, zeropp=z), "prepare_network"),
    (lambda n, z: shard_network(n, zeropp=z), "shard_network"),
]


@pytest.mark.parametrize("value,error,text", BAD)
@pytest.mark.parametrize("entry,where", ENTRIES, ids=[w for _, w in ENTRIES])
def test_bad_values_raise_before_anything_is_modified(entry, where, value, error, text):
    net = LossNet(init_weights(TinyNet()))
    before = _snapshot(net)
    with pytest.raises(error) as info:
        entry(net, value)
    assert str(info.value).startswith(f"For '{where}', the argument 'zeropp"), str(info.value)
    assert text in str(info.value)
    _assert_untouched(net, before)


def test_below_stage_3_is_an_error_and_off_is_a_no_op():
    net = LossNet(init_weights(TinyNet()))
    with pytest.raises(ValueError, match=r"'zeropp' applies to zero_stage 3 only, .* with zero_stage=2"):
        prepare_network(net, 2, zeropp={"quantize_weights": True})
    assert prepare_network(net, 0, zeropp=ZeroPPConfig()) is net  # nothing on: accepted at any stage


def test_peak_estimate_adds_the_secondary_shards():
    base = estimate_peak_memory(1000, 8, 3, 100, 2, 2, 12)
    assert estimate_peak_memory(1000, 8, 3, 100, 2, 2, 12, hpz_group_size=4) == base + 2 * 1000 // 4
    with pytest.raises(ValueError, match="'hpz_group_size' must be a finite integer > 0, but got 0"):
        estimate_peak_memory(1000, 8, 3, 100, hpz_group_size=0)
    with pytest.raises(ValueError, match=r"'hpz_group_size' \(4\) needs reshard_after_forward=True"):
        estimate_peak_memory(1000, 8, 3, 100, reshard_after_forward=False, hpz_group_size=4)


def test_estimator_cli_prints_the_hpz_row(capsys):
    from tools.estimate_memory import main

    assert main(["--params", "1000", "--world-size", "4", "--largest-layer", "100", "--hpz-group-size", "2"]) == 0
    # stage 3, fp16 + Adam: 4000 of states + 4 * 100 of a gathered layer + 2 * 1000 / 2 of secondary shards
    assert "| True, hpZ over 2 ranks | 5400 |" in capsys.readouterr().out
