"""What a train step communicates: ``CommPlan``.

[Note: comm plan]
Graph-mode code is traced once, so collectives cannot be counted while a step runs; the plan is
derived when the train network is built, from the records its collectives are built from ([Note:
comm records] in comm_records.py): one entry per collective of one optimizer step, in the native
path's bytes (what Ascend and GPU send; [Note: native tags] in comm.py maps the CPU emulations
back). ``train/comm_accounting.py`` derives it, one function per kind of entry, given a
``PlanContext``: how many micro-steps an optimizer step has, how often gradients are reduced,
whether the norm is clipped. ``TrainOneStepWrapper.comm_plan`` is the plan of its step;
tests/dist/test_comm_graph.py holds it against the collectives of the compiled graph, count and
bytes of every entry.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .quantize import SCALE_BYTES

__all__ = ["CommPlan", "PlanContext", "RING_FACTOR"]

RING_FACTOR = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "broadcast": 1.0, "all_to_all": 1.0}
"""Bytes a rank sends with a ring algorithm, per byte of the full tensor and per (n-1)/n."""


@dataclass
class CommPlan:
    """What one optimizer step communicates per rank, as the native collectives would.

    Filled at build time ([Note: comm plan]). Each entry is ``(kind, group, nbytes, group_size)``:
    ``nbytes`` is the size of the full tensor the collective works on (the all-reduced tensor, the
    padded input of a reduce-scatter, the output of an all-gather). ``volume`` turns that into the
    bytes a rank sends with a ring algorithm: ``2 (n-1)/n`` of it for all-reduce, ``(n-1)/n`` for
    reduce-scatter, all-gather and all-to-all, the terms of the ZeRO paper's 2Φ / 3Φ. ZeRO++'s
    quantized collectives record int8 values and float32 scales as separate entries
    (``GroupComm.all_gather_quantized``). A train network's plan is ``train_net.comm_plan``
    (``TrainOneStepWrapper``).

    Args:
        entries (list): the ``(kind, group, nbytes, group_size)`` tuples; empty by default (the
            train network fills its own).

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import prepare_train_network
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> train_net = prepare_train_network(net, nn.SGD(net.trainable_params()))
        >>> train_net.comm_plan.summary()     # one process: nothing to communicate
        'no collectives'
        >>> from mindone_zero.core.comm_plan import CommPlan
        >>> plan = CommPlan([("all_reduce", "world", 1000, 4),
        ...                  ("all_gather", "world", 1000, 4)])
        >>> plan.count(), plan.bytes("all_reduce"), plan.volume()
        (2, 1000, 2250.0)
        >>> for kind in plan.summary().split("; "):
        ...     print(kind)
        all_gather: 1 calls, 1000 B, 750 B sent per rank
        all_reduce: 1 calls, 1000 B, 1500 B sent per rank

        On several ranks, at stage 2 say (tests/unit/test_comm_plan.py checks train steps' plans
        with emulated groups, tests/dist/test_profile_collectives.py against the executed ones):

        >>> print(train_net.comm_plan.summary())
    """

    entries: List[Tuple[str, str, int, int]] = field(default_factory=list)

    def add(self, kind: str, group: str, nbytes: int, group_size: int, times: int = 1) -> None:
        if kind not in RING_FACTOR:
            raise ValueError(f"For 'CommPlan.add', the argument 'kind' must be one of {sorted(RING_FACTOR)}, but got {kind!r}.")
        self.entries.extend([(kind, group, int(nbytes), int(group_size))] * times)

    def add_quantized(self, kind: str, group: str, group_size: int, numel: int, blocks: int, times: int = 1) -> None:
        """A ZeRO++ quantized collective on a tensor of ``numel`` int8 values in ``blocks`` blocks: one
        entry for the int8 values (1 byte each, natively; see [Note: int8 on CPU] in comm.py), one for
        the float32 scales."""
        self.add(kind, group, numel, group_size, times)
        self.add(kind, group, blocks * SCALE_BYTES, group_size, times)

    def count(self, kind: Optional[str] = None) -> int:
        """Number of collectives (of ``kind`` if given).

        Args:
            kind (str): ``"all_reduce"``, ``"reduce_scatter"``, ``"all_gather"``, ``"broadcast"`` or
                ``"all_to_all"``; None: every kind.
        """
        return sum(1 for e in self.entries if kind is None or e[0] == kind)

    def bytes(self, kind: Optional[str] = None) -> int:
        """Full-tensor bytes over all collectives (of ``kind`` if given).

        Args:
            kind (str): a collective's kind, as in ``count``; None: every kind.
        """
        return sum(e[2] for e in self.entries if kind is None or e[0] == kind)

    def volume(self, kind: Optional[str] = None) -> float:
        """Bytes each rank sends with ring algorithms (of ``kind`` if given).

        Args:
            kind (str): a collective's kind, as in ``count``; None: every kind.
        """
        return sum(RING_FACTOR[k] * (n - 1) / n * b for k, _, b, n in self.entries if kind is None or k == kind)

    def volume_outside(self, groups) -> float:
        """Ring volume per rank of the collectives whose group is not in ``groups`` (ZeRO++: the
        traffic that leaves hpZ's secondary group, the paper's cross-node volume).

        Args:
            groups (Iterable[str]): the group names whose traffic is not counted.
        """
        return sum(RING_FACTOR[k] * (n - 1) / n * b for k, g, b, n in self.entries if g not in groups)

    def summary(self) -> str:
        """One line per kind: calls, full-tensor bytes, ring volume per rank."""
        kinds = sorted({e[0] for e in self.entries})
        parts = [f"{k}: {self.count(k)} calls, {self.bytes(k)} B, {self.volume(k):.0f} B sent per rank" for k in kinds]
        return "; ".join(parts) if parts else "no collectives"


@dataclass(frozen=True)
class PlanContext:
    """What the accounting needs to know about the train step it counts ([Note: comm plan]).

    Args:
        micro_steps: forward/backward passes per optimizer step (gradient accumulation).
        reduce_each_micro_step: gradients are reduced every micro-step, else once per optimizer
            step ([Note: gradient reduction] in train/grad_sync.py).
        clip_grad: the step clips by the global norm (one more all-reduce at stages >= 1).
    """

    micro_steps: int = 1
    reduce_each_micro_step: bool = True
    clip_grad: bool = False

    @property
    def reductions(self) -> int:
        """Gradient reductions per optimizer step."""
        return self.micro_steps if self.reduce_each_micro_step else 1
