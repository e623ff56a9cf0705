"""tools/bench/kernel_graph.py: each node of a saved kernel graph is counted once, under its op and the
part of the train step its source stack (or, without one, its scope or its neighbours) names."""
from collections import Counter

import pytest

from tools.bench import benchmark_compile as bc
from tools.bench import kernel_graph as kg

SITE = "/venv/lib/python3.11/site-packages/mindspore"
LIB = "/repo/mindone_zero"
MODEL = "/repo/tools/bench/benchmark_compile.py"
STEP = (f"      # In file {LIB}/train/train_step.py:183~189, 4~36/    def construct(self, *inputs):/\n"
        f"      # In file {LIB}/train/train_step.py:184, 39~55/        loss, overflow, scale, grads = "
        "self._micro_step(*inputs)/\n")
FORWARD = (f"      # In file {MODEL}:85~86, 4~59/    def construct(self, x):/\n"
           f"      # In file {MODEL}:86, 37~45/        return x + self.fc2(self.act(self.fc1(self.ln(x))))/\n"
           f"      # In file {SITE}/nn/layer/basic.py:803~815, 4~16/    def construct(self, x):/\n"
           f"      # In file {SITE}/nn/layer/basic.py:807, 12~39/        x = self.matmul(x, self.weight)/\n")
GATHER = (f"      # In file {LIB}/zero3/param_wrapper.py:427~445, 4~44/    def construct(self, x, after=None):/\n"
          f"      # In file {LIB}/zero3/param_wrapper.py:445, 15~34/        return self.gather.waiting(x, after)/\n"
          f"      # In file {LIB}/core/comm.py:262~270, 4~40/    def all_gather(self, x):/\n"
          f"      # In file {LIB}/core/comm.py:266, 15~40/        return self._all_gather(x)/\n")
BPROP = (f"      # In file {LIB}/zero3/param_wrapper.py:613~614, 4~40/    def bprop(self, x, out, dout):/\n"
         f"      # In file {LIB}/zero3/param_wrapper.py:614, 15~40/        return (self.shard_grad(dout),)/\n"
         f"      # In file {LIB}/zero3/param_wrapper.py:598~611, 4~40/    def shard_grad(self, dout):/\n"
         f"      # In file {LIB}/zero3/param_wrapper.py:605, 15~40/        g = divide(dout, self.size)/\n")
EMULATED = (BPROP.split("\n", 2)[0] + "\n" + BPROP.split("\n", 2)[1] + "\n"
            f"      # In file {LIB}/zero3/param_wrapper.py:598~611, 4~40/    def shard_grad(self, dout):/\n"
            f"      # In file {LIB}/zero3/param_wrapper.py:609, 15~40/        return self.comm.reduce_scatter(g)/\n"
            f"      # In file {LIB}/core/comm.py:246~252, 4~40/    def _reduce_scatter(self, x, role):/\n"
            f"      # In file {LIB}/core/comm.py:251, 15~40/        return copy_slice(total, 0, r, rows)/\n")
UNSCALE = (f"      # In file {LIB}/train/grad_sync.py:133~146, 4~46/    def reduce_and_check(self, grads, factor, "
           "summed_by=None):/\n"
           f"      # In file {LIB}/train/grad_sync.py:143, 40~84/            reduced = self.reduce_grads("
           "unscaled(grads, factor, summed_by, self.factor_index))/\n"
           f"      # In file {LIB}/core/scaling.py:84~96, 4~60/def unscaled(xs, factor, summed_by=None, "
           "factor_index=None):/\n"
           f"      # In file {LIB}/core/scaling.py:91, 15~60/        return hyper_map(ops.partial(times, "
           "split_factor), xs)/\n")
REDUCE = (f"      # In file {LIB}/train/grad_sync.py:133~142, 4~46/    def reduce_and_check(self, grads, factor):/\n"
          f"      # In file {LIB}/train/grad_sync.py:141, 28~46/        reduced, buffers = "
          "self._reduce(grads, factor)/\n"
          f"      # In file {LIB}/train/fusion.py:331, 26~36/                pieces += narrow_cut(sent[k], cuts[k], "
          "axis)/\n")
POST = (f"      # In file {LIB}/train/grad_sync.py:195~210, 4~60/    def all_gather_params(self, after=None):/\n"
        f"      # In file {LIB}/train/grad_sync.py:210, 15~60/        return hyper_map(_write_full, self.ag_params, "
        "fulls, self.ag_rows)/\n")
ADAM = (f"      # In file {SITE}/nn/optim/adam.py:997~1037, 4~27/    @jit(backend=\"ms_backend\")/\n"
        f"      # In file {SITE}/nn/optim/adam.py:1015~1019, 31~67/                optim_result = self.hyper_map(/\n")


def _node(n, op, reads="", scope="Default", trace="", attrs=""):
    return (f"  %{n}(CNode_{n}) = {op}({reads}) {attrs}\n      : (<Tensor[Float32], (2)>) -> (<Tensor[Float32], (2)>)\n"
            f"      # Scope: ({scope})\n{trace}")


IR = ("# IR entry: @kernel_graph3\n\nsubgraph @kernel_graph3() {\n"
      + _node(0, "Load", "%para1_w, UMonad[U]", "Default/network-Net/fc1-Dense/weight_zero_gather-ZeroParamWrapper")
      + _node(1, "AllGather", "%0", "recompute_Default/network-Net/fc1-Dense", STEP + GATHER)
      + _node(2, "PrimFunc_MatMul", "%para2_x, %1", "Default/network-Net/fc1-Dense", STEP + FORWARD)
      + _node(3, "PrimFunc_MatMul", "%2, %1", "Gradients/Default/network-Net/fc1-Dense/Grad_MatMul",
              "      # Corresponding forward node candidate:\n" + STEP + FORWARD)
      + _node(4, "MakeTuple", "%3")  # the recompute pass's: serves its user (%5, then %6)
      + _node(5, "Depend", "%para1_w, %4", attrs="cnode_attrs: {recompute_depend: Bool(1)}")
      + _node(6, "AllGather", "%5", "recompute_Default/network-Net/fc1-Dense/weight_zero_gather-ZeroParamWrapper",
              attrs="cnode_attrs: {duplicated: Bool(1)}")
      + _node(7, "PrimFunc_RealDiv", "%3", "recompute_Default/network-Net", STEP + BPROP)
      + _node(8, "AllReduce", "%7", "recompute_Default/network-Net", STEP + EMULATED)
      + _node(9, "PrimFunc_Mul", "%8", "Default/grad_sync-GradSync", STEP + UNSCALE)
      + _node(10, "TupleGetItem", "%9, I64(0)", "Default/grad_sync-GradSync/grad_rs-BucketedComm", STEP + REDUCE)
      + _node(11, "AdamWeightDecay", "%para1_w, %10", "Default/optimizer-AdamWeightDecay", ADAM)
      + _node(12, "UpdateState", "U, %11", "Default/optimizer-AdamWeightDecay")
      + _node(13, "Load", "%para1_w, %12",
              "Default/zero_helper-ZeroHelper/grad_sync-GradSync/param_ag-BucketedComm/gather_layouts-CellList")
      + _node(14, "Assign", "%para3_full, %13", "Default/grad_sync-GradSync", POST)
      + _node(15, "UpdateState", "%12, %14", "Default/grad_sync-GradSync")  # after the Assign: its input's part
      + _node(16, "Depend", "%11, %15", "Default", STEP)
      + _node(17, "MakeTuple", "%para4_y")  # nothing says anything
      + "  Return(%16)\n      : (<Tensor[Float32], (2)>)\n      # Scope: (Default)\n}\n"
      + "# Order:\n#   1: @kernel_graph3\n")
EMULATION = (f"{LIB}/core/comm.py", frozenset({251}))


def test_every_node_is_counted_once_under_its_op_and_part(tmp_path):
    counts = kg.breakdown(IR, EMULATION)
    assert counts == Counter({
        ("Load", kg.STAGE3_FWD): 1,  # no stack: the gather Cell of its scope
        ("AllGather", kg.STAGE3_FWD): 1,  # the innermost named frame is param_wrapper.py's, not comm.py's
        ("MatMul", kg.MODEL_FWD): 1,  # PrimFunc_ dropped
        ("MatMul", kg.MODEL_BWD): 1,  # autodiff's scope
        ("MakeTuple", kg.STAGE3_BWD): 1, ("Depend", kg.STAGE3_BWD): 1,  # the recomputed gather's
        ("AllGather", kg.STAGE3_BWD): 1,  # the recompute pass's copy
        ("RealDiv", kg.STAGE3_BWD): 1,  # in a custom bprop
        ("AllReduce", kg.EMULATION): 1,
        ("Mul", kg.SCALING): 1,  # a per-tensor map, traced to its call
        ("TupleGetItem", kg.GRAD_SYNC): 1,  # a bucket's helper, in the gradient sync
        ("AdamWeightDecay", kg.OPTIMIZER): 1, ("UpdateState", kg.OPTIMIZER): 1,
        ("Load", kg.POST_GATHER): 1, ("Assign", kg.POST_GATHER): 1, ("UpdateState", kg.POST_GATHER): 1,
        ("Depend", kg.STEP): 1,
        ("MakeTuple", kg.UNTRACED): 1,
    })
    ir = tmp_path / "hwopt_common_final_graph_3_0001.ir"
    ir.write_text(IR)
    assert sum(counts.values()) == bc.count_ir(ir)["nodes"] == 18
    # without the emulation lines, the emulated node is the stage-3 reduce-scatter's
    assert kg.breakdown(IR)[("AllReduce", kg.STAGE3_BWD)] == 1


def test_a_statement_over_several_lines_keeps_its_function():
    frames = kg._frames([f"      # In file {SITE}/nn/optim/adam.py:997~1037, 4~27/    def construct(self, g):/",
                         f"      # In file {SITE}/nn/optim/adam.py:1015~1019, 31~67/        r = self.hyper_map(/",
                         f"      # In file {MODEL}:86, 37~45/        return x/"])
    assert [(line, function, statement) for _, line, function, statement, _ in frames] == [
        (997, "construct", False), (1015, "construct", False), (86, None, True)]


def test_the_table_has_a_line_per_part_and_op_and_the_totals_less_the_emulation():
    dp = kg.as_rows(Counter({("MatMul", kg.MODEL_FWD): 3, ("AllReduce", kg.GRAD_SYNC): 2}))
    s3 = kg.as_rows(Counter({("MatMul", kg.MODEL_FWD): 3, ("AllGather", kg.STAGE3_FWD): 4, ("Load", kg.STAGE3_FWD): 1,
                             ("AllReduce", kg.EMULATION): 1, ("StridedSlice", kg.EMULATION): 1}))
    assert dp == [["MatMul", kg.MODEL_FWD, 3], ["AllReduce", kg.GRAD_SYNC, 2]]  # PARTS order
    assert kg.from_rows(s3) == Counter(dict(((op, part), n) for op, part, n in s3))
    lines = kg.table([("dp", dp), ("stage 3", s3)]).splitlines()
    assert lines[0] == "| part | op | dp | stage 3 |"
    assert lines[2:] == [
        f"| **{kg.MODEL_FWD}** | **all** | **3** | **3** |", f"| {kg.MODEL_FWD} | MatMul | 3 | 3 |",
        f"| **{kg.STAGE3_FWD}** | **all** | **0** | **5** |", f"| {kg.STAGE3_FWD} | AllGather | 0 | 4 |",
        f"| {kg.STAGE3_FWD} | Load | 0 | 1 |",
        f"| **{kg.GRAD_SYNC}** | **all** | **2** | **0** |", f"| {kg.GRAD_SYNC} | AllReduce | 2 | 0 |",
        f"| **{kg.EMULATION}** | **all** | **0** | **2** |", f"| {kg.EMULATION} | AllReduce | 0 | 1 |",
        f"| {kg.EMULATION} | StridedSlice | 0 | 1 |",
        "| **all parts** | **all** | **5** | **10** |", "| **less the CPU emulation** | **all** | **5** | **8** |",
        "| **less the CPU emulation, its all-reduces kept (one per native collective)** | **all** | **5** | **9** |"]


def test_a_line_that_is_no_node_is_refused():
    with pytest.raises(ValueError, match="'node_line'"):
        kg.op_of("  Return(%16)")
