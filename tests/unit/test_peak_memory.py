"""measure_peak_memory on the CPU backend (process peak RSS), in one process."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, ops

from mindone_zero.memory.measure import PeakMemory, measure_peak_memory, memory_in_use

ms.set_device("CPU")
MB = 1 << 20


def _touch(nbytes):
    """Allocate and write ``nbytes`` (so the pages are resident), then free them."""
    a = np.ones(nbytes // 8, np.float64)
    return float(a[-1])


def test_peak_counts_memory_freed_before_the_end():
    _touch(8 * MB)  # warm the allocator so the baseline is not skewed by first use
    result = measure_peak_memory(lambda: _touch(200 * MB), steps=2)
    assert isinstance(result, PeakMemory) and result.source == "process_rss"
    # the array is gone when the call returns, yet its 200 MB were resident at the peak
    assert 190 * MB <= result.growth_bytes <= 400 * MB, result
    assert result.peak_bytes == result.baseline_bytes + result.growth_bytes


def test_peak_is_reset_between_measurements():
    measure_peak_memory(lambda: _touch(300 * MB))
    small = measure_peak_memory(lambda: _touch(1 * MB))
    assert small.growth_bytes < 100 * MB, small  # the earlier 300 MB peak is not reported again


def test_peak_waits_for_mindspore_outputs():
    x = Tensor(np.ones((4096, 4096), np.float32))  # 64 MB
    result = measure_peak_memory(lambda: (ops.matmul(x, x) + 1, ops.matmul(x * 2, x)), steps=1)
    assert result.growth_bytes >= 60 * MB, result


def test_baseline_read_earlier_counts_what_was_allocated_since():
    before = memory_in_use()
    kept = np.ones(100 * MB // 8, np.float64)  # held from before the steps to after them
    result = measure_peak_memory(lambda: _touch(1 * MB), baseline=before)
    assert result.baseline_bytes == before
    assert result.growth_bytes >= 95 * MB, result
    assert float(kept[-1]) == 1.0


@pytest.mark.parametrize("kwargs,error,text", [
    (dict(step=lambda: None, baseline=-1), ValueError, "the argument 'baseline' must be None or an int >= 0, but got -1"),
    (dict(step=3), TypeError, "the argument 'step' must be callable, but got int"),
    (dict(step=lambda: None, steps=0), ValueError, "the argument 'steps' must be an int >= 1, but got 0"),
    (dict(step=lambda: None, steps=True), ValueError, "but got True"),
])
def test_bad_arguments_are_named(kwargs, error, text):
    with pytest.raises(error, match=text):
        measure_peak_memory(**kwargs)
