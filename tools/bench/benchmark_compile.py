"""Time to first step: what the train step costs to compile, at every ZeRO stage.

    python tools/bench/benchmark_compile.py               # defaults: N=2, 24 and 48 blocks, one round
    python tools/bench/benchmark_compile.py --rounds 2 --steps 5 --cache_rounds 2
    python tools/bench/benchmark_compile.py --depths 24 --graphs_only --docs_dir /tmp/page   # graph sizes only

Writes its page into ``docs/benchmarks/compile.md``, with its figure and raw results beside it
(``tools/bench/pages.py``: the page is stamped with this command, the date, the commit, the versions
and the machine's load average), and the raw figures into ``<out>/compile.json``.

The model is a pre-norm MLP language model written here, outside the library (issue 37's): an
Embedding(64, 96); per block LayerNorm(96), Dense(96, 256) without bias, GELU, Dense(256, 96)
without bias and a residual; an output Dense(96, 64) without bias: 2 + 4 x blocks parameter
tensors. AdamWeightDecay, no clipping (``--clip_grad``: this library's rows clip by the global norm;
``nn.TrainOneStepCell`` has no clipping), no loss scale, GRAPH_MODE, 4 sequences of 16 tokens per rank.

Three msrun jobs of ``--world_size`` ranks (rank 0's figures are reported):

1. *Timing*, one msrun job per row, depth and round. Each train step (``nn.TrainOneStepCell`` under
   ``DATA_PARALLEL``, which all-reduces its gradients through ``nn.DistributedGradReducer``:
   MindSpore's own data-parallel step; this library at stages 0-3 (stage 3 with a gather per Cell,
   ``gather_units=None``); stage 3 with ``gather_units=(Block,)`` (what the default, ``"auto"``,
   picks on this model), or the classes ``--unit_cells`` names; MindOne's
   ``prepare_train_network`` at stages 0 and 1 where ``mindone.trainers.zero`` imports) is built in
   a new process, as a training job builds it, after one small warm-up compile, and its first call
   (compile and one step) timed in wall and CPU seconds (the process's CPU, all threads), then
   ``--steps`` more calls, whose median is the step time. A new process per row, because in one
   process every later compile pays for the earlier ones: ``nn.TrainOneStepCell`` compiled five
   times over in one job took 3.4, 5.1, 4.2, 5.1 and 4.0 CPU-s, so a row measured after others
   looked slower than it is. Every round runs every row once, in the same order, so rows of one
   round are measured side by side; ``--rounds`` repeats that, and a second table gives each row's
   least first call over the rounds with its ratio to ``nn.TrainOneStepCell``'s least (the least of
   repeated timings is the one a busy moment slowed least).
2. *Graph size* (``--no_graphs`` skips it; ``--graph_depths``, by default the first depth). The
   same steps compiled once more with
   ``MS_DEV_DUMP_IR_PASSES`` saving two IRs: the nodes after type inference (the frontend graph,
   every specialised subgraph: where most compile time goes, [Note: compile cost] in
   ``mindone_zero/core/graph_tuples.py``) and the nodes of the final kernel graphs (what runs). Kernel
   nodes that come from a CPU emulation of a missing collective (``GroupComm``'s emulation branches
   in ``mindone_zero/core/comm.py``) are counted apart, less the all-reduce that stands in for the
   native collective: that part would not exist on Ascend. The kernel nodes are also broken down by
   op and by the part of the step they serve (``tools/bench/kernel_graph.py``: model forward and
   backward, stage-3 gathers, gradient sync, unscale and overflow, optimizer, post-optimizer
   gather, CPU emulation), into the page's table "where the kernel-graph nodes come from" (the
   first graph depth). ``--graphs_only`` runs this job alone.
3. *Compile cache* (``--cache_rounds 0`` skips it). MindSpore's compile cache
   (``MS_COMPILER_CACHE_ENABLE=1``, ``MS_COMPILER_CACHE_PATH``): one job compiles the steps of the
   first depth (``nn.TrainOneStepCell`` and ``--cache_stages``, by default 0 and 3) into an empty
   cache folder (cold), a second job, a new process as a restart is,
   runs the same steps from that folder (warm); rounds interleave cold and warm.
   ``docs/guides/compile-time.md`` says what invalidates the cache.

Keep the machine otherwise idle where you can: the rows are comparable within one run only.
"""
import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

if __name__ == "__main__":  # MindSpore: errors only; must precede its import (an importer keeps its own)
    os.environ.setdefault("GLOG_v", "3")
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mindspore import nn  # noqa: E402

from tools.bench import kernel_graph  # noqa: E402
from tools.bench.pages import Page  # noqa: E402

VOCAB, WIDTH, HIDDEN, SEQ, BATCH_PER_RANK = 64, 96, 256, 16, 4
DUMP_PASSES = "type_inference,hwopt_common_final_graph"
NODE = re.compile(r"^  %\d+\(")
FILE_LINE = re.compile(r"# In file (\S+?):(\d+),")  # a statement's line (a function's range has "~")


# ----------------------------------------------------------------------------- the model (built in the worker)
class Block(nn.Cell):
    """Pre-norm MLP block: ``x + fc2(gelu(fc1(ln(x))))``."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm((WIDTH,))
        self.fc1 = nn.Dense(WIDTH, HIDDEN, has_bias=False)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(HIDDEN, WIDTH, has_bias=False)

    def construct(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class MLPLM(nn.Cell):
    """Embedding, ``depth`` blocks, output head; returns the mean next-token cross-entropy."""

    def __init__(self, depth):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.SequentialCell([Block() for _ in range(depth)])
        self.head = nn.Dense(WIDTH, VOCAB, has_bias=False)
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids, targets):
        x = self.blocks(self.embedding(ids).reshape((-1, WIDTH)))
        return self.loss(self.head(x), targets.reshape((-1,)))


def _build_net(depth: int):
    import numpy as np
    from mindspore import Tensor

    net = MLPLM(depth)
    rng = np.random.default_rng(0)
    for p in net.get_parameters():  # identical on every rank
        if p.name.endswith("gamma"):
            value = np.ones(p.shape)
        elif p.name.endswith("beta"):
            value = np.zeros(p.shape)
        else:
            value = rng.standard_normal(p.shape) * 0.02
        p.set_data(Tensor(value.astype(np.float32), p.dtype))
    return net


def rows_of(args) -> list:
    """(label, kind, zero_stage, gather units) of every row, in the order each round runs them."""
    rows = [("nn.TrainOneStepCell (DATA_PARALLEL)", "ms", None, False)]
    if args.mindone:
        rows += [(f"MindOne stage {s}", "mindone", s, False) for s in (0, 1)]
    rows += [(f"stage {s}", "zero", s, False) for s in args.stages]
    if 3 in args.stages and args.units:
        rows.append((f"stage 3, gather_units={_units_text(args.unit_cells)}", "zero", 3, True))
    return rows


def _units_text(names) -> str:
    """``names`` as the tuple of classes a caller writes: ``(Block,)``, ``(LayerNorm, Dense)``."""
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def unit_classes(names) -> tuple:
    """The Cell classes of ``--unit_cells``: ``Block`` (the model's block) or a class of ``mindspore.nn``.

    Raises:
        ValueError: a name that is neither, naming it.
    """
    classes = []
    for name in names:
        cls = Block if name == "Block" else getattr(nn, name, None)
        if not (isinstance(cls, type) and issubclass(cls, nn.Cell)):
            raise ValueError(f"{name!r} is neither Block nor a Cell class of mindspore.nn")
        classes.append(cls)
    return tuple(classes)


def _build_step(kind: str, stage, units: bool, depth: int, out: str, clip_grad: bool = False,
                unit_cells=("Block",)):
    net = _build_net(depth)
    opt = nn.AdamWeightDecay(net.trainable_params(), 1e-3)
    if kind == "ms":
        train = nn.TrainOneStepCell(net, opt)
    elif kind == "mindone":
        from mindone.trainers.zero import prepare_train_network as mindone_prepare
        from mindspore.communication.management import GlobalComm

        train = mindone_prepare(net, opt, zero_stage=stage, optimizer_parallel_group=GlobalComm.WORLD_COMM_GROUP)
    else:
        from mindone_zero import prepare_train_network

        train = prepare_train_network(net, opt, zero_stage=stage,
                                      gather_units=unit_classes(unit_cells) if units else None,
                                      params_split_info=os.path.join(out, "split_info"), clip_grad=clip_grad)
    train.set_train(True)
    return train


def _inputs(rank: int):
    import numpy as np
    from mindspore import Tensor

    rng = np.random.default_rng([1, rank])
    ids = rng.integers(0, VOCAB, size=(BATCH_PER_RANK, SEQ + 1)).astype(np.int32)
    return Tensor(ids[:, :-1].copy()), Tensor(ids[:, 1:].copy())


def _loss_of(result) -> float:
    loss = result[0] if isinstance(result, tuple) else result
    return float(loss.asnumpy())


def _time_first(train, inputs, steps: int) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    loss = _loss_of(train(*inputs))
    first = {"first_wall_s": time.perf_counter() - wall, "first_cpu_s": time.process_time() - cpu, "loss": loss}
    later = []
    for _ in range(steps):
        start = time.perf_counter()
        _loss_of(train(*inputs))
        later.append(time.perf_counter() - start)
    first["step_s"] = later
    return first


def _warm_up(inputs):
    """The process's first compile carries one-time costs; pay them on a small step first."""

    net = _build_net(1)
    _loss_of(nn.TrainOneStepCell(net, nn.AdamWeightDecay(net.trainable_params(), 1e-3))(*inputs))


# ----------------------------------------------------------------------------- graph sizes
def emulation_lines() -> tuple:
    """(comm.py's path, the statement lines of ``GroupComm``'s CPU emulation branches)."""
    import inspect

    from mindone_zero.core import comm

    lines = set()
    for method in (comm.GroupComm._reduce_scatter, comm.GroupComm._all_gather, comm.GroupComm._broadcast):
        source, start = inspect.getsourcelines(method)
        for offset, text in enumerate(source[1:], 1):
            stripped = text.strip()
            if (stripped and not stripped.startswith("#") and "self._native" not in stripped
                    and "_op(" not in stripped and "_broadcast0(" not in stripped):
                lines.add(start + offset)
    return inspect.getsourcefile(comm), frozenset(lines)


def count_ir(path: Path, emulation=None) -> dict:
    """Nodes of a saved IR file; with ``emulation`` (comm.py's path, lines), also the nodes whose
    source stack passes through those lines, and how many of them are AllReduce."""
    nodes, emulated, stand_in = 0, 0, 0
    current, in_emulation = None, False

    def close():
        nonlocal emulated, stand_in
        if current is not None and in_emulation:
            emulated += 1
            stand_in += "AllReduce(" in current

    for line in path.read_text(errors="replace").splitlines():
        if NODE.match(line):
            close()
            nodes, current, in_emulation = nodes + 1, line, False
        elif emulation is not None and current is not None and "# In file" in line:
            found = FILE_LINE.search(line)
            if found and found.group(1) == emulation[0] and int(found.group(2)) in emulation[1]:
                in_emulation = True
    close()
    return {"nodes": nodes, "emulation_nodes": emulated, "emulation_allreduce": stand_in}


def fresh_folder(folder: Path) -> Path:
    """``folder``, emptied: IR files an earlier run left there would be counted with this run's."""
    shutil.rmtree(folder, ignore_errors=True)
    return folder


def graph_size(folder: Path, emulation) -> dict:
    """Nodes after type inference (the largest such IR of the compile) and of the kernel graphs,
    with the CPU-emulation part of the latter, and the kernel nodes by op and part of the step
    (``kernel_breakdown``: ``kernel_graph.as_rows`` of all the kernel graphs)."""
    inferred = [count_ir(p)["nodes"] for p in folder.rglob("*type_inference*.ir")]
    finals = sorted(folder.rglob("hwopt_common_final_graph*.ir"))
    kernel = [count_ir(p, emulation) for p in finals]
    parts = sum((kernel_graph.breakdown(p.read_text(errors="replace"), emulation) for p in finals), Counter())
    return {"type_inference_nodes": max(inferred) if inferred else None,
            "kernel_nodes": sum(k["nodes"] for k in kernel),
            "emulation_nodes": sum(k["emulation_nodes"] for k in kernel),
            "emulation_extra": sum(k["emulation_nodes"] - k["emulation_allreduce"] for k in kernel),
            "kernel_breakdown": kernel_graph.as_rows(parts)}


# ----------------------------------------------------------------------------- the msrun worker
def worker(args) -> None:
    """One job's work on this rank (``--job timing|graphs|cache``); writes ``<job>_rank<r>.json``."""
    import mindspore as ms

    from mindone_zero.core.comm import init_data_parallel

    rank, _ = init_data_parallel()
    ms.set_context(mode=ms.GRAPH_MODE)
    inputs = _inputs(rank)
    _warm_up(inputs)
    rows, depths, results = rows_of(args), args.depths, []
    if args.row is not None:  # a timing job measures one row (``main``)
        rows = [rows[args.row]]
    if args.job == "cache":
        depths = depths[:1]
        rows = [r for r in rows if r[1] == "ms" or (r[1] == "zero" and r[2] in args.cache_stages and not r[3])]
    elif args.job == "graphs":
        depths = args.graph_depths or depths[:1]
    emulation = emulation_lines() if args.job == "graphs" else None
    for depth in depths:
        for label, kind, stage, units in rows:
            train = _build_step(kind, stage, units, depth, args.out, args.clip_grad, args.unit_cells)
            entry = {"round": args.round, "depth": depth, "row": label}
            if args.job == "graphs":
                folder = fresh_folder(Path(args.out) / "graphs" / f"rank{rank}" /
                                      f"{depth}_{re.sub(r'[^0-9A-Za-z]+', '_', label)}")
                ms.set_context(save_graphs=1, save_graphs_path=str(folder))
                train(*inputs)
                ms.set_context(save_graphs=0)
                entry.update(graph_size(folder, emulation))
            else:
                entry.update(_time_first(train, inputs, args.steps if args.job == "timing" else 0))
            results.append(entry)
            print(json.dumps(entry), flush=True)
    with open(os.path.join(args.out, f"{args.job}{args.tag}_rank{rank}.json"), "w") as f:
        json.dump(results, f)


# ----------------------------------------------------------------------------- the tables
def _fmt(values, digits=1) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def _row_entries(results: list, rows: list, depths: list):
    """(label, depth, its entries, the first row's entries at that depth) per depth and row that has entries."""
    for depth in depths:
        base = [r for r in results if r["depth"] == depth and r["row"] == rows[0][0]]
        for label, *_ in rows:
            mine = [r for r in results if r["depth"] == depth and r["row"] == label]
            if mine:
                yield label, depth, mine, base


def timing_table(results: list, rows: list, depths: list) -> str:
    """One line per row and depth; the ratios to the first row (``nn.TrainOneStepCell``) pair the
    entries of one round."""
    lines = ["| train step | blocks | first call, wall (s) | first call, CPU (s) | median step (s) | "
             "ratio, wall | ratio, CPU |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label, depth, mine, base in _row_entries(results, rows, depths):
        walls, cpus = [r["first_wall_s"] for r in mine], [r["first_cpu_s"] for r in mine]
        steps = [s for r in mine for s in r["step_s"]]
        ratios = [_fmt([r[key] / b[key] for r, b in zip(mine, base)], 2) if base else "-"
                  for key in ("first_wall_s", "first_cpu_s")]
        step = f"{statistics.median(steps):.3f}" if steps else "-"
        lines.append(f"| {label} | {depth} | {_fmt(walls)} | {_fmt(cpus)} | {step} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


def least_table(results: list, rows: list, depths: list) -> str:
    """One line per row and depth: the least first call over the rounds, and its ratio to the least
    of the first row (``nn.TrainOneStepCell``) at that depth. The least of repeated timings is the one
    a busy moment of the machine did not slow; empty with one round."""
    if len({r["round"] for r in results}) < 2:
        return ""
    lines = ["| train step | blocks | least first call, wall (s) | least first call, CPU (s) | "
             "ratio, wall | ratio, CPU |", "|---|---:|---:|---:|---:|---:|"]
    for label, depth, mine, base in _row_entries(results, rows, depths):
        least = {key: min(r[key] for r in mine) for key in ("first_wall_s", "first_cpu_s")}
        ratios = [f"{least[key] / min(r[key] for r in base):.2f}" if base else "-"
                  for key in ("first_wall_s", "first_cpu_s")]
        lines.append(f"| {label} | {depth} | {least['first_wall_s']:.1f} | {least['first_cpu_s']:.1f} | "
                     f"{ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


def growth_table(results: list, rows: list, depths: list) -> str:
    if len(depths) < 2:
        return ""
    small, big = depths[0], depths[-1]
    lines = [f"| train step | first call at {big} / at {small} blocks, wall (per round) | same, CPU | block ratio |",
             "|---|---:|---:|---:|"]
    for label, *_ in rows:
        a = [r for r in results if r["depth"] == small and r["row"] == label]
        b = [r for r in results if r["depth"] == big and r["row"] == label]
        if a and b:
            wall = _fmt([y["first_wall_s"] / x["first_wall_s"] for x, y in zip(a, b)], 2)
            cpu = _fmt([y["first_cpu_s"] / x["first_cpu_s"] for x, y in zip(a, b)], 2)
            lines.append(f"| {label} | {wall} | {cpu} | {big / small:.2f} |")
    return "\n".join(lines)


def graphs_table(results: list) -> str:
    lines = ["| train step | blocks | nodes after type inference | kernel-graph nodes | of which CPU emulation "
             "(less the stand-in all-reduces) |", "|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['row']} | {r['depth']} | {r['type_inference_nodes']} | {r['kernel_nodes']} | "
                     f"{r['emulation_nodes']} ({r['emulation_extra']}) |")
    return "\n".join(lines)


def sources_table(results: list) -> str:
    """Where the kernel-graph nodes come from (``kernel_graph.table``): one column per train step at
    the first depth of the graph job; "" where no entry has a breakdown (a run before it existed)."""
    depth = results[0]["depth"] if results else None
    columns = [(r["row"], r["kernel_breakdown"]) for r in results if r["depth"] == depth and "kernel_breakdown" in r]
    return kernel_graph.table(columns) if columns else ""


def cache_table(cold: list, warm: list) -> str:
    lines = ["| train step | cold: first call, wall (s) | warm: first call, wall (s) | cold CPU (s) | warm CPU (s) "
             "| same loss |", "|---|---:|---:|---:|---:|---|"]
    for label in dict.fromkeys(r["row"] for r in cold):
        c = [r for r in cold if r["row"] == label]
        w = [r for r in warm if r["row"] == label]
        same = all(a["loss"] == b["loss"] for a, b in zip(c, w))
        lines.append(f"| {label} | {_fmt([r['first_wall_s'] for r in c])} | {_fmt([r['first_wall_s'] for r in w])} "
                     f"| {_fmt([r['first_cpu_s'] for r in c])} | {_fmt([r['first_cpu_s'] for r in w])} | "
                     f"{'yes' if same else 'NO'} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the driver
def mindone_status() -> str:
    """"" when ``mindone.trainers.zero`` imports, else why not."""
    if importlib.util.find_spec("mindone") is None:
        return "MindOne is not installed here (no module named 'mindone'): its rows are skipped."
    try:
        import mindone.trainers.zero  # noqa: F401
    except Exception as err:  # noqa: BLE001 (any failure to import means: skip, saying why)
        return f"MindOne does not import here ({type(err).__name__}: {err}): its rows are skipped."
    return ""


def _job(args, out: Path, job: str, tag: str = "", env=None, depths=None, row=None, round_=0) -> list:
    """One msrun job of the worker: ``job`` at ``depths`` (default ``--depths``), of the row at index
    ``row`` of ``rows_of`` (default every row), its entries marked ``round_``."""
    from tools.dev.launch import run_msrun

    flags = ["--as_worker", "--job", job, "--tag", tag, "--depths", *map(str, depths or args.depths), "--stages",
             *map(str, args.stages), "--round", str(round_), "--steps", str(args.steps)]
    flags += ["--row", str(row)] if row is not None else []
    flags += ["--graph_depths", *map(str, args.graph_depths)] if args.graph_depths else []
    flags += ["--cache_stages", *map(str, args.cache_stages)]
    flags += ["--unit_cells", *args.unit_cells] if args.units else ["--no_units"]
    flags += ["--mindone"] if args.mindone else []
    flags += ["--clip_grad"] if args.clip_grad else []
    run_msrun(Path(__file__), args.world_size, out, flags, timeout=args.timeout_s, caller="benchmark_compile",
              log_dir=out / "msrun_logs" / f"{job}{tag}", env=env)  # [Note: job environment]
    with open(out / f"{job}{tag}_rank0.json") as f:
        return json.load(f)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Writes docs/benchmarks/compile.md.",
                                     epilog="Writes its tables into docs/benchmarks/compile.md (see --docs_dir) "
                                            "and the raw figures into <out>/compile.json.")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--depths", type=int, nargs="+", default=[24, 48], help="blocks of the model")
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3], choices=[0, 1, 2, 3])
    parser.add_argument("--no_units", dest="units", action="store_false", help="skip stage 3 with gather units")
    parser.add_argument("--unit_cells", nargs="+", default=["Block"], metavar="CLASS",
                        help="the classes of stage 3's gather units: Block (the model's block, the default) or "
                             "classes of mindspore.nn, e.g. LayerNorm")
    parser.add_argument("--rounds", type=int, default=1, help="timing rounds (every row once per round, each in a "
                        "new msrun job)")
    parser.add_argument("--steps", type=int, default=3, help="calls after the first; their median is the step")
    parser.add_argument("--clip_grad", action="store_true", help="this library's rows clip by the global norm")
    parser.add_argument("--no_graphs", dest="graphs", action="store_false", help="skip the graph-size job")
    parser.add_argument("--graphs_only", action="store_true", help="run the graph-size job only (no timing, no "
                        "compile cache); with --docs_dir, a page of its tables alone")
    parser.add_argument("--graph_depths", type=int, nargs="+", default=None,
                        help="depths of the graph-size job (default: the first of --depths)")
    parser.add_argument("--cache_rounds", type=int, default=1, help="cold/warm compile-cache rounds; 0 skips")
    parser.add_argument("--cache_stages", type=int, nargs="+", default=[0, 3], choices=[0, 1, 2, 3],
                        help="stages of the compile-cache job (with nn.TrainOneStepCell)")
    parser.add_argument("--out", default="outputs/benchmark_compile", help="raw results and logs")
    parser.add_argument("--docs_dir", default=None, help="where compile.md goes (default docs/benchmarks); the page's "
                        "tables are stamped with the command, UTC date, git commit, MindSpore and Python versions, "
                        "machine and load average")
    parser.add_argument("--timeout_s", type=int, default=1800, help="time limit of each msrun job")
    # worker-only flags
    parser.add_argument("--as_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", default="timing", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    parser.add_argument("--row", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--mindone", action="store_true", help=argparse.SUPPRESS)
    return parser


def render_page(results: dict) -> str:
    """The page's body of ``{"args", "skipped", "rows", "report"}`` (``main`` writes them)."""
    args, rows, report = results["args"], [tuple(r) for r in results["rows"]], results["report"]
    body = [f"N={args['world_size']} ranks on the CPU backend (msrun), rank 0's figures. The model and the rows are "
            "described in `tools/bench/benchmark_compile.py`'s docstring. With several rounds a cell lists "
            "one figure per round, rounds in order. A ratio is the row's first call over the first row's "
            "(`nn.TrainOneStepCell`) at the same depth, in the same round. On a shared machine "
            "the CPU seconds (the rank's process, all threads) move less than the wall seconds. The row "
            "\"stage 3\" gathers per Cell (`gather_units=None`); the library's default (`\"auto\"`) makes "
            "this model's blocks units, the row \"stage 3, gather_units=(Block,)\".",
            results["skipped"] or "MindOne's rows use `mindone.trainers.zero.prepare_train_network`.",
            "## First call and later steps", timing_table(report["timing"], rows, args["depths"])]
    least = least_table(report["timing"], rows, args["depths"])
    if least:
        body += ["## Least over the rounds", "Each row's least first call over the rounds, and its ratio to "
                 "`nn.TrainOneStepCell`'s least at the same depth (the ratio columns): the figures a busy moment "
                 "of the machine slowed least.", least]
    growth = growth_table(report["timing"], rows, args["depths"])
    if growth:
        body += ["## Growth with depth", growth]
    if report.get("graphs"):
        body += ["## Graph size", "Nodes of the saved IR (`MS_DEV_DUMP_IR_PASSES=" + DUMP_PASSES + "`): after type "
                 "inference (every specialised subgraph), and of the final kernel graphs; of the latter, the nodes "
                 "that come from a CPU emulation of a collective the CPU backend lacks (in brackets: less the "
                 "all-reduce standing in for the native collective, i.e. what Ascend would not run).",
                 graphs_table(report["graphs"])]
        sources = sources_table(report["graphs"])
        if sources:
            body += ["## Where the kernel-graph nodes come from",
                     f"{report['graphs'][0]['depth']} blocks. Each kernel-graph node by its op and the part of the "
                     "train step it serves, found from the node's source stack and scope "
                     "(`tools/bench/kernel_graph.py` says how and holds the file-to-part table). A part's first "
                     "line is its total; the last three lines are the step's total, that total less the CPU "
                     "emulation of collectives, and less the emulation but its stand-in all-reduces (one node "
                     "per collective, as where the backend has it).", sources]
    if report.get("cache_cold"):
        body += ["## Restart with the compile cache",
                 f"{args['depths'][0]} blocks. Cold: a new process compiles into an empty `MS_COMPILER_CACHE_PATH`; "
                 "warm: another new process runs the same steps from that folder. Same loss: the first step's loss "
                 "is bit-identical warm and cold.", cache_table(report["cache_cold"], report["cache_warm"])]
    return "\n\n".join(body) + "\n"


def _least_by_row(timing: list, depth: int) -> dict:
    """Each row's least first call (wall seconds) over the rounds at ``depth``."""
    least = {}
    for r in timing:
        if r["depth"] == depth:
            least[r["row"]] = min(least.get(r["row"], r["first_wall_s"]), r["first_wall_s"])
    return least


def intro(results: dict) -> list:
    args, report = results["args"], results["report"]
    timing, depths = report["timing"], args["depths"]
    base_label = results["rows"][0][0]
    small, big = _least_by_row(timing, depths[0]), _least_by_row(timing, depths[-1])
    worst = max((k for k in small if k != base_label), key=lambda k: small[k] / small[base_label], default=None)
    said = (f", the most here {worst} at {small[worst] / small[base_label]:.2f}x (the least of the rounds, "
            f"{depths[0]} blocks)" if worst else "")
    grows = (f"; from {depths[0]} to {depths[-1]} blocks the first call grows about as the depth does "
             f"({big[base_label] / small[base_label]:.2f}x for `{base_label}`, for {depths[-1] / depths[0]:.2f}x "
             "the blocks)" if len(depths) > 1 and base_label in big else "")
    cold = {r["row"]: r["first_wall_s"] for r in report.get("cache_cold") or []}
    warm = {r["row"]: r["first_wall_s"] for r in report.get("cache_warm") or []}
    kept = [warm[k] / cold[k] for k in cold if k in warm]
    cache = (f"; a restart from the compile cache skips most of the compile ({min(kept):.2f}-{max(kept):.2f} of "
             "the cold first call)" if kept else "")
    return [f"How long the first call of the train step (its graph compile and one step) takes at every ZeRO stage "
            f"against MindSpore's own data-parallel `nn.TrainOneStepCell`, at {' and '.join(map(str, depths))} "
            "blocks of a small MLP language model, each row in a new process, with the compiled graph's size and "
            "a restart from the compile cache.",
            f"Expect every stage to cost a small multiple of the data-parallel step's first call{said}{grows}"
            f"{cache}."]


def draw(plt, results: dict):
    from tools.bench import plots

    args, timing = results["args"], results["report"]["timing"]
    depths, labels = args["depths"], [r[0] for r in results["rows"]]
    fig, ax = plt.subplots(figsize=plots.size(1, 3.8))
    step = 0.012 * (max(depths) - min(depths) or 1)  # the rows' ranges side by side, not on top of each other
    for i, label in enumerate(labels):
        mine = [[r["first_wall_s"] for r in timing if r["row"] == label and r["depth"] == d] for d in depths]
        if not all(mine):
            continue
        xs = [d + (i - (len(labels) - 1) / 2) * step for d in depths]
        color = plots.COLORS[i % len(plots.COLORS)]
        ax.plot(xs, [min(v) for v in mine], "o-", color=color, label=label)
        ax.vlines(xs, [min(v) for v in mine], [max(v) for v in mine], color=color, alpha=0.4, linewidth=4)
    ax.set_xticks(depths)
    ax.set_xlabel("blocks")
    ax.set_ylabel("first call, wall seconds")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    plots.legend_below(ax, 3)
    ax.set_title(f"compile time against depth, N={args['world_size']}: least over {args['rounds']} round(s), "
                 "bars from least to most")
    return fig


PAGE = Page("compile", "Time to first step (compile)", intro, render_page, draw,
            "the first call of each train step against the model's depth (the least of the rounds, and their range).")


def main(argv=None) -> int:
    from tools.bench.pages import publish  # reads the load average at the start (tools/bench/report.py)

    parser = _parser()
    args = parser.parse_args(argv)
    for name in ("world_size", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"argument --{name}: must be >= 1, got {getattr(args, name)}")
    if args.steps < 0 or args.cache_rounds < 0 or min(args.depths + (args.graph_depths or [])) < 1:
        parser.error("--steps and --cache_rounds must be >= 0, --depths and --graph_depths >= 1")
    try:
        unit_classes(args.unit_cells)
    except ValueError as e:
        parser.error(f"argument --unit_cells: {e}")
    if args.graphs_only and not args.graphs:
        parser.error("--graphs_only runs the graph-size job that --no_graphs skips: give one of them")
    if args.as_worker:
        worker(args)
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    skipped = mindone_status()
    args.mindone = not skipped
    rows = rows_of(args)
    timed = range(0 if args.graphs_only else args.rounds)
    report = {"timing": [entry for round_ in timed for depth in args.depths for row in range(len(rows))
                         for entry in _job(args, out, "timing", f"_r{round_}_d{depth}_{row}", depths=[depth], row=row,
                                           round_=round_)]}
    if args.graphs:
        report["graphs"] = _job(args, out, "graphs", env={"MS_DEV_DUMP_IR_PASSES": DUMP_PASSES})
    report["cache_cold"], report["cache_warm"] = [], []
    for k in range(0 if args.graphs_only else args.cache_rounds):
        cache = fresh_folder(out / f"compile_cache_{k}")
        env = {"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(cache)}
        for tag, key in (("_cold", "cache_cold"), ("_warm", "cache_warm")):
            report[key] += [dict(r, round=k) for r in _job(args, out, "cache", f"{tag}{k}", env)]
    (out / "compile.json").write_text(json.dumps(report, indent=1))
    results = {"args": {k: getattr(args, k) for k in ("world_size", "depths", "stages", "units", "unit_cells", "rounds",
                                                      "steps", "graph_depths", "cache_rounds", "cache_stages")},
               "skipped": skipped, "rows": [list(r) for r in rows], "report": report}
    print(render_page(results))
    page = publish(PAGE, results, out_dir=args.docs_dir,
                   command=["python", "tools/bench/benchmark_compile.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"\nwrote {page} and {out / 'compile.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
