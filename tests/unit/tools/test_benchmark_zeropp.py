"""tools/bench/benchmark_zeropp.py without msrun: its table from plan entries, and its block sweep's error."""
import numpy as np
import pytest
import mindspore as ms

from tools.bench.benchmark_zeropp import BLOCKS_PAGE, COMBOS, PAGE, relative_error, render, render_blocks, volumes

ms.set_device("CPU")


pytestmark = pytest.mark.usefixtures("pynative_mode")


def test_benchmark_table_ratios():
    plain = [["all_gather", "w", 1000, 4], ["all_gather", "w", 1000, 4], ["reduce_scatter", "w", 1000, 4],
             ["all_reduce", "w", 4, 4]]
    every = [["all_gather", "w", 250, 4], ["all_gather", "w", 4, 4], ["all_gather", "bench_node", 1000, 2],
             ["all_gather", "bench_node", 1000, 2], ["all_to_all", "w", 250, 4], ["all_to_all", "w", 4, 4]]
    assert volumes(plain, "bench_node") == (pytest.approx(2250.0), pytest.approx(2250.0))  # the 4-byte flag is left out
    assert volumes(every, "bench_node")[1] == pytest.approx(381.0)
    results = [{"combo": c, "phi": 1000, "entries": every if all(c.values()) else plain} for c in COMBOS]
    table = render({"world": 4, "secondary": "bench_node", "results": results})
    assert "| stage 3 | 2250 | 3.00 | 1.000 | 2250 | 3.00 | 1.000 |" in table
    assert "| qwZ + hpZ + qgZ | 1381 | 1.84 | 0.614 | 381 | 0.51 | 0.169 |" in table
    assert "| qwZ + qgZ | 2250 |" in table
    data = {"world": 4, "secondary": "bench_node", "results": results}
    assert "all three together at 0.51Φ' across nodes, 0.169 of stage 3" in PAGE.intro(data)[1]


def test_block_sweep_error_is_zero_on_exact_blocks_and_grows_with_the_block():
    exact = np.arange(-127, 128, dtype=np.float32)  # one block whose largest value is 127: scale 1, exact
    assert relative_error(exact, 255) == 0.0
    heavy = np.random.default_rng(0).standard_t(2, size=8192).astype(np.float32)  # gradient-like tails
    errors = [relative_error(heavy, b) for b in (64, 512, 8192)]
    assert 0 < errors[0] < errors[1] < errors[2], errors


def test_block_sweep_table_and_opening_from_the_errors():
    sweep = {"model": {"d_model": 8, "d_ff": 16}, "sizes": [64, 128, 256],
             "blocks": [{"block_size": 64, "weights": [0.001, 0.003, 0.002], "gradients": [0.01, 0.02, 0.04]},
                        {"block_size": 2048, "weights": [0.002, 0.004, 0.003], "gradients": [0.03, 0.05, 0.07]}]}
    table = render_blocks(sweep)
    assert "| 64 | 6.25% | 0.2000% | 0.3000% | 2.0000% | 4.0000% |" in table
    assert "| 2048 | 0.20% | 0.3000% | 0.4000% | 5.0000% | 7.0000% |" in table
    intro = BLOCKS_PAGE.intro(sweep)
    assert "from 2.00% at 64 to 5.00% at 2048" in intro[1] and "the median gradient error is 5.00%" in intro[1]
