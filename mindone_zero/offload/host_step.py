"""ZeRO-Offload / ZeRO-Infinity: the optimizer step run on the host.

[Note: host step]
With ``optimizer_offload`` on, the train graph stops after the gradients are reduced (and
averaged over accumulation, unscaled and clipped): it returns them, shaped like the tensors the
optimizer updates (shards at stages >= 1), with a flag saying whether this call ends an
optimizer step that is not dropped for an overflow. ``TrainOneStepWrapper.__call__`` then calls
``HostOffload.step``, which, tensor by tensor and ``chunk_size`` elements at a time, reads the
optimizer states from the store (host memory or files), updates them and the fp32 tensor the
optimizer updates (the master shard at stages 1-2, the parameter or its shard otherwise) with
the host rule (host_optimizer.py), and writes them back. Then one small graph (``_AfterStep``)
runs what followed the optimizer in the train graph, after an all-reduce of one failure flag per
rank (so that a failure on one rank raises on every rank instead of hanging a collective): at
stages 1-2 the all-gather of the new shards into the network (collective), then the EMA update.
The agreement lives in that graph rather than in an eager all-reduce: switching to PYNATIVE_MODE
for it every step costs time and memory.

The host reads and writes the tensor the optimizer updates through ``Parameter.asnumpy()``: on
MindSpore's CPU backend a view of the Parameter's memory (decided by the device target, then
checked: [Note: device targets] in backend.py); on Ascend and GPU a copy, written back whole after
each update (``_write_back``). The optimizer's own state Parameters are cut to one element each;
``OffloadedState`` stands for them, under the same names, in the inventory, memory measurements
and checkpoints, so checkpoints of offloaded and on-device runs load into each other.

[Note: host step memory]
The gradients come out of the train graph as Tensors, one per tensor the optimizer updates (at
stage 3, every parameter shard). ``TrainOneStepWrapper.__call__`` hands them over in a list and
the update drops each one (``_take``) as soon as its tensor is done, so at most one gradient beyond
what the update reads is alive, and where ``asnumpy()`` copies to the host (a device), at most one
host copy. (On the CPU backend the peak is inside the train graph, whose memory pool keeps the
freed blocks, so this does not lower it there.) The update allocates nothing per element where
the nnacl kernel runs ([Note: host kernel parity] in nnacl.py): states in memory are updated in
place, states in files through one buffer per state per chunk (``chunk_size``;
docs/benchmarks/offload_chunks.md). The states' device copies are freed when they are moved into
the store, but glibc keeps freed blocks of a few MB in its heap (in the resident set);
``malloc_trim`` once the store is filled returns them to the OS.

Not overlapped with the next step: that step's forward reads the parameters this update writes
(at stages 1-2 through the all-gather that follows it), so running the update in a thread while
the device computes would train on stale weights (DeepSpeed's optional "delayed parameter
update"), which the parity this library promises rules out.
"""
import ctypes
from typing import List

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.communication import GlobalComm, get_group_size, get_rank

from ..core.backend import host_updates_in_place
from ..core.comm_records import FLAG_DTYPE
from .config import OffloadConfig
from .file_store import FileStore, MemoryStore
from .host_optimizer import HostRule, StepHyper

__all__ = ["HostOffload", "OffloadedState"]


class OffloadedState:
    """Stands for one optimizer state Parameter whose data lives in a store, with the Parameter's
    names that the inventory, memory measurements and checkpoints use (``asnumpy``, ``set_data``...)."""

    dtype = ms.float32
    itemsize = 4

    def __init__(self, store, name: str, shape: tuple):
        self.store, self.name, self.shape = store, name, tuple(shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.itemsize

    @property
    def location(self) -> str:
        return self.store.location

    def asnumpy(self) -> np.ndarray:
        return self.store.read_all(self.name).reshape(self.shape)

    def __array__(self, dtype=None):
        out = self.asnumpy()
        return out if dtype is None else out.astype(dtype)

    def set_data(self, data) -> None:
        values = data.asnumpy() if isinstance(data, Tensor) else np.asarray(data)
        if tuple(values.shape) != self.shape:
            raise ValueError(f"For 'OffloadedState.set_data', {self.name!r} has shape {self.shape}, got {values.shape}.")
        self.store.write_all(self.name, values.astype(np.float32))


class _AfterStep(nn.Cell):
    """What follows the host update, in one graph: the ranks' agreement (an all-reduce of one
    failure flag per global rank), the all-gather (stages 1-2), then the EMA."""

    def __init__(self, sync, ema):
        super().__init__(auto_prefix=False)
        self.sync = sync
        self.agree = sync.is_parallel
        self.gather = sync.use_masters and sync.is_parallel and len(sync.ag_index) > 0
        self.ema = ema
        self.has_ema = ema is not None

    @property
    def needed(self) -> bool:
        return self.agree or self.gather or self.has_ema

    def construct(self, failed):
        if self.agree:
            failed = self.sync.world_comm.all_reduce(failed)
        if self.gather:
            failed = ops.depend(failed, self.sync.all_gather_params())
        if self.has_ema:
            failed = ops.depend(failed, self.ema.ema_update())
        return failed


def _take(grads, i: int) -> np.ndarray:
    """Gradient ``i`` as a flat array, dropping the list's reference to its Tensor ([Note: host step
    memory])."""
    grad = grads[i]
    if isinstance(grads, list):
        grads[i] = None
    return grad.asnumpy().reshape(-1)


def _return_freed_memory() -> None:
    """glibc's ``malloc_trim`` (a no-op elsewhere): [Note: host step memory]."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _updates_in_place(param: Parameter) -> bool:
    """Whether a write into ``param.asnumpy()`` lands in ``param``: on the CPU backend, where
    ``asnumpy()`` is a view of the Parameter's memory (two calls, one buffer). Decided by the
    device target first: on Ascend and GPU, before any graph has run, the Parameter still lives on
    the host and the two calls share memory too, but the graphs read its device copy."""
    return host_updates_in_place() and np.may_share_memory(param.asnumpy(), param.asnumpy())


def _write_back(param: Parameter, weights: np.ndarray) -> None:
    """Copy the host result into ``param``'s own buffer. ``ops.assign``, not ``set_data``: set_data
    gives the Parameter a new buffer, and a graph compiled before (the jitted train step in
    PYNATIVE_MODE, seen on CPU too) keeps reading and updating the old one."""
    ops.assign(param, Tensor(weights, param.dtype))


class HostOffload:
    """The host side of one optimizer with offload ([Note: host step]). Not a Cell.

    Built from the train records ([Note: train records] in mindone_zero/train/train_plan.py): it
    moves the optimizer's states into the store, and after each host step runs ``sync``'s all-gather.

    Args:
        config (OffloadConfig): where the states go.
        rule (HostRule): the optimizer's host update (``offload_for`` found it).
        shards (OptimizerShards): what the optimizer updates; its ``opt_states`` are moved into the store.
        sync (GradSync): the train step's gradient synchronization (its world group and all-gather).
    """

    def __init__(self, config: OffloadConfig, rule: HostRule, shards, sync):
        self.config, self.rule, self.sync = config, rule, sync
        self.optimizer, self.opt_params = shards.optimizer, shards.opt_params
        if config.device == "nvme":
            rank = get_rank() if GlobalComm.INITED else 0
            self.store = FileStore(config.path, f"rank{rank}_", config.chunk_size, config.keep_files)
        else:
            self.store = MemoryStore()
        self.chunk = max(1, config.chunk_size // 4)
        self.placeholders: List[Parameter] = []
        self.states = {attr: self._move(shards.opt_states[attr]) for attr in rule.states}
        self.in_place = [_updates_in_place(p) for p in self.opt_params]
        self.after = None
        _return_freed_memory()

    def _move(self, params: List[Parameter]) -> List[OffloadedState]:
        """Copy each state into the store and cut its Parameter to one element."""
        out = []
        for p in params:
            self.store.create(p.name, p.asnumpy())
            out.append(OffloadedState(self.store, p.name, tuple(p.shape)))
            p.set_data(Tensor(np.zeros((1,), np.float32), p.dtype))
            self.placeholders.append(p)
        return out

    def bind_after_step(self, ema) -> None:
        """Build the graph that follows each host step (called by ``TrainOneStepWrapper``)."""
        self.after = _AfterStep(self.sync, ema)

    def step(self, grads) -> None:
        """One optimizer step on the host from ``grads`` (the train graph's outputs), then the
        ``_AfterStep`` graph with the ranks' agreement. Collective (every rank, every optimizer step).
        A list of gradients is emptied as it is consumed (each entry set to None once its tensor is
        updated), so the caller should hold no other reference to them ([Note: host step memory]).

        Raises:
            OSError: this rank's update failed (a state-file write, say).
            RuntimeError: another rank's failed.
        """
        error = None
        try:
            self._update(grads)
        except Exception as err:  # noqa: BLE001 - raised below, after the collective
            error = err
        world, rank = (get_group_size(), get_rank()) if GlobalComm.INITED else (1, 0)
        flags = np.zeros((world,), ms.dtype_to_nptype(FLAG_DTYPE))  # [Note: comm records] in core/comm_records.py
        flags[rank] = 1.0 if error is not None else 0.0
        if self.after.needed:
            # A failed rank still runs the collectives, so no rank hangs; the all-gather then
            # spreads partly updated shards, which the error below says to discard.
            flags = self.after(Tensor(flags)).asnumpy()
        if error is not None:
            raise error
        failed = [int(i) for i in np.nonzero(flags > 0)[0]]
        if failed:
            raise RuntimeError(
                f"For 'optimizer_offload', the host optimizer step failed on global rank(s) {failed} (see their "
                f"logs); the ranks' optimizer states now disagree: resume from the last checkpoint (load_train_state)."
            )

    def _update(self, grads) -> None:
        hyper = StepHyper.read(self.optimizer, self.rule)
        for i, param in enumerate(self.opt_params):
            weights = param.asnumpy()
            flat_w = weights.reshape(-1)
            flat_g = _take(grads, i)
            for start in range(0, flat_w.size, self.chunk):
                stop = min(start + self.chunk, flat_w.size)
                states = {a: self.store.read(self.states[a][i].name, start, stop) for a in self.rule.states}
                w = flat_w[start:stop]
                w32 = w if w.dtype == np.float32 else w.astype(np.float32)
                self.rule.update(w32, flat_g[start:stop], states, i, hyper)
                if w32 is not w:
                    w[:] = w32
                for a, values in states.items():
                    self.store.write(self.states[a][i].name, start, values)
            del flat_g  # this gradient's memory goes before the next one is read ([Note: host step memory])
            if not self.in_place[i]:
                _write_back(param, weights)

    def close(self) -> None:
        """Release the store (removing its files unless ``keep_files``)."""
        self.store.close()
