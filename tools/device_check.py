"""For users: a command-line tool, run on the machine with the accelerator.

Check mindone_zero on this machine's accelerator: one line per check, exit 1 on any failure.

    python tools/device_check.py --device Ascend                      # one process, no communication
    msrun --worker_num=1 --local_worker_num=1 --master_port=8129 --log_dir=devchk_logs \\
        --join=True tools/device_check.py --device Ascend              # + stages 1-3 with a group of one
    msrun --worker_num=8 --local_worker_num=8 --master_port=8129 --log_dir=devchk_logs \\
        --join=True tools/device_check.py --device GPU                 # + collectives and parity at N=8

Every rank prints ``PASS|FAIL|SKIP name detail`` lines (under msrun: into each worker's log) and
exits with 1 if any of its checks failed (msrun then fails too). On one accelerator the whole
check takes well under 5 minutes (a 2-core CPU host shared with other jobs: 30 s in one process,
2-3 minutes at N=2).

One process: the optimizer offload's host write-back against the on-device optimizer, a step with
a float16 and one with a bfloat16 compute layer (``to_float``), overflow detection (an inf loss,
which on Ascend in saturation mode only the float-status register sees), ``memory_measure`` on the
runtime's allocator. Under msrun (communication initialised): stages 0-3 against stage 0 (with a
world of one: a group of one) in float32, float16 and bfloat16; with 2+ ranks also ReduceScatter,
AllGather, Broadcast, AllReduce and qgZ's quantized reduce-scatter (AlltoAll on Ascend) on the
world group and on sub-groups of two (``devchk_sub_<a>_<b>``, names unique job-wide), checked
against numpy, including a bfloat16 tensor sent through GPU's float32 cast.

It runs on CPU as well (through comm.py's emulations); MindSpore's CPU kernels have no bfloat16
MatMul, so the bfloat16 step is skipped there, and said so.
"""
import argparse
import os
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from mindone_zero import gather_full_params, prepare_train_network  # noqa: E402
from mindone_zero.core.backend import device_target  # noqa: E402
from mindone_zero.core.comm import GroupComm, backend_has_native, group_size_and_rank, world_group  # noqa: E402
from mindone_zero.memory.measure import measure_model_states, memory_in_use  # noqa: E402
from mindone_zero.core.quantize import QMAX, block_layout  # noqa: E402

FEATURES, HIDDEN, CLASSES, BATCH = 13, 10, 7, 4  # a mix: 10 rows divide by 2, 7 rows by no N > 1
STEPS = 3
# stage k against stage 0, per compute dtype: float32 round-off over STEPS Momentum steps, or the
# compute dtype's rounding (float16: 11 bits, bfloat16: 8 bits) of a layer's output
TOLERANCE = {"float32": dict(rtol=1e-5, atol=1e-6), "float16": dict(rtol=1e-2, atol=1e-2),
             "bfloat16": dict(rtol=5e-2, atol=5e-2)}


class Reporter:
    """Prints one line per check and remembers failures."""

    def __init__(self, rank: int):
        self.rank, self.failed = rank, []

    def line(self, status: str, name: str, detail: str = "") -> None:
        print(f"{status} {name} {detail}".rstrip(), flush=True)
        if status == "FAIL":
            self.failed.append(name)

    def run(self, name: str, check, *args) -> None:
        """Run ``check(*args)``, which returns a detail string, or raises AssertionError (FAIL) or
        ``Skip``; any other exception is a FAIL with its message."""
        try:
            self.line("PASS", name, check(*args) or "")
        except Skip as skip:
            self.line("SKIP", name, str(skip))
        except Exception as err:  # noqa: BLE001 - every failure becomes a FAIL line
            self.fail(name, err)

    def fail(self, name: str, err: Exception) -> None:
        """A FAIL line with the error's first lines; the traceback goes to stderr."""
        traceback.print_exc(file=sys.stderr)
        skip = ("", "-" * 52, f"{type(err).__name__}:")
        lines = [t.strip() for t in str(err).splitlines() if t.strip() not in skip]
        self.line("FAIL", name, f"{type(err).__name__}: {' | '.join(lines[:3])}"[:400])


class Skip(Exception):
    """A check this backend cannot run; the message says why."""


class CheckNet(nn.Cell):
    """Dense, LayerNorm, Dense and softmax cross-entropy; ``dtype`` computes the second Dense in
    float16 or bfloat16 (``to_float``) and casts its logits back to float32."""

    def __init__(self, dtype: str = "float32"):
        super().__init__()
        self.fc1 = nn.Dense(FEATURES, HIDDEN)
        self.norm = nn.LayerNorm((HIDDEN,))
        self.fc2 = nn.Dense(HIDDEN, CLASSES)
        if dtype != "float32":
            self.fc2.to_float(getattr(ms, dtype))
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        rng = np.random.default_rng(0)
        for p in self.get_parameters():
            p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.5))

    def construct(self, x, labels, factor):
        logits = ops.cast(self.fc2(ops.tanh(self.norm(self.fc1(x)))), ms.float32)
        return self.ce(logits, labels) * factor


def batch(step: int, rank: int):
    """(features, labels) of ``rank``'s micro-batch at ``step`` (differ per rank and step)."""
    rng = np.random.default_rng(1000 * step + rank)
    return (Tensor(rng.standard_normal((BATCH, FEATURES)).astype(np.float32)),
            Tensor(rng.integers(0, CLASSES, (BATCH,)).astype(np.int32)))


def train(stage: int, dtype: str = "float32", offload=False, factor: float = 1.0, steps: int = STEPS):
    """(losses, {name: final parameter}, the train network) after ``steps`` Momentum steps."""
    net = CheckNet(dtype)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    step_net = prepare_train_network(net, opt, zero_stage=stage, optimizer_offload=offload, clip_grad=True,
                                     clip_norm=1.0, params_split_info=os.path.join(ARGS.out, "split_info"))
    step_net.set_train(True)
    rank = group_size_and_rank(None)[1]
    losses, overflows = [], []
    for step in range(steps):
        loss, overflow, _ = step_net(*batch(step, rank), Tensor(factor, ms.float32))
        losses.append(float(loss.asnumpy()))
        overflows.append(bool(overflow.asnumpy()))
    params = {k: v.astype(np.float32) for k, v in gather_full_params(step_net).items()}  # collective
    step_net.overflows = overflows
    return np.array(losses), params, step_net


_RUNS = {}


def reference(dtype: str = "float32"):
    """``train(0, dtype)``, run once per dtype: stage 0 is the reference of several checks."""
    if dtype not in _RUNS:
        _RUNS[dtype] = train(0, dtype)
    return _RUNS[dtype]


def _initial_params():
    return {p.name: p.asnumpy() for p in CheckNet().trainable_params()}


def _assert_close(got, want, what, tol):
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, err_msg=f"{what}: {name}", **tol)


# ------------------------------------------------------------------ one-process checks
def check_offload_write_back():
    """The host step's result reaches the network ([Note: host step], backend.py)."""
    host = train(0, offload=True)
    device = reference()
    _assert_close(host[1], device[1], "offloaded against on-device", dict(rtol=1e-5, atol=1e-6))
    moved = max(float(np.abs(host[1][k] - v).max()) for k, v in _initial_params().items())
    assert moved > 1e-3, f"the weights did not change (largest change {moved:.2e})"
    in_place = host[2].zero_helper.host_offload.in_place
    return f"weights moved by up to {moved:.3g}; written {'in place' if all(in_place) else 'back'}"


def check_step(dtype: str):
    """A few steps with a ``dtype`` compute layer: finite losses, weights that move."""
    if dtype == "bfloat16" and device_target() == "CPU":
        raise Skip("MindSpore 2.10's CPU backend has no bfloat16 MatMul kernel (nor LayerNorm, Tanh, "
                   "Conv2DBackpropFilter, UnsortedSegmentSum); runs on Ascend and GPU")
    losses, params, _ = reference(dtype)
    assert np.all(np.isfinite(losses)), f"losses {losses}"
    moved = max(float(np.abs(params[k] - v).max()) for k, v in _initial_params().items())
    assert moved > 1e-3, f"the weights did not change (largest change {moved:.2e})"
    return f"losses {np.round(losses, 4).tolist()}, weights moved by up to {moved:.3g}"


def check_overflow():
    """An inf loss is seen as an overflow on every step, and the weights stay untouched."""
    _, params, step_net = train(0, factor=float("inf"), steps=2)
    assert all(step_net.overflows), f"overflow flags {step_net.overflows}"
    _assert_close(params, _initial_params(), "weights after dropped steps", dict(rtol=0, atol=0))
    how = "float-status register" if step_net.float_status is not None else "isfinite"
    return f"detected by {how}"


def check_memory():
    """``measure_model_states`` counts what the network holds; ``memory_in_use`` reads the
    runtime's allocator on a device (the process's resident set on CPU)."""
    _, params, step_net = reference()
    measured = measure_model_states(step_net)
    held = sum(v.nbytes for v in params.values())
    assert measured["params"] == held, f"params {measured['params']} B, held {held} B"
    assert memory_in_use() > held, f"memory_in_use {memory_in_use()} B, the parameters alone {held} B"
    source = "runtime allocator" if device_target() != "CPU" else "VmRSS"
    return f"params {held} B, total {measured['total']} B, in use {memory_in_use()} B ({source})"


# ------------------------------------------------------------------ parity (communication initialised)
def check_parity(stage: int, dtype: str):
    """Stage ``stage`` against stage 0 on the world group, within TOLERANCE[dtype]."""
    if dtype == "bfloat16" and device_target() == "CPU":
        raise Skip("no bfloat16 MatMul kernel on MindSpore 2.10's CPU backend")
    want = reference(dtype)
    losses, params, _ = train(stage, dtype)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(losses, want[0], err_msg="losses", **tol)
    _assert_close(params, want[1], f"stage {stage} against stage 0", tol)
    worst = max(float(np.abs(params[k] - v).max()) for k, v in want[1].items())
    return f"largest difference from stage 0: {worst:.3g} (tolerance {tol})"


# ------------------------------------------------------------------ collectives (2+ ranks)
DTYPES = ("float32", "float16", "bfloat16")
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
_TOL = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}  # sums of a few values rounded to the dtype


class Collectives(nn.Cell):
    """Each GroupComm collective on float32, float16 and bfloat16 inputs, bfloat16 once more through
    a GroupComm forced to the float32 cast (GPU's path, backend.py), and qgZ's quantized
    reduce-scatter (AlltoAll on Ascend): one graph, the same order on every member."""

    def __init__(self, group, block, blocks):
        super().__init__()
        self.comm = GroupComm(group)
        self.cast_comm = GroupComm(group)
        self.cast_comm.bf16_carrier = ms.float32
        self.block, self.blocks = block, blocks

    def construct(self, inputs, q):
        outs = ()
        for i in range(len(inputs)):
            comm = self.cast_comm if i == len(inputs) - 1 else self.comm
            x, z, y = inputs[i]
            outs += ((comm.all_reduce(x), comm.reduce_scatter(z), comm.all_gather(y), comm.broadcast(x, 0)),)
        return outs, self.comm.reduce_scatter_quantized(q, self.block, self.blocks)


def _inputs(member: int, size: int):
    """(x, z, y, q) of the group member with world rank ``member``, float64."""
    rng = np.random.default_rng(77 + member)
    return (rng.standard_normal((5, 3)), rng.standard_normal((3 * size, 4)), rng.standard_normal((2, 3)),
            rng.standard_normal((2 * size, 6)))


def _round(a, dtype):
    """``a`` as ``dtype`` holds it, back in float64."""
    return Tensor(a.astype(np.float32)).astype(getattr(ms, dtype)).astype(ms.float32).asnumpy().astype(np.float64)


def _references(members, index, dtype):
    """numpy results of OPS for group index ``index``, from every member's inputs rounded to ``dtype``."""
    per = [[_round(a, dtype) for a in _inputs(m, len(members))[:3]] for m in members]
    z_sum = np.sum([p[1] for p in per], axis=0)
    return (np.sum([p[0] for p in per], axis=0), z_sum[3 * index:3 * (index + 1)],
            np.concatenate([p[2] for p in per]), per[0][0])


def run_group_collectives(group, members):
    """Run ``Collectives`` on this rank's inputs (collective over ``group``): ({label: outputs}, qgZ output)."""
    size, index = len(members), members.index(group_size_and_rank(None)[1])
    block, blocks, _ = block_layout(2 * 6, 4)
    mine = _inputs(members[index], size)
    inputs = tuple(tuple(Tensor(a.astype(np.float32)).astype(getattr(ms, d)) for a in mine[:3])
                   for d in DTYPES + ("bfloat16",))
    outs, quantized = Collectives(group, block, blocks)(inputs, Tensor(mine[3].astype(np.float32)))
    return dict(zip(DTYPES + ("bfloat16_via_float32",), outs)), quantized


def check_collective_outputs(group, members, label, outs):
    """Each collective's output of ``label`` (a dtype) against numpy."""
    dtype = label.split("_")[0]
    refs = _references(members, members.index(group_size_and_rank(None)[1]), dtype)
    paths = []
    for op, out, ref in zip(OPS, outs, refs):
        np.testing.assert_allclose(out.astype(ms.float32).asnumpy(), ref, rtol=_TOL[dtype], atol=_TOL[dtype],
                                   err_msg=f"{op} on {group}")
        paths.append(f"{op}:{'native' if backend_has_native(op, group) else 'emulated'}")
    return " ".join(paths)


def check_quantized(group, members, out):
    """qgZ's reduce-scatter against the float sum, within the int8 bound (half a step of each
    member's block scale, max|block| / 127)."""
    index = members.index(group_size_and_rank(None)[1])
    per = [_inputs(m, len(members))[3] for m in members]
    want = np.sum(per, axis=0)[2 * index:2 * (index + 1)]
    bound = sum(np.abs(p).max() for p in per) / (2 * QMAX) + 1e-6
    got = out.asnumpy()
    assert np.abs(got - want).max() <= bound, f"largest error {np.abs(got - want).max():.3g} > bound {bound:.3g}"
    path = "AlltoAll" if GroupComm(group)._native_a2a else "all-gather emulation"
    return f"{path}, largest error {np.abs(got - want).max():.3g} (bound {bound:.3g})"


# ------------------------------------------------------------------ the job
def sub_groups(world: int, rank: int):
    """This rank's sub-group of two, created under a name unique job-wide: ``devchk_sub_<a>_<b>``
    (HCCL and NCCL exchange a group's root info under its name). An odd last rank has none."""
    from mindspore.communication import create_group

    first = rank - rank % 2
    if first + 1 >= world:
        return []
    members = [first, first + 1]
    name = f"devchk_sub_{first}_{first + 1}"
    create_group(name, members)
    return [(name, members)]


def run_one_process(report: Reporter) -> None:
    report.run("offload_write_back", check_offload_write_back)
    for dtype in ("float16", "bfloat16"):
        report.run(f"step_{dtype}", check_step, dtype)
    report.run("overflow_detection", check_overflow)
    report.run("memory_measure", check_memory)


def run_parity(report: Reporter, world: int) -> None:
    """Stages 1-3 in float32; stage 3 (which gathers the weights a compute layer casts) in float16
    and bfloat16."""
    for stage, dtype in ((1, "float32"), (2, "float32"), (3, "float32"), (3, "float16"), (3, "bfloat16")):
        report.run(f"parity_stage{stage}_{dtype}_N{world}", check_parity, stage, dtype)


def run_collectives(report: Reporter, world: int, rank: int) -> None:
    """On the world group and this rank's sub-group: one graph each, one line per dtype."""
    for group, members in [(world_group(), list(range(world)))] + sub_groups(world, rank):
        label = "world" if group == world_group() else group
        try:
            outs, quantized = run_group_collectives(group, members)
        except Exception as err:  # noqa: BLE001 - reported as a FAIL line
            report.fail(f"collectives_{label}", err)
            continue
        for name, values in outs.items():
            report.run(f"collectives_{label}_{name}", check_collective_outputs, group, members, name, values)
        report.run(f"collectives_{label}_qgz", check_quantized, group, members, quantized)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--device", default=None, help="Ascend, GPU or CPU (default: MindSpore's default target)")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--out", default="device_check_out", help="folder for the split-info files it writes")
    parser.add_argument("--only", choices=("all", "one_process", "parity", "collectives"), default="all",
                        help="run one part of the checks (default: all this launch allows)")
    return parser.parse_args(argv)


ARGS = None


def main(argv=None) -> int:
    """Run every check this launch allows; returns the exit status (1 if any check failed)."""
    global ARGS
    ARGS = parse_args(argv)
    os.makedirs(ARGS.out, exist_ok=True)
    if ARGS.device:
        ms.set_device(ARGS.device)
    ms.set_context(mode=ms.GRAPH_MODE if ARGS.mode == "graph" else ms.PYNATIVE_MODE)
    distributed = "MS_WORKER_NUM" in os.environ or "RANK_TABLE_FILE" in os.environ
    world, rank = 1, 0
    if distributed:
        from mindone_zero.core.comm import init_data_parallel

        rank, world = init_data_parallel(device_target())
    report = Reporter(rank)
    print(f"device_check: target {device_target()}, rank {rank} of {world}, MindSpore {ms.__version__}", flush=True)
    parts = ("one_process", "parity", "collectives") if ARGS.only == "all" else (ARGS.only,)
    if "one_process" in parts:
        run_one_process(report)
    if "parity" in parts and distributed:
        run_parity(report, world)
    elif "parity" in parts:
        report.line("SKIP", "parity", "stages 1-3 need communication: launch under msrun (--worker_num=1 and up)")
    if "collectives" in parts and world > 1:
        run_collectives(report, world, rank)
    failed = " ".join(report.failed)
    print(f"{'FAIL' if failed else 'PASS'} device_check {len(report.failed)} failed {failed}".rstrip(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
