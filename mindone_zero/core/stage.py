"""One place for what each ZeRO stage means: ``StagePolicy``.

Every module reads the policy's answers (what is sharded, when gradients are reduced, whether
fp32 master shards exist, what is gathered after the step) instead of comparing stage numbers.

=====  ==============  ================  ==============  ===========  ===================
stage  params sharded  grads sharded     optimizer       fp32 master  gathered after the
       (held 1/N)      (reduced every    states sharded  shards       optimizer step
                       micro-step)
=====  ==============  ================  ==============  ===========  ===================
0      no              no                no              no           nothing
1      no              no (once a step)  yes             yes          the parameters
2      no              yes               yes             yes          the parameters
3      yes             yes               yes             no           nothing (gathered
                                                                      in forward)
=====  ==============  ================  ==============  ===========  ===================
"""
import logging
from dataclasses import dataclass

__all__ = ["StagePolicy", "STAGES", "check_stage"]

STAGES = (0, 1, 2, 3)
_logger = logging.getLogger(__name__)


def check_stage(zero_stage, where: str) -> None:
    """Raise ValueError naming ``where`` unless ``zero_stage`` is one of ``STAGES``."""
    if isinstance(zero_stage, bool) or zero_stage not in STAGES:
        raise ValueError(f"For '{where}', the argument 'zero_stage' must be one of {list(STAGES)}, but got {zero_stage!r}.")


@dataclass(frozen=True)
class StagePolicy:
    """What ZeRO stage ``stage`` shards and communicates (see the table above)."""

    stage: int

    @classmethod
    def of(cls, zero_stage: int, distributed: bool = True, where: str = "ZeroHelper") -> "StagePolicy":
        """The policy of ``zero_stage``; without data parallelism there is nothing to shard, so a
        stage above 0 warns and gives stage 0's policy, as MindOne does.

        Raises:
            ValueError: ``zero_stage`` is not one of 0-3 (naming ``where``).
        """
        check_stage(zero_stage, where)
        if zero_stage > 0 and not distributed:
            _logger.warning("ZeRO stage %d needs ParallelMode.DATA_PARALLEL; falling back to stage 0.", zero_stage)
            zero_stage = 0
        return cls(int(zero_stage))

    @property
    def is_zero(self) -> bool:
        """Anything is sharded (stages 1-3)."""
        return self.stage > 0

    @property
    def shards_params(self) -> bool:
        """The network holds 1/N of each parameter, gathered in forward (stage 3)."""
        return self.stage == 3

    @property
    def shards_grads(self) -> bool:
        """Gradients are reduced to shards every micro-step (stages 2-3)."""
        return self.stage >= 2

    @property
    def shards_optimizer(self) -> bool:
        """Optimizer states are 1/N (stages 1-3)."""
        return self.stage >= 1

    @property
    def uses_masters(self) -> bool:
        """The optimizer updates fp32 master shards, all-gathered into the parameters after the
        step (stages 1-2). So ``ZeroHelper`` decides the split and reduce-scatters; at stage 3 the
        network was sharded by ``shard_network`` and its gradients arrive reduce-scattered."""
        return self.stage in (1, 2)

    def reduce_each_micro_step(self, accum_steps: int) -> bool:
        """Whether gradients are reduced every micro-step (else once per optimizer step)."""
        return self.shards_grads or accum_steps == 1
