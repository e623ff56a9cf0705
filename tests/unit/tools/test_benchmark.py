"""tools/bench/benchmark.py without msrun: the native-path communication count, its config, the report."""
import json
from pathlib import Path

import re

import pytest
import yaml

from tools.bench.bench_common import load_benchmark_config, setting_label, setting_name, settings_of
from tools.bench.benchmark import (PAGE, main, native_collectives, render_dense_table, render_tables, ring_volume,
                                   summarize)

ROOT = Path(__file__).resolve().parents[3]

# A (5, 3) fp32 parameter sharded over 2 ranks (padded to 6 rows) and a replicated 0-d one.
LAYOUT = [
    {"name": "w", "shape": [5, 3], "padded_shape": [6, 3], "itemsize": 4, "split": True},
    {"name": "t", "shape": [], "padded_shape": [], "itemsize": 4, "split": False},
]
STAGE0_LAYOUT = [dict(p, split=False) for p in LAYOUT]
FLAG = ("all_reduce", 4)  # overflow flag each micro-step; also the clipping norm at stages >= 1


@pytest.mark.parametrize("stage,accum,expected", [
    (0, 1, [FLAG, ("all_reduce", 60), ("all_reduce", 4)]),
    # stage 0 with accumulation reduces the local sums once per optimizer step
    (0, 2, [FLAG, FLAG, ("all_reduce", 60), ("all_reduce", 4)]),
    (1, 2, [FLAG, FLAG, ("reduce_scatter", 72), ("all_gather", 72), ("all_reduce", 4), FLAG]),
    (2, 2, [FLAG, FLAG, ("reduce_scatter", 72), ("reduce_scatter", 72), ("all_gather", 72),
            ("all_reduce", 4), ("all_reduce", 4), FLAG]),
    (3, 2, [FLAG, FLAG, ("all_gather", 72), ("reduce_scatter", 72), ("all_gather", 72), ("reduce_scatter", 72),
            ("all_reduce", 4), ("all_reduce", 4), FLAG]),
])
def test_native_collectives_per_stage(stage, accum, expected):
    layout = STAGE0_LAYOUT if stage == 0 else LAYOUT
    assert native_collectives(layout, stage, accum, clip_grad=True) == expected


def test_stage3_regathered_parameters_are_gathered_again_each_micro_step():
    layout = [dict(LAYOUT[0], regathered=True), LAYOUT[1]]
    gather, scatter = ("all_gather", 72), ("reduce_scatter", 72)
    assert native_collectives(layout, 3, 2, clip_grad=False) == [
        FLAG, FLAG, gather, gather, scatter, gather, gather, scatter, ("all_reduce", 4), ("all_reduce", 4)]
    # the flag means nothing below stage 3
    assert native_collectives(layout, 2, 1, False) == native_collectives(LAYOUT, 2, 1, False)


def test_settings_add_stage3_keeping_gathered_weights_with_units_and_idle_collectives():
    assert settings_of({"stages": [0, 1, 3], "stage3_keep": True}) == [(0, True, False, 0), (1, True, False, 0),
                                                                        (3, True, False, 0), (3, False, False, 0)]
    assert settings_of({"stages": [0, 3], "stage3_keep": False}) == [(0, True, False, 0), (3, True, False, 0)]
    assert settings_of({"stages": [0, 2], "stage3_keep": True}) == [(0, True, False, 0), (2, True, False, 0)]
    assert settings_of({"stages": [0, 3], "stage3_keep": False, "stage3_units": ["Block"]}) == [
        (0, True, False, 0), (3, True, False, 0), (3, True, True, 0)]
    assert settings_of({"stages": [0, 3], "stage3_keep": True, "stage3_units": ["Block"]}) == [
        (0, True, False, 0), (3, True, False, 0), (3, False, False, 0), (3, True, True, 0), (3, False, True, 0)]
    assert settings_of({"stages": [0, 2], "stage3_keep": False, "stage3_units": ["Block"]}) == [
        (0, True, False, 0), (2, True, False, 0)]
    idle = {"stages": [0, 1], "stage3_keep": True, "idle_collectives": [4, 8]}
    assert settings_of(idle) == [(0, True, False, 0), (1, True, False, 0), (0, True, False, 4), (0, True, False, 8)]
    assert settings_of(idle, idle=False) == [(0, True, False, 0), (1, True, False, 0)]  # the Dense stack's
    assert [setting_name(3, True), setting_name(3, False), setting_name(0, True), setting_name(3, True, True),
            setting_name(3, False, True), setting_name(0, True, False, 8)] == [
        "stage3", "stage3_keep", "stage0", "stage3_units", "stage3_keep_units", "stage0_idle8"]
    assert [setting_label(3, False), setting_label(3, True, True), setting_label(3, False, True),
            setting_label(2, True), setting_label(0, True, False, 8)] == [
        "3 (keep)", "3 (units)", "3 (units, keep)", "2", "0 (+8 idle collectives)"]


def test_norm_all_reduce_only_when_clipping_at_stages_1_to_3():
    for stage in (1, 2, 3):
        assert len(native_collectives(LAYOUT, stage, 1, True)) == len(native_collectives(LAYOUT, stage, 1, False)) + 1
    assert native_collectives(STAGE0_LAYOUT, 0, 1, True) == native_collectives(STAGE0_LAYOUT, 0, 1, False)


def test_ring_volume_matches_the_paper_for_one_micro_step():
    # Φ = 64 B with no padding: every stage sends 2Φ(N-1)/N per rank and micro-step besides the 4-byte
    # flags when stage 3 keeps the forward-gathered parameter for backward; 3Φ when it gathers it again.
    world = 4
    layout = [dict(LAYOUT[0], shape=[8, 2], padded_shape=[8, 2])]
    phi = 64
    for stage in (1, 2, 3):
        entries = [e for e in native_collectives(layout, stage, 1, clip_grad=False) if e[1] != 4]
        assert ring_volume(entries, world) == 2 * phi * (world - 1) / world
    entries = [e for e in native_collectives([dict(layout[0], split=False)], 0, 1, False) if e[1] != 4]
    assert ring_volume(entries, world) == 2 * phi * (world - 1) / world
    entries = [e for e in native_collectives([dict(layout[0], regathered=True)], 3, 1, False) if e[1] != 4]
    assert ring_volume(entries, world) == 3 * phi * (world - 1) / world
    assert ring_volume([("all_reduce", 100), ("all_gather", 100)], 2) == 150.0


def test_shipped_config():
    cfg = load_benchmark_config(str(ROOT / "configs" / "benchmark.yaml"))
    bench = cfg["benchmark"]
    assert bench["world_sizes"] == [2, 4] and bench["stages"] == [0, 1, 2, 3]
    assert (bench["param_bytes"], bench["grad_bytes"], bench["optimizer_bytes"]) == (4, 4, 8)
    assert bench["gradient_accumulation_steps"] > 1  # so that gradients are held, as the formula counts them
    assert cfg["dense"] == {"world_sizes": [2], "layers": 4, "width": 1024, "batch_per_rank": 32,
                            "gradient_accumulation_steps": 1, "stage3_units": ["Dense"]}
    assert bench["stage3_units"] == ["Block", "TransformerLM"]
    assert bench["idle_collectives"] == [8]  # as many as "3 (units, keep)" adds to stage 0's 3
    assert bench["pin_ranks"] is True


@pytest.mark.parametrize("text,fragment", [
    ({"benchmark": {"stages": [1, 2]}}, "'benchmark.stages' must be a list of stages from [0, 1, 2, 3] including 0"),
    ({"benchmark": {"stage3_keep": "yes"}}, "'benchmark.stage3_keep' must be a bool, but got 'yes'"),
    ({"benchmark": {"pin_ranks": 1}}, "'benchmark.pin_ranks' must be a bool, but got 1"),
    ({"benchmark": {"stage3_units": "Block"}}, "'benchmark.stage3_units' must be a list of Cell class names, but got"),
    ({"benchmark": {"idle_collectives": [6]}}, "'benchmark.idle_collectives' must be a list of positive multiples of "
                                               "2 x gradient_accumulation_steps (4: as many in forward as in backward "
                                               "at every micro-step), but got [6]"),
    ({"benchmark": {"idle_collectives": 8}}, "'benchmark.idle_collectives' must be a list of positive multiples"),
    ({"benchmark": {"idle_collectives": [True]}}, "'benchmark.idle_collectives' must be a list of positive multiples"),
    ({"dense": {"stage3_units": [3]}}, "'dense.stage3_units' must be a list of Cell class names, but got [3]"),
    ({"benchmark": {"world_sizes": [0]}}, "'benchmark.world_sizes' must be a non-empty list of integers >= 1"),
    ({"benchmark": {"global_batch_size": 12}}, "multiple of N x accumulation for N=4, but got 12"),
    ({"benchmark": {"speed": 1}}, "'benchmark.speed' must be one of"),
    ({"train": {"steps": 1}}, "'train' must be absent"),
    ({"model": {"n_heads": 5}}, "'n_heads' must be a divisor of d_model=64, but got 5"),
    ({"dense": {"width": 0}}, "'dense.width' must be an integer >= 1, but got 0"),
    ({"dense": {"depth": 3}}, "'dense.depth' must be one of"),
    ({"dense": {"world_sizes": 2}}, "'dense.world_sizes' must be a list of integers >= 1, but got 2"),
])
def test_bad_config(tmp_path, text, fragment):
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(text))
    with pytest.raises(ValueError) as err:
        load_benchmark_config(str(path))
    assert fragment in str(err.value)


def _fake_results(folder, world, stage, step_time, memory, prefix="", plan=(), reshard=True, units=False, idle=0,
                  losses=(3.0, 2.0)):
    folder.mkdir(parents=True, exist_ok=True)
    layout = STAGE0_LAYOUT if stage == 0 else [dict(p, regathered=p["split"] and reshard and stage == 3)
                                               for p in LAYOUT]
    for rank in range(world):
        record = {"stage": stage, "world": world, "rank": rank, "memory": memory, "step_times": [step_time] * 3,
                  "losses": list(losses), "layout": layout, "comm_plan": list(plan), "accum": 2, "clip_grad": True,
                  "effective_stage": stage, "reshard_after_forward": reshard, "units": ["Block"] if units else None}
        (folder / f"{prefix}{setting_name(stage, reshard, units, idle)}_rank{rank}.json").write_text(json.dumps(record))


def test_summary_report_and_chart(tmp_path):
    cfg = load_benchmark_config(str(ROOT / "configs" / "benchmark.yaml"))
    kinds = ("params", "master_shards", "optimizer_states", "accumulation", "ema", "other")
    # 16 parameters: fp32 Adam with accumulation at stage 0 holds 4 + 8 + 4 bytes each = 256 B.
    totals = {0: (64, 0, 128, 64), 1: (64, 32, 64, 64), 2: (64, 32, 64, 32), 3: (32, 0, 64, 32)}
    for stage, parts in totals.items():
        memory = dict(zip(kinds, parts + (0, 0)), total=sum(parts))
        _fake_results(tmp_path, 2, stage, 0.1 * (stage + 1), memory)
    _fake_results(tmp_path, 2, 3, 0.35, memory, reshard=False)
    _fake_results(tmp_path, 2, 3, 0.3, memory, units=True)
    _fake_results(tmp_path, 2, 3, 0.25, memory, reshard=False, units=True)
    stage0_memory = dict(zip(kinds, totals[0] + (0, 0)), total=sum(totals[0]))
    _fake_results(tmp_path, 2, 0, 0.15, stage0_memory, idle=8)
    assert cfg["benchmark"]["stage3_units"] == ["Block", "TransformerLM"]
    rows = summarize(cfg, tmp_path, 2)
    # (4+4+8)P, (4+4)P + 8P/2, 4P + (4+8)P/2, (4+4+8)P/2 with P = 16
    assert [r["estimate"] for r in rows] == [256, 192, 160, 128, 128, 128, 128, 256]
    assert [round(r["memory_ratio"], 4) for r in rows] == [1.0, 1.1667, 1.2, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert [round(r["time_ratio"], 6) for r in rows] == [1.0, 2.0, 3.0, 4.0, 3.5, 3.0, 2.5, 1.5]
    assert [r["label"] for r in rows] == ["0", "1", "2", "3", "3 (keep)", "3 (units)", "3 (units, keep)",
                                          "0 (+8 idle collectives)"]
    report = render_tables(cfg, rows)
    # one world size: no N column; memory and time, then communication, then bytes by kind
    assert "| 3 | 0.1 | 0.1 | 1.000 | 400.0 | 4.00x |" in report
    assert "| 3 (keep) | 0.1 | 0.1 | 1.000 | 350.0 | 3.50x |" in report
    # 2 micro-steps: flags 2, gathers 2 x 2 (again in backward) or 2 x 1, reduce-scatters 2, the 0-d one 2, norm 1
    assert re.search(r"\| 3 \| 11 \| [\d.]+ \|", report) and re.search(r"\| 3 \(keep\) \| 9 \| ", report)
    assert re.search(r"\| 3 \(units\) \| 11 \| ", report) and re.search(r"\| 3 \(units, keep\) \| 9 \| ", report)
    assert '"3 (units)": stage 3 with gather_units=(Block)' in report
    assert "warm-up, CPU backend, each rank pinned to a core, N = 2." in report
    # stage 0's 4 collectives (no CommPlan in these files: the per-tensor count) and the 8 idle ones
    assert "| 0 (+8 idle collectives) | 0.2 | 0.2 | 1.000 | 150.0 | 1.50x |" in report
    assert re.search(r"\| 0 \(\+8 idle collectives\) \| 12 \| ", report)
    assert '"0 (+k idle collectives)": stage 0 with k extra 4-byte all-reduces per optimizer step (k = 8)' in report
    # the kinds that hold bytes somewhere (ema and other are 0 everywhere: left out, and said)
    assert "| stage | params | master shards | optimizer states | accumulation | total |" in report
    assert "| 1 | 64 | 32 | 64 | 64 | 224 |" in report and "left out, 0 everywhere: ema, other" in report
    assert max(len(line.split("|")) - 2 for line in report.splitlines() if line.startswith("|")) <= 7
    # two world sizes: the N column comes back
    both = render_tables(cfg, rows + [dict(rows[0], world=4)])
    assert "| N | stage | model states (KiB) |" in both and "| 4 | 0 | 0.2 |" in both
    intro = PAGE.intro({"config": cfg, "rows": rows, "dense_rows": []})
    assert len(intro) == 2 and ": stage 3 took 4.00x stage 0's step on the demo LM;" in intro[1] and "1.20x" in intro[1]
    from tools.bench import plots  # matplotlib: the test extra installs it

    fig = PAGE.draw(plots.pyplot(), {"config": cfg, "rows": rows, "dense_rows": []})
    assert [ax.get_title() for ax in fig.axes] == ["model states per rank", "step time", "communication"]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [r["label"] for r in rows]
    plots.pyplot().close(fig)


def test_dense_rows_are_read_from_their_own_files_and_tabled_against_stage_0(tmp_path):
    cfg = load_benchmark_config(str(ROOT / "configs" / "benchmark.yaml"))
    memory = dict(params=1, master_shards=0, optimizer_states=0, accumulation=0, ema=0, other=0, total=1)
    plan = [["all_reduce", "g", 4, 2], ["all_reduce", "g", 64, 2]]
    for stage in (0, 1, 2, 3):
        _fake_results(tmp_path, 2, stage, 9.9, memory)  # the LM's files must not be read as the Dense's
        _fake_results(tmp_path, 2, stage, 0.2 * (1 + stage / 10), memory, prefix="dense_", plan=plan)
    _fake_results(tmp_path, 2, 3, 9.9, memory, reshard=False)
    _fake_results(tmp_path, 2, 3, 0.2 * 1.25, memory, prefix="dense_", plan=plan, reshard=False)
    _fake_results(tmp_path, 2, 3, 9.9, memory, units=True)
    _fake_results(tmp_path, 2, 3, 0.2 * 1.15, memory, prefix="dense_", plan=plan, units=True)
    _fake_results(tmp_path, 2, 3, 9.9, memory, reshard=False, units=True)
    _fake_results(tmp_path, 2, 3, 0.2 * 1.05, memory, prefix="dense_", plan=plan, reshard=False, units=True)
    rows = summarize(cfg, tmp_path, 2, prefix="dense_")
    assert [r["model"] for r in rows] == ["dense"] * 7
    assert [round(r["time_ratio"], 6) for r in rows] == [1.0, 1.1, 1.2, 1.3, 1.25, 1.15, 1.05]
    table = render_dense_table(cfg, rows)
    assert table.startswith("4 x Dense(1024, 1024)")
    assert "| 2 | 240.0 | 1.20x | 2 |" in table


def test_stage3_coalesced_parameters_share_one_collective_with_their_summed_bytes():
    """[Note: coalesced gathers]: a group records one all-gather (two when regathered) and one
    reduce-scatter of the summed padded bytes; below stage 3 the index means nothing."""
    bias = {"name": "b", "shape": [5], "padded_shape": [6], "itemsize": 4, "split": True}
    layout = [dict(LAYOUT[0], coalesced=0, regathered=True), dict(bias, coalesced=0, regathered=True), LAYOUT[1]]
    gather, scatter = ("all_gather", 72 + 24), ("reduce_scatter", 72 + 24)
    assert native_collectives(layout, 3, 1, clip_grad=False) == [FLAG, gather, gather, scatter, ("all_reduce", 4)]
    plain = [dict(p, coalesced=None) for p in layout]
    assert native_collectives(layout, 2, 1, False) == native_collectives(plain, 2, 1, False)


def test_idle_collectives_must_leave_the_losses_of_stage_0(tmp_path):
    """The idle all-reduces measure synchronisation only: a run whose losses differ from stage 0's
    is a broken measurement, and the summary refuses it."""
    cfg = load_benchmark_config(str(ROOT / "configs" / "benchmark.yaml"))
    cfg["benchmark"]["stages"] = [0]
    memory = dict(params=1, master_shards=0, optimizer_states=0, accumulation=0, ema=0, other=0, total=1)
    _fake_results(tmp_path, 2, 0, 0.1, memory)
    _fake_results(tmp_path, 2, 0, 0.2, memory, idle=8)
    assert [r["label"] for r in summarize(cfg, tmp_path, 2)] == ["0", "0 (+8 idle collectives)"]
    _fake_results(tmp_path, 2, 0, 0.2, memory, idle=8, losses=(3.0, 2.5))
    with pytest.raises(RuntimeError, match="stage 0 with 8 idle collectives gave other losses than stage 0"):
        summarize(cfg, tmp_path, 2)


@pytest.mark.parametrize("argv, fragment", [(["--timeout_s", "0"], "'benchmark.timeout_s' must be an integer >= 1"),
                                            (["--stages", "1", "3"], "benchmark.stages")])
def test_command_line_overrides_are_checked_before_any_job(argv, fragment, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main(argv + ["--out", str(tmp_path / "out"), "--docs", str(tmp_path / "docs")])
    assert err.value.code == 2 and fragment in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "docs").exists()
