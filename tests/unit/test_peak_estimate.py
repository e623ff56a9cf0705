"""estimate_peak_memory: model states plus the full-layer term, against DeepSpeed's formula."""
import pytest

from mindone_zero.memory.estimate import estimate_model_states_memory, estimate_peak_memory


@pytest.mark.parametrize("params,layer,gpus", [(7.5e9, 2.6e8, 64), (1.3e9, 5e7, 8), (33.6e6, 4.2e6, 4)])
def test_stage3_matches_deepspeed_zero3_estimate(params, layer, gpus):
    # DeepSpeed's estimate_zero3_model_states_mem_needs (no offload): 4 * largest_layer_params +
    # 18 * total_params / gpus, i.e. fp16 parameter and gradient (2 + 2) and 14 B of optimizer states.
    deepspeed = 4 * layer + 18 * params / gpus
    ours = estimate_peak_memory(params, gpus, 3, layer, param_bytes=2, grad_bytes=2, optimizer_bytes=14)
    assert abs(ours - deepspeed) <= 1


def test_terms_per_stage_and_option():
    big_p, big_l, n, p, g, k = 33_574_912, 4_196_352, 4, 4, 4, 8
    states = {s: estimate_model_states_memory(big_p, n, s, p, g, k) for s in range(4)}
    assert estimate_peak_memory(big_p, n, 0, big_l, p, g, k) == states[0]
    assert estimate_peak_memory(big_p, n, 1, big_l, p, g, k) == states[1]
    assert estimate_peak_memory(big_p, n, 2, big_l, p, g, k) == states[2] + g * big_l
    free = estimate_peak_memory(big_p, n, 3, big_l, p, g, k)
    keep = estimate_peak_memory(big_p, n, 3, big_l, p, g, k, reshard_after_forward=False)
    assert free == states[3] + (p + g) * big_l
    assert keep == states[3] + p * big_p * (n - 1) // n + g * big_l
    # keeping holds the whole model's weights again: more than freeing by all but one layer's worth
    assert keep - free == p * big_p * (n - 1) // n - p * big_l


def test_option_is_ignored_below_stage_3():
    assert estimate_peak_memory(1000, 4, 2, 10, reshard_after_forward=False) == estimate_peak_memory(1000, 4, 2, 10)


@pytest.mark.parametrize("kwargs,error,text", [
    (dict(largest_layer_params=2000), ValueError, "'largest_layer_params' must be at most 'num_params' \\(1000\\), but got 2000"),
    (dict(largest_layer_params=-1), ValueError, "'largest_layer_params' must be a finite number >= 0, but got -1"),
    (dict(largest_layer_params=10, reshard_after_forward=1), TypeError, "'reshard_after_forward' must be a bool, but got 1"),
    (dict(largest_layer_params=10, zero_stage=4), ValueError, "'zero_stage' must be one of \\[0, 1, 2, 3\\], but got 4"),
])
def test_errors_name_argument_and_value(kwargs, error, text):
    args = dict(num_params=1000, world_size=4, zero_stage=3)
    args.update(kwargs)
    with pytest.raises(error, match=text):
        estimate_peak_memory(**args)


def test_cli_prints_the_peak_table(capsys):
    from tools.estimate_memory import main

    assert main(["--params", "1000", "--world-size", "4", "--largest-layer", "100"]) == 0
    out = capsys.readouterr().out
    # stage 3, fp16 + Adam defaults: states 16 * 1000 / 4 = 4000; free + 4 * 100, keep + 2 * 750 + 2 * 100
    assert "| True | 4400 |" in out and "| False | 5700 |" in out
