"""For developers: does this backend fuse collectives that carry MindSpore's ``fusion`` attribute?

    python tools/dev/comm_fusion_probe.py                     # CPU, 2 ranks, this machine
    python tools/dev/comm_fusion_probe.py --device Ascend --nproc 8

Issue 58's step 5 asks how to send a group of parameters in one collective without packing them
into a buffer in our own graph. One way is MindSpore's: give each member's collective the same
``fusion`` id (``prim.add_prim_attr("fusion", k)``) and let the backend's fusion passes merge them
(``AllReduceFusion``, ``AllGatherFusion``, ``ReduceScatterFusion`` in MindSpore's
``backend/common/pass/communication_op_fusion.cc``). This probe compiles, in GRAPH_MODE under
msrun, one step of ``MEMBERS`` all-gathers, all-reduces and (where the backend has it natively)
reduce-scatters of small tensors in three ways: no ``fusion`` attribute, every collective with
``fusion=1``, and ``fusion=1`` with the parallel context's ``comm_fusion`` switched on for the three
ops (what MindSpore's Ascend backend reads before it adds the passes). For each way it prints how
many of each collective the final kernel graph (``hwopt_common_final_graph``) holds, and checks the
outputs against numpy, so a fused graph that computes something else fails.

On the CPU backend of MindSpore 2.10 (2026-12-07, 2 ranks) the attribute alone fuses nothing (4
all-gathers and 4 all-reduces stay); with ``comm_fusion`` on, the 4 all-reduces become 1 and the 4
all-gathers stay 4 (CPU has no native reduce-scatter to probe). Read from MindSpore's source, not
measured here (no accelerator): the GPU pipeline adds ``AllReduceFusion`` and ``AllGatherFusion`` to
every graph, the Ascend pipeline the three passes when ``comm_fusion`` says so. Prints one table;
exits 1 if an output is wrong.
"""
import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench.kernel_graph import op_of  # noqa: E402

MEMBERS = 4
WAYS = ("no fusion attribute", "fusion=1", "fusion=1, comm_fusion on")
COLLECTIVES = ("AllGather", "AllReduce", "ReduceScatter")
_COMM_FUSION = {op: {"mode": "auto", "config": None} for op in ("allreduce", "allgather", "reducescatter")}


def count_collectives(ir_text: str) -> dict:
    """How many nodes of each of ``COLLECTIVES`` a saved kernel-graph IR holds."""
    ops = Counter(op_of(line) for line in ir_text.splitlines() if line.startswith("  %") and ") = " in line)
    return {name: ops.get(name, 0) for name in COLLECTIVES}


def _step(way: int, native_rs: bool):
    from mindspore import nn, ops

    class Step(nn.Cell):
        def __init__(self):
            super().__init__()
            self.gathers = [ops.AllGather() for _ in range(MEMBERS)]
            self.reduces = [ops.AllReduce() for _ in range(MEMBERS)]
            self.scatters = [ops.ReduceScatter() for _ in range(MEMBERS)] if native_rs else []
            for prim in self.gathers + self.reduces + self.scatters:
                if way > 0:
                    prim.add_prim_attr("fusion", 1)

        def construct(self, *xs):
            out = ()
            for i in range(len(self.gathers)):
                out = out + (self.gathers[i](xs[i]),)
            for i in range(len(self.reduces)):
                out = out + (self.reduces[i](xs[i]),)
            for i in range(len(self.scatters)):
                out = out + (self.scatters[i](xs[i]),)
            return out

    return Step()


def worker(out: Path, device: str) -> None:
    """One rank: each way compiled and run once; writes ``probe_rank<r>.json``."""
    import numpy as np
    import mindspore as ms

    from mindone_zero.core.comm import backend_has_native, init_data_parallel, world_group

    rank, size = init_data_parallel(device)
    ms.set_context(mode=ms.GRAPH_MODE)
    native_rs = backend_has_native("reduce_scatter", world_group())
    os.environ["MS_DEV_DUMP_IR_PASSES"] = "hwopt_common_final_graph"
    # member i's input on rank r is filled with 10 i + r; every rank's inputs give the expected outputs
    inputs = [[np.full((size, 3), 10 * i + r, np.float32) for r in range(size)] for i in range(MEMBERS)]
    want = [np.concatenate(m) for m in inputs] + [sum(m) for m in inputs]
    if native_rs:
        want += [sum(m)[rank:rank + 1] for m in inputs]
    rows = []
    for way, label in enumerate(WAYS):
        if way == 2:
            ms.set_auto_parallel_context(comm_fusion=_COMM_FUSION)
        folder = out / f"ir_rank{rank}_way{way}"
        ms.set_context(save_graphs=1, save_graphs_path=str(folder))
        got = [o.asnumpy() for o in _step(way, native_rs)(*[ms.Tensor(m[rank]) for m in inputs])]
        ms.set_context(save_graphs=0)
        counts = Counter()
        for path in folder.rglob("hwopt_common_final_graph*.ir"):
            counts.update(count_collectives(path.read_text(errors="replace")))
        right = len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))
        rows.append({"way": label, **{k: counts.get(k, 0) for k in COLLECTIVES}, "outputs right": right})
    ms.reset_auto_parallel_context()
    (out / f"probe_rank{rank}.json").write_text(json.dumps({"device": device, "native_reduce_scatter": native_rs,
                                                            "members": MEMBERS, "rows": rows}))


def table(record: dict) -> str:
    """The printed table of one rank's record."""
    lines = [f"{record['members']} of each collective, device {record['device']}"
             + ("" if record["native_reduce_scatter"] else " (no native ReduceScatter: not probed)"),
             "| way | " + " | ".join(COLLECTIVES) + " | outputs right |", "|---|" + "---:|" * len(COLLECTIVES) + "---|"]
    for row in record["rows"]:
        lines.append(f"| {row['way']} | " + " | ".join(str(row[k]) for k in COLLECTIVES)
                     + f" | {'yes' if row['outputs right'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="CPU", choices=("CPU", "GPU", "Ascend"))
    parser.add_argument("--nproc", type=int, default=2, help="ranks (msrun workers), >= 2")
    parser.add_argument("--out", default="outputs/comm_fusion_probe")
    parser.add_argument("--rank_job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    if args.rank_job:
        worker(out, args.device)
        return 0
    if args.nproc < 2:
        parser.error(f"the argument '--nproc' must be >= 2 (a group of one sends nothing), but got {args.nproc}")
    from tools.dev.launch import run_msrun

    run_msrun(Path(__file__), args.nproc, out, ["--rank_job", "--device", args.device], timeout=600,
              caller="comm_fusion_probe")
    record = json.loads((out / "probe_rank0.json").read_text())
    print(table(record))
    return 0 if all(row["outputs right"] for row in record["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
