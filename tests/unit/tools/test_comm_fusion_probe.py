"""tools/dev/comm_fusion_probe.py: its kernel-graph count and its table (the msrun job itself is run
by hand: it compiles three graphs per rank)."""
import pytest

from tools.dev import comm_fusion_probe as probe

IR = """# IR entry: @kernel_graph_0
  %0(CNode_5) = AllGather(%para4_a) primitive_attrs: {group: "mccl_world_group", fusion: I64(1)}
      : (<Tensor[Float32], (2, 3)>) -> (<Tensor[Float32], (4, 3)>)
  %1(CNode_6) = PrimFunc_AllGather(%para3_b) primitive_attrs: {fusion: I64(1)}
  %2(CNode_9) = AllReduce(%0) primitive_attrs: {op: "sum"}
  %3(CNode_10) = MakeTuple(%0, %1, %2)
  Return(%3)
"""


def test_counts_each_collective_of_a_kernel_graph():
    assert probe.count_collectives(IR) == {"AllGather": 2, "AllReduce": 1, "ReduceScatter": 0}
    assert probe.count_collectives("") == {"AllGather": 0, "AllReduce": 0, "ReduceScatter": 0}


def test_the_table_says_which_way_fused_and_whether_the_outputs_were_right():
    record = {"device": "CPU", "native_reduce_scatter": False, "members": 4, "rows": [
        {"way": probe.WAYS[0], "AllGather": 4, "AllReduce": 4, "ReduceScatter": 0, "outputs right": True},
        {"way": probe.WAYS[2], "AllGather": 4, "AllReduce": 1, "ReduceScatter": 0, "outputs right": False}]}
    lines = probe.table(record).splitlines()
    assert lines[0] == "4 of each collective, device CPU (no native ReduceScatter: not probed)"
    assert lines[3] == "| no fusion attribute | 4 | 4 | 0 | yes |"
    assert lines[4] == "| fusion=1, comm_fusion on | 4 | 1 | 0 | NO |"


def test_one_rank_is_refused(capsys):
    with pytest.raises(SystemExit):
        probe.main(["--nproc", "1"])
    assert "'--nproc' must be >= 2" in capsys.readouterr().err
