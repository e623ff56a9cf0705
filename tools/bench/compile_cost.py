"""For benchmarking: writes ``docs/benchmarks/<name>.md``, its figure ``<name>.svg`` and its raw
results ``<name>.json`` (``tools/bench/pages.py``).

What the train step costs to compile, and the graph idioms that decide it.

    python tools/bench/compile_cost.py                   # the idioms (one process), then the train step at N=2
    python tools/bench/compile_cost.py --world_size 0    # the idioms only

Idioms, one process, GRAPH_MODE, CPU seconds of a Cell's first call (compile and run) above an
empty Cell's, the least of ``--repeats`` fresh instances:

* 20 slices of one tensor at different offsets: ``ops.narrow`` against ``mindone_zero``'s ``narrow``
  ([Note: compiling a narrow] in ``mindone_zero/core/slicing.py``);
* one pass that scales each of n tensors (n = 8 and 64): a loop that grows a tuple, a comprehension,
  and ``hyper_map`` ([Note: per-tensor maps] in ``mindone_zero/core/graph_tuples.py``);
* cutting the 98 tensors of ``tools/bench/benchmark_compile.py``'s 24-block model out of one flat buffer,
  laid out by shape, and assigning them to parameters: one Slice per tensor (``narrow_each``) against
  runs of equal tensors (``narrow_runs``; [Note: runs of pieces] in ``mindone_zero/core/slicing.py``).

Train step, an msrun job of ``--world_size`` ranks on the Dense stack of ``tools/bench/dense_model.py``
(``--layers`` x Dense(``--width``): 2 x layers parameters): the CPU seconds of the first call of
``prepare_train_network``'s train step at stages 0-3, with one micro-step and with two plus clipping,
against ``nn.TrainOneStepCell`` on the same network: under ``DATA_PARALLEL`` (set by ``init_data_parallel``)
it all-reduces the gradients through ``nn.DistributedGradReducer``, so it is MindSpore's own data-parallel
step, which shards nothing: the floor of a ZeRO step (``tools/dev/compile_census.py``'s ``--floor_s``).
Rank 0's figures. Writes ``compile_cost.json`` into ``--out`` and prints the tables.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # MindSpore: errors only; must precede its import (an importer keeps its own)
    os.environ.setdefault("GLOG_v", "3")
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from mindone_zero.core.graph_tuples import hyper_map  # noqa: E402
from mindone_zero.core.slicing import narrow, narrow_args, narrow_each, narrow_runs, run_args  # noqa: E402
from tools.bench.pages import Page, publish  # noqa: E402
from tools.bench.report import add_docs_flag  # noqa: E402

SLICES = 20
PASS_SIZES = (8, 64)
STEP_CASES = ((1, False), (2, True))  # (micro-steps, clip)


class _Empty(nn.Cell):
    def construct(self, xs):
        return xs


class _Slices(nn.Cell):
    """``SLICES`` slices of width 3 of a (4, SLICES + 2) tensor, through ``cut``."""

    def __init__(self, cut):
        super().__init__()
        self.cut = cut

    def construct(self, x):
        out = ()
        for i in range(SLICES):
            out += (self.cut(x, 1, i, 3),)
        return out


_scale = ops.MultitypeFuncGraph("scale")


@_scale.register("Tensor", "Tensor")
def _scale_tensor(s, x):
    return x * ops.cast(s, x.dtype)


class _Loop(nn.Cell):
    def construct(self, xs, s):
        out = ()
        for x in xs:
            out += (x * ops.cast(s, x.dtype),)
        return out


class _Comprehension(nn.Cell):
    def construct(self, xs, s):
        return tuple([x * ops.cast(s, x.dtype) for x in xs])


class _HyperMap(nn.Cell):
    def construct(self, xs, s):
        return hyper_map(ops.partial(_scale, s), xs)


# the 24-block model's tensors (tools/bench/benchmark_compile.py), by shape
CUT_SHAPES = sorted([(64, 96), (64, 96)] + [(96,)] * 48 + [(256, 96)] * 24 + [(96, 256)] * 24)

_assign = ops.MultitypeFuncGraph("assign")


@_assign.register("Tensor", "Tensor")
def _assign_tensor(p, x):
    return ops.assign(p, x)


class _Cut(nn.Cell):
    """Cuts ``CUT_SHAPES`` out of a flat buffer (one Slice each, or in runs) and assigns them to parameters."""

    def __init__(self, runs: bool):
        super().__init__()
        numels = [int(np.prod(s)) for s in CUT_SHAPES]
        offsets = [int(o) for o in np.cumsum([0] + numels[:-1])]
        self.params = ms.ParameterTuple([ms.Parameter(Tensor(np.zeros(s, np.float32)), name=f"p{i}")
                                         for i, s in enumerate(CUT_SHAPES)])
        self.runs = run_args((sum(numels),), 0, offsets, numels, CUT_SHAPES) if runs else None
        self.cuts = narrow_args((sum(numels),), 0, offsets, numels) + (tuple(CUT_SHAPES),)

    def construct(self, x):
        if self.runs is not None:
            return hyper_map(_assign, self.params, narrow_runs(x, self.runs, 0))
        return hyper_map(_assign, self.params, narrow_each(x, *self.cuts))


def _first_call_cpu(cell, *args) -> float:
    start = time.process_time()
    cell(*args)
    return time.process_time() - start


def _least(build, args, repeats: int) -> float:
    return min(_first_call_cpu(build(), *args) for _ in range(repeats))


def measure_idioms(repeats: int) -> dict:
    """CPU seconds above an empty Cell's of each idiom ({"narrow": {...}, "pass_8": {...}, ...})."""
    ms.set_context(mode=ms.GRAPH_MODE)
    x = Tensor(np.arange(4 * (SLICES + 2), dtype=np.float32).reshape(4, SLICES + 2))
    _first_call_cpu(_Empty(), x)  # the process's first compile carries one-time costs
    base = _least(_Empty, (x,), repeats)
    out = {"narrow": {"ops.narrow": _least(lambda: _Slices(ops.narrow), (x,), repeats) - base,
                      "mindone_zero narrow": _least(lambda: _Slices(narrow), (x,), repeats) - base}}
    for n in PASS_SIZES:
        xs = tuple(Tensor(np.ones((i % 5 + 1, 3), np.float32)) for i in range(n))
        s = Tensor(2.0, ms.float32)
        empty = _least(_Empty, (xs,), repeats)
        out[f"pass_{n}"] = {name: _least(cls, (xs, s), repeats) - empty
                            for name, cls in (("loop", _Loop), ("comprehension", _Comprehension),
                                              ("hyper_map", _HyperMap))}
    flat = Tensor(np.zeros(sum(int(np.prod(s)) for s in CUT_SHAPES), np.float32))
    empty = _least(_Empty, (flat,), repeats)
    out["cut"] = {name: _least(lambda: _Cut(runs), (flat,), repeats) - empty
                  for name, runs in (("a Slice per tensor", False), ("runs", True))}
    return out


def _step_worker(args) -> None:
    """Under msrun: the first-call CPU seconds of each train step; writes step_rank{r}.json."""
    from mindone_zero import prepare_train_network
    from mindone_zero.core.comm import init_data_parallel
    from tools.bench.dense_model import DenseLoss, build_dense, dense_batch

    rank, world = init_data_parallel()
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = dense_batch(0, 0, 2 * world, args.width)
    inputs = (Tensor(x[2 * rank:2 * rank + 2]), Tensor(y[2 * rank:2 * rank + 2]))

    def loss_net():
        return DenseLoss(build_dense(args.layers, args.width, seed=0))

    net = loss_net()
    _first_call_cpu(nn.TrainOneStepCell(net, nn.Momentum(net.trainable_params(), 0.01, 0.9)), *inputs)  # warm-up
    net = loss_net()
    results = {"nn.TrainOneStepCell": _first_call_cpu(
        nn.TrainOneStepCell(net, nn.Momentum(net.trainable_params(), 0.01, 0.9)), *inputs)}
    for stage in range(4):
        for accum, clip in STEP_CASES:
            net = loss_net()
            train = prepare_train_network(net, nn.Momentum(net.trainable_params(), 0.01, 0.9), zero_stage=stage,
                                          gradient_accumulation_steps=accum, clip_grad=clip,
                                          params_split_info=os.path.join(args.out, "split_info"))
            train.set_train(True)
            key = f"stage {stage}, {accum} micro-step{'s' if accum > 1 else ''}{', clip' if clip else ''}"
            results[key] = _first_call_cpu(train, *inputs)
    with open(os.path.join(args.out, f"step_rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _table(rows: dict, columns, header: str) -> str:
    lines = [f"| {header} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, values in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{values[c]:.2f}" for c in columns) + " |")
    return "\n".join(lines)


def render(report: dict) -> str:
    """The page's tables of ``{"args", "idioms", "train_step"}`` (``train_step`` absent with
    ``--world_size 0``)."""
    idioms, args = report["idioms"], report["args"]
    page = ["Compile CPU seconds above an empty Cell (one process):", "",
            _table({"20 slices": idioms["narrow"]}, list(idioms["narrow"]), "idiom"), "",
            _table({f"{n} tensors": idioms[f"pass_{n}"] for n in PASS_SIZES}, ["loop", "comprehension", "hyper_map"],
                   "one pass over"), "",
            _table({f"{len(CUT_SHAPES)} tensors of {len(set(CUT_SHAPES))} shapes": idioms["cut"]}, list(idioms["cut"]),
                   "cut out of a buffer and assigned")]
    if report.get("train_step"):
        page += ["", f"First call of the train step, CPU seconds (compile and one step), rank 0 of "
                 f"{args['world_size']}, {args['layers']} x Dense({args['width']}):", "",
                 _table({k: {"CPU s": v} for k, v in report["train_step"].items()}, ["CPU s"], "train step")]
    return "\n".join(page)


def intro(report: dict) -> list:
    steps = report.get("train_step") or {}
    base = steps.get("nn.TrainOneStepCell")
    worst = max(((k, v) for k, v in steps.items() if k != "nn.TrainOneStepCell"), key=lambda kv: kv[1], default=None)
    said = (f"; the train step costs {steps[worst[0]] / base:.1f}x `nn.TrainOneStepCell`'s at most ({worst[0]})"
            if base and worst else "")
    return ["The CPU seconds MindSpore spends compiling a few graph idioms the library is built from, and the "
            "first call (compile and one step) of the library's train step at every stage against MindSpore's own "
            "data-parallel `nn.TrainOneStepCell` on the same network.",
            "Expect the idioms the library uses (its `narrow`, `hyper_map`, runs of equal slices) to compile in a "
            "fraction of the time of the plain ones, whose cost grows with the number of tensors, and every stage "
            "to cost more than the data-parallel step, more with accumulation and clipping and most at stage 3, "
            f"which gathers and scatters every layer{said}."]


def draw(plt, report: dict):
    from tools.bench import plots

    idioms, steps = report["idioms"], report.get("train_step") or {}
    fig, (left, right) = plt.subplots(1, 2, figsize=plots.size(1, 3.6), gridspec_kw={"width_ratios": [1, 1.2]})
    names = ["20 slices"] + [f"pass over {n}" for n in PASS_SIZES] + [f"cut {len(CUT_SHAPES)} tensors"]
    groups = [idioms["narrow"]] + [idioms[f"pass_{n}"] for n in PASS_SIZES] + [idioms["cut"]]
    plain = [g.get("ops.narrow", g.get("comprehension", g.get("a Slice per tensor"))) for g in groups]
    loop = [g.get("loop") for g in groups]
    ours = [g.get("mindone_zero narrow", g.get("hyper_map", g.get("runs"))) for g in groups]
    plots.hbars(left, names, {"plain (ops.narrow, comprehension, a Slice each)": plain, "loop": loop,
                              "the library's (narrow, hyper_map, runs)": ours}, "compile CPU seconds")
    plots.legend_below(left, 1)
    left.set_title("graph idioms")
    if steps:
        plots.hbars(right, list(steps), {"first call": list(steps.values())}, "CPU seconds (compile + one step)",
                    colors=plots.COLORS[3:])
        right.set_title(f"train step, {report['args']['layers']} x Dense({report['args']['width']})")
    else:
        right.set_axis_off()
    return fig


PAGE = Page("compile_cost", "What the train step costs to compile", intro, render, draw,
            "compile seconds of the graph idioms (left) and the first call of each train step (right).")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--world_size", type=int, default=2, help="ranks of the train-step job; 0 skips it")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None, help="folder for compile_cost.json (default: a temporary one)")
    parser.add_argument("--as_step_worker", action="store_true", help=argparse.SUPPRESS)
    add_docs_flag(parser, "compile_cost")
    args = parser.parse_args(argv)
    for name in ("world_size", "layers", "width", "repeats"):
        value = getattr(args, name)
        if value < (0 if name == "world_size" else 1):
            parser.error(f"argument --{name}: must be >= {0 if name == 'world_size' else 1}, got {value}")
    if args.as_step_worker:
        _step_worker(args)
        return
    ms.set_device("CPU")
    out = Path(args.out or tempfile.mkdtemp(prefix="compile_cost_"))
    out.mkdir(parents=True, exist_ok=True)
    report = {"args": {k: getattr(args, k) for k in ("world_size", "layers", "width", "repeats")},
              "idioms": measure_idioms(args.repeats)}
    print(render(report), flush=True)
    if args.world_size:
        from tools.dev.launch import run_msrun

        run_msrun(Path(__file__), args.world_size, out, ["--as_step_worker", "--layers", str(args.layers), "--width",
                                                         str(args.width)], timeout=1200, caller="compile_cost")
        with open(out / "step_rank0.json") as f:
            report["train_step"] = json.load(f)
        print(render(report).split("First call")[-1])
    with open(out / "compile_cost.json", "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {out / 'compile_cost.json'}")
    if args.docs:
        print(f"page: {publish(PAGE, report, out_dir=args.docs)}")


if __name__ == "__main__":
    main()
