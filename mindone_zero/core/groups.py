"""Hybrid groups: shard within a node, replicate across nodes, under names unique across the job.

[Note: group names]
HCCL and NCCL identify a communication group by its name across the whole job: the ranks of a
new group exchange its root info under that name (MindSpore's ``ms_collective_comm_lib.cc``,
``QueryUniqueID``). Two groups created under one name on different rank sets (``"shard"`` as ranks
[0, 1] on one node and [2, 3] on the other) then collide: a rank gets the wrong communicator, or
the job hangs. MindSpore's CPU backend exchanges no root info, so it runs such a job without
complaint. Every name created here therefore encodes its member ranks, and so names one rank set
wherever it is used: ``zero_shard_0_1`` / ``zero_replica_0_2`` list the members (up to
``_LISTED_MEMBERS`` of them); a larger group, whose members always step evenly, is named by its
first and last rank and the step, ``zero_replica_3_to_63_by_4``, so a name stays short however
large the job is. The two forms cannot meet: the second holds words, the first only numbers.
"""
from numbers import Integral
from typing import Dict, List, Optional, Tuple

from mindspore.communication import create_group, get_group_size, get_rank

from .comm import world_group

__all__ = ["create_hybrid_groups", "hybrid_group_members", "hybrid_group_names", "created_groups",
           "SHARD_PREFIX", "REPLICA_PREFIX"]

SHARD_PREFIX = "zero_shard"
REPLICA_PREFIX = "zero_replica"
_LISTED_MEMBERS = 8
_CREATED: Dict[str, Tuple[int, ...]] = {}  # name -> member world ranks, of the groups this process created


def _check_shard_size(where: str, shard_size, world_size: int) -> None:
    if isinstance(shard_size, bool) or not isinstance(shard_size, Integral) or shard_size < 1:
        raise ValueError(f"For '{where}', the argument 'shard_size' must be an integer >= 1, but got {shard_size!r}.")
    if world_size % shard_size:
        raise ValueError(f"For '{where}', the argument 'shard_size' must divide the world size {world_size}, "
                         f"but got {shard_size}.")


def _group_name(prefix: str, members: List[int]) -> str:
    if len(members) <= _LISTED_MEMBERS:
        return "_".join([prefix, *map(str, members)])
    return f"{prefix}_{members[0]}_to_{members[-1]}_by_{members[1] - members[0]}"


def _members(where: str, shard_size, world_size: int, rank) -> Tuple[List[int], List[int]]:
    _check_shard_size(where, shard_size, world_size)
    if isinstance(rank, bool) or not isinstance(rank, Integral) or not 0 <= rank < world_size:
        raise ValueError(f"For '{where}', the argument 'rank' must be an integer in [0, {world_size}), "
                         f"but got {rank!r}.")
    shard_size, rank = int(shard_size), int(rank)
    first = rank - rank % shard_size
    return list(range(first, first + shard_size)), list(range(rank % shard_size, world_size, shard_size))


def _names(where: str, shard_size, world_size: int, rank) -> Tuple[str, Optional[str]]:
    shard, replica = _members(where, shard_size, world_size, rank)
    if shard_size == world_size:
        return world_group(), None
    if shard_size == 1:
        return _group_name(SHARD_PREFIX, shard), world_group()
    return _group_name(SHARD_PREFIX, shard), _group_name(REPLICA_PREFIX, replica)


def hybrid_group_members(shard_size: int, world_size: int, rank: int) -> Tuple[List[int], List[int]]:
    """(shard members, replica members): the world ranks of ``rank``'s two groups, in ascending
    order, which is their group-rank order (pure arithmetic, not collective). The shard group is the
    ``shard_size`` consecutive ranks ``rank`` falls among (a node, when a node holds ``shard_size``
    devices); the replica group is the ranks that hold the same index in their own shard group.

    Raises:
        ValueError: if ``shard_size`` is not an integer >= 1 dividing ``world_size``, or ``rank``
            is not a rank of the job.
    """
    return _members("hybrid_group_members", shard_size, world_size, rank)


def hybrid_group_names(shard_size: int, world_size: int, rank: int) -> Tuple[str, Optional[str]]:
    """(optimizer_parallel_group, dp_group): the names ``create_hybrid_groups`` gives ``rank``'s groups
    (pure, not collective). With ``shard_size == world_size``, the world group's name and None; with
    ``shard_size == 1``, a one-rank shard group and the world group's name.

    Raises:
        ValueError: as ``hybrid_group_members``.
    """
    return _names("hybrid_group_names", shard_size, world_size, rank)


def create_hybrid_groups(shard_size: int) -> Tuple[str, Optional[str]]:
    """Create this rank's shard and replica groups for hybrid sharding (HSDP; MindOne's
    ``optimizer_parallel_group`` + ``dp_group``) and return their names.

    Collective: every rank of the job calls it, with the same ``shard_size`` and in the same order
    relative to its other group creations, after ``mindspore.communication.init()``. ZeRO shards
    over the ``shard_size`` consecutive ranks of the shard group (put it within a node, where the
    links are fast) and all-reduces across the replica group. Names are unique across the job
    ([Note: group names]); a second call with the same size returns the same names and creates
    nothing.

    With ``shard_size`` equal to the world size there is nothing to replicate: the world group's
    name and None are returned (what ``prepare_train_network`` takes by default) and no group is
    created. With ``shard_size == 1`` nothing is sharded: each rank's shard group is itself alone
    and the replica group is the world group (no group of every rank is created under a second
    name).

    Args:
        shard_size: ranks per shard group, an integer >= 1 dividing the world size.

    Returns:
        (optimizer_parallel_group, dp_group): names to pass to ``prepare_train_network``.

    Raises:
        ValueError: naming 'shard_size' and its value if it is not an integer >= 1 dividing the
            world size (a bool is refused); raised before any group is created.

    Examples:
        On 8 ranks, 4 per shard group: rank 5 shards over ranks 4-7 and all-reduces with rank 1
        (tests/dist/test_zero_parity.py trains with such groups; tests/unit/test_groups.py checks
        the names):

        >>> init()
        >>> op_group, dp_group = create_hybrid_groups(4)
        >>> op_group, dp_group
        ('zero_shard_4_5_6_7', 'zero_replica_1_5')
        >>> train_net = prepare_train_network(loss_net, optimizer, zero_stage=3,
        ...                                   optimizer_parallel_group=op_group,
        ...                                   dp_group=dp_group)
    """
    world, rank = get_group_size(), get_rank()
    names = _names("create_hybrid_groups", shard_size, world, rank)  # validates before anything is created
    for name, members in zip(names, _members("create_hybrid_groups", shard_size, world, rank)):
        if name is None or name == world_group() or name in _CREATED:
            continue
        create_group(name, members)
        _CREATED[name] = tuple(members)
    return names


def created_groups() -> Dict[str, List[int]]:
    """{name: member world ranks} of the groups ``create_hybrid_groups`` created in this process
    (not collective)."""
    return {name: list(members) for name, members in _CREATED.items()}
