"""The job-wide group-name check on the ``groups_rank{r}.json`` files workers write.

Each file is one rank's {group name: world ranks of that group, as the backend reports them}. HCCL
and NCCL identify a group by its name across the job ([Note: group names] in
mindone_zero/core/groups.py), which the CPU backend does not check; this reads what every rank created.
"""
import json


def job_groups(out, world, pattern="groups_rank{}.json"):
    """{name: world ranks} over all ranks' files, after checking that no name stands for two rank
    sets anywhere in the job and that each rank belongs to every group it reported."""
    seen = {}
    for rank in range(world):
        with open(out / pattern.format(rank)) as f:
            groups = json.load(f)
        assert groups, f"rank {rank} reported no group"
        for name, members in groups.items():
            assert rank in members, f"rank {rank} reported {name!r} with ranks {members}"
            first = seen.setdefault(name, (members, rank))
            assert first[0] == members, (f"group name {name!r} is ranks {first[0]} on rank {first[1]} "
                                         f"and ranks {members} on rank {rank}")
    return {name: members for name, (members, _) in seen.items()}
