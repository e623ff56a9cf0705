"""msrun worker: every GroupComm method on the world group and a sub-group, in GRAPH_MODE and
PYNATIVE_MODE, float32 and float16. Each rank writes ``comm_<MODE>_rank<r>.npz`` under --out;
tests/dist/test_comm.py checks the results against numpy references.
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from mindspore.communication import create_group, get_group_size, get_rank, init  # noqa: E402

import comm_cases as cases  # noqa: E402
from mindone_zero.core.comm import GroupComm  # noqa: E402


class AllCollectives(nn.Cell):
    """Calls every GroupComm method once, in a fixed order on every rank (they are collective)."""

    def __init__(self, group):
        super().__init__()
        self.comm = GroupComm(group)

    def construct(self, x, z, y):
        return (
            self.comm.all_reduce(x),
            self.comm.all_reduce_mean(x),
            self.comm.reduce_scatter(z),
            self.comm.all_gather(y),
            self.comm.broadcast(x, 0),
            self.comm.broadcast(x, 1),
        )


def run_mode(mode: str, names: dict, world_size: int, world_rank: int, out: Path) -> None:
    ms.set_context(mode=getattr(ms, f"{mode}_MODE"))
    results = {}
    for kind, group in names.items():
        net = AllCollectives(group)
        group_size = len(cases.members(world_size, kind, world_rank))
        for dtype in cases.DTYPES:
            x, z, y = cases.inputs(mode, kind, dtype, world_rank, group_size)
            outs = net(Tensor(x), Tensor(z), Tensor(y))
            for op, value in zip(cases.OPS, outs):
                results[cases.result_key(kind, dtype, op)] = value.asnumpy()
    final = out / cases.result_file(mode, world_rank)
    tmp = out / (final.name + ".tmp.npz")
    np.savez(tmp, **results)
    os.replace(tmp, final)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ms.set_device("CPU")
    init()
    world_size, world_rank = get_group_size(), get_rank()
    names = {"world": None}
    sub_name = cases.group_name(world_size, "sub", world_rank)
    create_group(sub_name, cases.members(world_size, "sub", world_rank))
    names["sub"] = sub_name
    for mode in cases.MODES:
        run_mode(mode, names, world_size, world_rank, args.out)


if __name__ == "__main__":
    main()
