"""msrun worker for tests/dist/test_group_names_job.py: the real ``create_hybrid_groups`` on the CPU backend.

Usage (under msrun, N=4): groups_worker.py --out DIR --cases '["run"]'
Every rank, in the same order: the bad sizes (each must raise before creating anything), then sizes
2 (twice), 1 and N; for each returned group, the backend's member list and an all-gather of the
world ranks over it (the group as the collectives run it). Writes DIR/groups_rank{r}.json
({name: world ranks}, for the job-wide name check) and DIR/report_rank{r}.json.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import mindspore as ms  # noqa: E402
from mindspore import Tensor  # noqa: E402

from msrun_harness import worker_args  # noqa: E402
from mindone_zero import create_hybrid_groups  # noqa: E402
from mindone_zero.core.comm import GroupComm, check_hybrid_groups, group_members, init_data_parallel, world_group  # noqa: E402,E501
from mindone_zero.core.groups import created_groups  # noqa: E402

BAD_SIZES = (0, 3, 8, True, "2", 2.5)


def _error_of(fn):
    try:
        fn()
    except (TypeError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def _gathered_ranks(group, rank):
    """World ranks of ``group``'s members in group-rank order, as an all-gather over it returns them."""
    out = GroupComm(group).all_gather(Tensor(np.array([rank], np.float32)))
    return [int(v) for v in out.asnumpy()]


def main():
    out, _ = worker_args()
    rank, world = init_data_parallel()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    report = {"bad": {repr(b): _error_of(lambda b=b: create_hybrid_groups(b)) for b in BAD_SIZES},
              "created_after_bad": created_groups()}
    pairs = {"two": create_hybrid_groups(2)}
    report["created_after_two"] = created_groups()
    pairs["two_again"] = create_hybrid_groups(2)
    report["created_after_two_again"] = created_groups()
    pairs["one"] = create_hybrid_groups(1)
    pairs["world"] = create_hybrid_groups(world)
    report["pairs"] = pairs
    report["check"] = {k: _error_of(lambda p=p: check_hybrid_groups("groups_worker", *p)) for k, p in pairs.items()}
    # by role (shard of 2, replica of 2, shard of 1, world), so that every rank gathers in the same order
    names = list(dict.fromkeys(name for pair in pairs.values() for name in pair if name is not None))
    report["gathered"] = {name: _gathered_ranks(name, rank) for name in names}
    report["created"] = created_groups()
    with open(os.path.join(out, f"report_rank{rank}.json"), "w") as f:
        json.dump(report, f)
    with open(os.path.join(out, f"groups_rank{rank}.json"), "w") as f:
        json.dump({name: group_members(name) for name in dict.fromkeys([world_group(), *names])}, f)


if __name__ == "__main__":
    main()
