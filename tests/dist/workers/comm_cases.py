"""Cases shared by comm_worker.py (which runs them) and test_comm.py (which checks them).

numpy only, so that pytest can rebuild every rank's inputs without importing MindSpore.
"""
import numpy as np

SEED = 20240531
MODES = ("GRAPH", "PYNATIVE")
DTYPES = ("float32", "float16")
OPS = ("all_reduce", "all_reduce_mean", "reduce_scatter", "all_gather", "broadcast_root0", "broadcast_root1")


def groups(world_size: int):
    """{kind: [world ranks of each group of that kind]}.

    "world" is the world group. "sub" is a named sub-group: at N=4 two groups {0,1} and {2,3};
    at N=2 one group of both ranks under a name other than the world group's, which takes the
    CPU backend's emulation path for all-gather and broadcast.
    """
    if world_size == 2:
        sub = [[0, 1]]
    elif world_size == 4:
        sub = [[0, 1], [2, 3]]
    else:
        raise ValueError(f"For 'groups', the argument 'world_size' must be 2 or 4, but got {world_size}.")
    return {"world": [list(range(world_size))], "sub": sub}


def members(world_size: int, kind: str, world_rank: int):
    """World ranks of the group of ``kind`` that ``world_rank`` belongs to."""
    return next(g for g in groups(world_size)[kind] if world_rank in g)


def group_name(world_size: int, kind: str, world_rank: int) -> str:
    return "sub_" + "_".join(str(r) for r in members(world_size, kind, world_rank))


def inputs(mode: str, kind: str, dtype: str, world_rank: int, group_size: int):
    """(x, z, y) of ``world_rank``: x (4, 3) for all-reduce and broadcast, z (2 * group_size, 3)
    for reduce-scatter, y (3, 5) blocks for all-gather; random, different on every rank and case."""
    key = [SEED, MODES.index(mode), ("world", "sub").index(kind), DTYPES.index(dtype), world_rank]
    rng = np.random.default_rng(key)
    x = rng.standard_normal((4, 3))
    z = rng.standard_normal((2 * group_size, 3))
    y = rng.standard_normal((3, 5))
    return tuple(a.astype(dtype) for a in (x, z, y))


def result_file(mode: str, world_rank: int) -> str:
    return f"comm_{mode}_rank{world_rank}.npz"


def result_key(kind: str, dtype: str, op: str) -> str:
    return f"{kind}.{dtype}.{op}"
