"""tools/bench/benchmark_compile.py: every row's first call is timed in its own msrun job (a new
process, in the order of a round), its tables pair the rows of one round, and bad sizes exit before
any work."""
import json

import pytest

from tools.bench import benchmark_compile as bc


def _entry(round_, depth, row, wall, cpu, loss=1.0):
    return {"round": round_, "depth": depth, "row": row, "first_wall_s": wall, "first_cpu_s": cpu, "loss": loss,
            "step_s": [0.1, 0.3, 0.2]}


def test_every_row_depth_and_round_is_a_job_of_its_own(tmp_path, monkeypatch):
    calls = []

    def fake_job(args, out, job, tag="", env=None, depths=None, row=None, round_=0):
        calls.append((job, tuple(depths or args.depths), row, round_, tag))
        rows = bc.rows_of(args)
        if job == "timing":
            label = rows[row][0]
            return [_entry(round_, depths[0], label, wall=2.0 + row, cpu=1.0 + row)]
        if job == "graphs":
            return [{"row": label, "depth": args.depths[0], "type_inference_nodes": 10, "kernel_nodes": 5,
                     "emulation_nodes": 0, "emulation_extra": 0} for label, *_ in rows]
        return [_entry(0, args.depths[0], label, 1.0, 1.0) for label, kind, *_ in rows if kind == "ms"]

    monkeypatch.setattr(bc, "_job", fake_job)
    monkeypatch.setattr(bc, "mindone_status", lambda: "MindOne is not installed here.")
    assert bc.main(["--depths", "4", "8", "--stages", "0", "3", "--rounds", "2", "--out", str(tmp_path / "out"),
                    "--docs_dir", str(tmp_path / "docs")]) == 0
    timing = [c for c in calls if c[0] == "timing"]
    rows = ["ms", "stage 0", "stage 3", "stage 3 units"]
    # rounds in order, each running every depth and every row once, one job each
    assert [(d, r, k) for _, d, r, k, _ in timing] == [((d,), i, k) for k in range(2) for d in (4, 8)
                                                     for i in range(len(rows))]
    assert len({c[4] for c in timing}) == len(timing)  # every job its own logs
    assert [c[0] for c in calls[len(timing):]] == ["graphs", "cache", "cache"]
    page = (tmp_path / "docs" / "compile.md").read_text()
    # row i took 2 + i wall and 1 + i CPU seconds: ratios to nn.TrainOneStepCell's, per round
    assert "| stage 3 | 8 | 4.0 / 4.0 | 3.0 / 3.0 | 0.200 | 2.00 / 2.00 | 3.00 / 3.00 |" in page
    assert ("| nn.TrainOneStepCell (DATA_PARALLEL) | 4 | 2.0 / 2.0 | 1.0 / 1.0 | 0.200 | 1.00 / 1.00 | 1.00 / 1.00 |"
            in page)
    assert "MindOne is not installed here." in page
    # the raw results beside the page, and the page says what to expect (ratios of the least first calls)
    results = json.loads((tmp_path / "docs" / "compile.json").read_text())["results"]
    assert results["args"]["depths"] == [4, 8] and len(results["report"]["timing"]) == 16
    assert ", the most here stage 3, gather_units=(Block,) at 2.50x (the least of the rounds, 4 blocks)" in page
    assert "a restart from the compile cache skips most of the compile (1.00-1.00 of the cold first call)" in page


@pytest.mark.parametrize("argv", [["--world_size", "0"], ["--rounds", "0"], ["--steps", "-1"], ["--depths", "0"],
                                  ["--cache_rounds", "-1"]])
def test_bad_sizes_exit_before_any_work(tmp_path, argv, monkeypatch):
    monkeypatch.setattr(bc, "_job", lambda *a, **k: pytest.fail("a job ran"))
    with pytest.raises(SystemExit):
        bc.main(argv + ["--out", str(tmp_path / "out"), "--docs_dir", str(tmp_path / "docs")])
    assert not (tmp_path / "docs").exists()


def test_the_least_over_the_rounds_pairs_each_rows_least_with_the_first_rows_least():
    rows = [("ms",), ("stage 0",), ("stage 3",)]
    # the first row is fastest in round 1, stage 3 in round 0: the least need not come from one round
    cpu = {("ms", 0): 2.0, ("ms", 1): 1.0, ("stage 0", 0): 3.0, ("stage 0", 1): 1.5, ("stage 3", 0): 2.5,
           ("stage 3", 1): 4.0}
    results = [_entry(k, 8, label, wall=2 * t, cpu=t) for (label, k), t in cpu.items()]
    table = bc.least_table(results, rows, [8])
    assert "| ms | 8 | 2.0 | 1.0 | 1.00 | 1.00 |" in table
    assert "| stage 0 | 8 | 3.0 | 1.5 | 1.50 | 1.50 |" in table
    assert "| stage 3 | 8 | 5.0 | 2.5 | 2.50 | 2.50 |" in table
    assert bc.least_table([r for r in results if r["round"] == 0], rows, [8]) == ""  # one round: no table


def test_a_graph_folder_is_emptied_before_a_row_saves_its_ir(tmp_path):
    # IR files an earlier run left in the folder were counted with the new run's (stages 1-3 read
    # twice their kernel nodes on a page)
    folder = tmp_path / "graphs" / "rank0" / "24_stage_1"
    (folder / "rank_0").mkdir(parents=True)
    (folder / "rank_0" / "hwopt_common_final_graph_4_1141.ir").write_text("  %0(x) = AllReduce(%1)\n")
    assert bc.fresh_folder(folder) == folder
    assert not folder.exists() and folder.parent.exists()
    assert bc.graph_size(tmp_path / "graphs" / "rank0", None)["kernel_nodes"] == 0


def _graph_entry(label, depth, rows):
    return {"row": label, "depth": depth, "type_inference_nodes": 10, "kernel_nodes": sum(n for *_, n in rows),
            "emulation_nodes": 0, "emulation_extra": 0, "kernel_breakdown": rows}


def test_graphs_only_runs_the_graph_job_alone_and_the_page_says_where_the_nodes_come_from(tmp_path, monkeypatch):
    from tools.bench import kernel_graph as kg

    calls = []

    def fake_job(args, out, job, tag="", env=None, depths=None, row=None, round_=0):
        calls.append(job)
        assert env == {"MS_DEV_DUMP_IR_PASSES": bc.DUMP_PASSES}
        found = [_graph_entry(label, d, [["MatMul", kg.MODEL_FWD, 3 + i]]) for d in (4, 8)
                 for i, (label, *_) in enumerate(bc.rows_of(args))]
        found[2]["kernel_breakdown"] = [["MatMul", kg.MODEL_FWD, 5], ["AllGather", kg.STAGE3_FWD, 2]]  # 4 blocks
        return found

    monkeypatch.setattr(bc, "_job", fake_job)
    monkeypatch.setattr(bc, "mindone_status", lambda: "MindOne is not installed here.")
    assert bc.main(["--depths", "4", "--graph_depths", "4", "8", "--stages", "0", "3", "--no_units", "--graphs_only",
                    "--out", str(tmp_path / "out"), "--docs_dir", str(tmp_path / "docs")]) == 0
    assert calls == ["graphs"]  # no timing, no compile cache
    page = (tmp_path / "docs" / "compile.md").read_text()
    table = page.split("## Where the kernel-graph nodes come from")[1]
    # one column per step at the first graph depth (4 blocks), not the 8-block entries
    assert "| part | op | nn.TrainOneStepCell (DATA_PARALLEL) | stage 0 | stage 3 |" in table
    assert f"| {kg.MODEL_FWD} | MatMul | 3 | 4 | 5 |" in table
    assert f"| {kg.STAGE3_FWD} | AllGather | 0 | 0 | 2 |" in table
    assert "| **less the CPU emulation** | **all** | **3** | **4** | **7** |" in table
    assert json.loads((tmp_path / "out" / "compile.json").read_text())["timing"] == []


def test_graphs_only_without_the_graph_job_exits_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(bc, "_job", lambda *a, **k: pytest.fail("a job ran"))
    with pytest.raises(SystemExit):
        bc.main(["--graphs_only", "--no_graphs", "--out", str(tmp_path / "out"), "--docs_dir", str(tmp_path / "docs")])
    assert not (tmp_path / "out").exists() and not (tmp_path / "docs").exists()


def test_the_graph_job_records_every_kernel_graphs_nodes_by_op_and_part(tmp_path):
    from tools.bench import kernel_graph as kg

    folder = tmp_path / "24_stage_1" / "rank_0"
    folder.mkdir(parents=True)
    node = ("  %{}(x) = {}(%para1_w)\n      : (<Tensor[Float32], (2)>) -> (<Tensor[Float32], (2)>)\n"
            "      # Scope: ({})\n")
    optimizer = "Default/optimizer-AdamWeightDecay"
    (folder / "hwopt_common_final_graph_5_0001.ir").write_text(
        node.format(0, "Load", optimizer) + node.format(1, "PrimFunc_Reshape", "Default/network-Net"))
    (folder / "hwopt_common_final_graph_6_0002.ir").write_text(node.format(0, "Load", optimizer))
    size = bc.graph_size(tmp_path / "24_stage_1", None)
    assert size["kernel_nodes"] == 3
    assert size["kernel_breakdown"] == [["Reshape", kg.MODEL_FWD, 1], ["Load", kg.OPTIMIZER, 2]]


def test_a_page_from_results_without_a_breakdown_has_no_sources_table():
    old = [{"row": "stage 0", "depth": 24, "type_inference_nodes": 10, "kernel_nodes": 5, "emulation_nodes": 0,
            "emulation_extra": 0}]
    assert bc.sources_table(old) == "" and bc.sources_table([]) == ""


def test_unit_cells_name_the_units_row_and_reach_the_worker(tmp_path, monkeypatch):
    from mindspore import nn

    from tools.dev import launch

    args = bc._parser().parse_args(["--stages", "0", "3", "--unit_cells", "LayerNorm", "Block"])
    assert bc.rows_of(args)[-1] == ("stage 3, gather_units=(LayerNorm, Block)", "zero", 3, True)
    assert bc.unit_classes(args.unit_cells) == (nn.LayerNorm, bc.Block)
    assert bc.rows_of(bc._parser().parse_args(["--stages", "3"]))[-1][0] == "stage 3, gather_units=(Block,)"
    sent = []

    def fake_run_msrun(script, n, out, flags, **kwargs):
        sent.append(flags)
        (out / "graphs_rank0.json").write_text("[]")

    monkeypatch.setattr(launch, "run_msrun", fake_run_msrun)
    bc._job(args, tmp_path, "graphs")
    worker_args = bc._parser().parse_args(sent[0])
    assert worker_args.as_worker and worker_args.unit_cells == ["LayerNorm", "Block"] and worker_args.units


def test_a_unit_class_that_is_not_a_cell_exits_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bc, "_job", lambda *a, **k: pytest.fail("a job ran"))
    for name in ("NoSuchCell", "get_activation"):  # not in mindspore.nn; a function of it, not a Cell class
        with pytest.raises(SystemExit):
            bc.main(["--unit_cells", name, "--out", str(tmp_path / "out"), "--docs_dir", str(tmp_path / "docs")])
        err = capsys.readouterr().err
        assert f"argument --unit_cells: {name!r} is neither Block nor a Cell class of mindspore.nn" in err
    assert not (tmp_path / "docs").exists() and not (tmp_path / "out").exists()
