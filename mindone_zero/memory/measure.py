"""Measured memory per rank: the counterparts of the estimates in ``estimate.py``.

``measure_model_states`` counts the bytes of every Parameter a ``TrainOneStepWrapper`` holds on
this rank, at its held size, from the train network's one inventory (``inventory.py``, which
checkpoints save too), each Parameter object once. Only Parameters are counted: gradients that
live only during a step (always at ``gradient_accumulation_steps == 1``), the full tensors a ZeRO-3
network gathers, activations and communication buffers are not model states held between steps;
the ZeRO paper's formulas count gradients whether or not they are kept, so compare with
accumulation buffers in place (``gradient_accumulation_steps > 1``).

``measure_peak_memory`` measures what the model states leave out: the highest memory use of this
rank while training steps run, on CPU from the process's resident set, on Ascend/GPU from the
runtime's allocator.
"""
import gc
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import mindspore as ms

from ..train.inventory import inventory

__all__ = ["measure_model_states", "KINDS", "measure_peak_memory", "memory_in_use", "PeakMemory", "hpz_secondary_bytes"]
_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"

KINDS = ("params", "master_shards", "optimizer_states", "accumulation", "ema", "other")
LOCATIONS = ("host", "file")  # where offloaded states live, apart from the device's KINDS
_KIND_OF = {"optimizer_other": "other"}


def measure_model_states(train_net) -> Dict[str, int]:
    """Bytes of model states this rank holds in ``train_net``, by kind. Not collective.

    Kinds (each Parameter object counted once):

    * ``params``: the network's Parameters at their held size (shards at stage 3);
    * ``master_shards``: ``optimizer_shards.opt_params`` entries that are not network Parameters
      (the 1/N fp32 master copies of stages 1-2);
    * ``optimizer_states``: the optimizer's per-parameter states (``optimizer_shards.opt_states``,
      or found with ``find_optimizer_states`` when nothing was sharded);
    * ``accumulation``: gradient accumulation buffers (``train_net.accum_grads``), if any;
    * ``ema``: EMA weights (and an EMA's aligned swap cache), if an EMA is attached;
    * ``other``: every remaining Parameter of ``train_net`` (loss scale, step counters, Adam's
      beta powers, learning rate): a few scalars;
    * ``total``: the sum of the kinds above: what this rank holds on its device;
    * ``host`` and ``file``: optimizer states offloaded to host memory or to files
      (``optimizer_offload``), not in ``total`` nor in ``optimizer_states``.

    Args:
        train_net (TrainOneStepWrapper): as returned by ``prepare_train_network``.

    Returns:
        dict: ``{kind: bytes}`` with the keys of ``KINDS`` plus ``"total"``, ``"host"`` and
            ``"file"``, all ints.

    Raises:
        TypeError: if ``train_net`` has no ``optimizer_shards``/``network``/``optimizer`` (is not a
            ``TrainOneStepWrapper``).

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import prepare_train_network
        >>> from mindone_zero.memory.measure import measure_model_states
        >>> net = nn.WithLossCell(nn.Dense(1000, 1000), nn.MSELoss())
        >>> optimizer = nn.AdamWeightDecay(net.trainable_params())
        >>> train_net = prepare_train_network(net, optimizer)
        >>> held = measure_model_states(train_net)
        >>> held["params"], held["optimizer_states"]   # fp32; Adam's two moments
        (4004000, 8008000)

        At every stage on 2 and 4 ranks, against bytes computed by hand from the shapes
        (tests/dist/test_memory_measure.py runs this call):

        >>> measure_model_states(train_net)["total"]
    """
    missing = [a for a in ("optimizer_shards", "network", "optimizer") if not hasattr(train_net, a)]
    if missing:
        raise TypeError(
            f"For 'measure_model_states', the argument 'train_net' must be a TrainOneStepWrapper, but got "
            f"{type(train_net).__name__} (no attribute {missing[0]!r})."
        )
    result = dict.fromkeys(KINDS + LOCATIONS, 0)
    for held in inventory(train_net):
        where = getattr(held.param, "location", "device")  # offload.OffloadedState: host or file
        key = _KIND_OF.get(held.kind, held.kind) if where == "device" else where
        result[key] += int(held.param.size) * int(held.param.itemsize)
    result["total"] = sum(result[k] for k in KINDS)
    return result


@dataclass(frozen=True)
class PeakMemory:
    """Memory of this rank around some training steps, as ``measure_peak_memory`` returns it.

    Args:
        baseline_bytes (int): in use just before the steps, or the ``baseline`` given to
            ``measure_peak_memory`` (e.g. read before the network was built).
        peak_bytes (int): the highest use while they ran.
        source (str): ``"process_rss"`` (CPU: resident set of the process, everything it touched,
            Python and MindSpore's host memory alike) or ``"device_allocated"`` (Ascend/GPU: bytes
            the runtime's allocator handed out, ``mindspore.runtime.max_memory_allocated``).

    Examples:
        >>> from mindone_zero.memory.measure import PeakMemory
        >>> peak = PeakMemory(baseline_bytes=100, peak_bytes=250, source="process_rss")
        >>> peak.growth_bytes
        150
    """

    baseline_bytes: int
    peak_bytes: int
    source: str

    @property
    def growth_bytes(self) -> int:
        """``peak_bytes - baseline_bytes``: what the steps needed on top of the baseline."""
        return self.peak_bytes - self.baseline_bytes


def _status_bytes(key: str) -> int:
    with open(_STATUS) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024  # "VmHWM:   123456 kB"
    raise RuntimeError(f"For 'measure_peak_memory', {_STATUS} has no {key} line.")


def _reset_rss_peak() -> None:
    """Reset the kernel's high-water mark (VmHWM) to the current resident set."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError as err:
        raise RuntimeError(
            f"For 'measure_peak_memory', the process peak cannot be reset on this CPU host (writing to "
            f"{_CLEAR_REFS} failed: {err}); a Linux kernel with /proc is needed."
        ) from err


def _on_device() -> bool:
    return ms.get_context("device_target") in ("Ascend", "GPU")


def memory_in_use() -> int:
    """Bytes this rank uses now: on Ascend/GPU the runtime's allocated bytes, on CPU the process's
    resident set (``VmRSS``). Read it before building a network and pass it as the ``baseline`` of
    ``measure_peak_memory`` to count the model states in the growth too. Not collective.

    Returns:
        int: bytes in use.

    Examples:
        >>> from mindone_zero.memory.measure import memory_in_use
        >>> memory_in_use() > 0
        True
    """
    if _on_device():
        return int(ms.runtime.memory_allocated())
    return _status_bytes("VmRSS")


def measure_peak_memory(step: Callable[[], object], steps: int = 1, baseline: Optional[int] = None) -> PeakMemory:
    """Run ``step()`` ``steps`` times and return this rank's baseline and peak memory around them.

    On Ascend/GPU the runtime's peak allocated bytes (``reset_peak_memory_stats``,
    ``max_memory_allocated``; ``source="device_allocated"``). On CPU the process's peak resident
    set (Linux ``VmHWM``, reset through ``/proc/self/clear_refs`` first; ``source="process_rss"``):
    it includes host memory the steps touched outside MindSpore, and memory a step freed but the
    allocator kept is still counted as in use. Compile before measuring (run a step first) unless
    compilation is meant to be counted. Not collective itself; ``step`` usually is (a training
    step must run on every rank).

    Args:
        step: a callable without arguments, e.g. ``lambda: train_net(*batch)``.
        steps: how many times to call it, an int >= 1.
        baseline: bytes the growth is counted from (``memory_in_use()`` read earlier, say before
            the network was built); None: the memory in use just before the steps.

    Returns:
        PeakMemory: ``baseline_bytes``, ``peak_bytes``, ``source`` and ``growth_bytes``.

    Raises:
        TypeError: ``step`` is not callable.
        ValueError: ``steps`` is not an int >= 1, or ``baseline`` is not None or an int >= 0.
        RuntimeError: on CPU, the host cannot reset the process peak.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from mindone_zero import prepare_train_network
        >>> from mindone_zero.memory.measure import measure_peak_memory, memory_in_use
        >>> before = memory_in_use()                    # before the network exists
        >>> net = nn.WithLossCell(nn.Dense(256, 256), nn.MSELoss())
        >>> optimizer = nn.AdamWeightDecay(net.trainable_params())
        >>> train_net = prepare_train_network(net, optimizer)
        >>> x = ms.Tensor(np.ones((8, 256), np.float32))
        >>> y = ms.Tensor(np.zeros((8, 256), np.float32))
        >>> _ = train_net(x, y)                         # compile first
        >>> peak = measure_peak_memory(lambda: train_net(x, y), 2, baseline=before)
        >>> peak.source, peak.baseline_bytes == before, peak.peak_bytes > 0
        ('process_rss', True, True)
        >>> growth = peak.growth_bytes   # the network, its states and the steps
    """
    if not callable(step):
        raise TypeError(f"For 'measure_peak_memory', the argument 'step' must be callable, but got {type(step).__name__}.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"For 'measure_peak_memory', the argument 'steps' must be an int >= 1, but got {steps!r}.")
    if baseline is not None and (isinstance(baseline, bool) or not isinstance(baseline, int) or baseline < 0):
        raise ValueError(f"For 'measure_peak_memory', the argument 'baseline' must be None or an int >= 0, but got "
                         f"{baseline!r}.")
    gc.collect()
    if _on_device():
        ms.runtime.synchronize()
        ms.runtime.reset_peak_memory_stats()
    else:
        _reset_rss_peak()
    now = memory_in_use()
    _run(step, steps)
    if _on_device():
        ms.runtime.synchronize()
        peak, source = int(ms.runtime.max_memory_allocated()), "device_allocated"
    else:
        peak, source = _status_bytes("VmHWM"), "process_rss"
    return PeakMemory(now if baseline is None else baseline, max(peak, now), source)


def _run(step, steps):
    for _ in range(steps):
        out = step()
        # MindSpore runs asynchronously: wait for the step's outputs so its memory is in use now.
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, ms.Tensor):
                value.asnumpy()


def hpz_secondary_bytes(train_net) -> int:
    """Bytes of ZeRO++ hpZ secondary shards this rank holds from forward to backward (one per
    gathered parameter read in a recomputed Cell: its padded size / the hpZ group's size, in the
    compute dtype; [Note: hpZ] in ``mindone_zero/zero3/param_wrapper.py``). 0 without hpZ; the
    counterpart of ``estimate_peak_memory(..., hpz_group_size=K)``'s term. Not collective.

    Args:
        train_net (nn.Cell): the train network (or the network) after ``prepare_train_network``.

    Returns:
        int: bytes; 0 without hpZ.

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import prepare_train_network
        >>> from mindone_zero.memory.measure import hpz_secondary_bytes
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> train_net = prepare_train_network(net, nn.SGD(net.trainable_params()))
        >>> hpz_secondary_bytes(train_net)
        0

        At stage 3 with ``zeropp={"hpz_group": ...}`` (tests/dist/test_zeropp.py compares it with
        ``estimate_peak_memory``'s term):

        >>> hpz_secondary_bytes(train_net)
    """
    total = 0
    for _, cell in train_net.cells_and_names():
        primary = getattr(cell, "hpz_primary", None) if getattr(cell, "hpz", False) else None
        if primary is not None:
            total += primary.nbytes
    return total
