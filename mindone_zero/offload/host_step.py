"""ZeRO-Offload / ZeRO-Infinity: the optimizer step of a ``ZeroHelper`` run on the host.

[Note: host step]
With ``optimizer_offload`` on, the train graph stops after the gradients are reduced (and
averaged over accumulation, unscaled and clipped): it returns them, shaped like the tensors the
optimizer updates (shards at stages >= 1), with a flag saying whether this call ends an
optimizer step that is not dropped for an overflow. ``TrainOneStepWrapper.__call__`` then calls
``HostOffload.step``, which, tensor by tensor and ``chunk_size`` elements at a time, reads the
optimizer states from the store (host memory or files), updates them and the fp32 tensor the
optimizer updates (the master shard at stages 1-2, the parameter or its shard otherwise) with
the host rule (host_optimizer.py), and writes them back. Every rank then agrees that every rank
succeeded (one all-reduce of a flag per rank, so that a failure raises everywhere instead of
hanging a collective), and ``after_step`` runs, in its own small graph, what followed the
optimizer in the train graph: at stages 1-2 the all-gather of the new shards into the network
(collective) and the EMA update.

Where the tensor the optimizer updates lives: the host reads and writes it through
``Parameter.asnumpy()``, which on MindSpore's CPU backend is a view of the Parameter's memory
(checked at build time); elsewhere it is a copy, written back whole with ``set_data``. The
optimizer's own state Parameters are cut to one element each (``OffloadedState`` stands for them
in the inventory, in memory measurements and in checkpoints, under the same names, so
checkpoints of offloaded and on-device runs load into each other).

Not overlapped with the next step: that step's forward reads the parameters this update writes
(at stages 1-2 through the all-gather that follows it), so running the update in a thread while
the device computes would train on stale weights (DeepSpeed's optional "delayed parameter
update"), which the parity this library promises rules out.
"""
from typing import List

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.communication import GlobalComm, get_rank

from .config import OffloadConfig
from .file_store import FileStore, MemoryStore
from .host_optimizer import StepHyper, host_rule_for

__all__ = ["HostOffload", "OffloadedState"]


class OffloadedState:
    """Stands for one optimizer state Parameter whose data lives in a store: it has the
    Parameter's ``name``, ``shape``, ``dtype``, ``size``, ``itemsize``, ``asnumpy()`` and
    ``set_data(Tensor)`` (one tensor read or written through the store), which is what the
    inventory, memory measurements and checkpoints use."""

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
    """What follows the optimizer in the train graph: the all-gather (stages 1-2), then the EMA."""

    def __init__(self, helper, ema):
        super().__init__(auto_prefix=False)
        self.helper = helper
        self.gather = helper.use_masters and helper.is_parallel and len(helper.ag_index) > 0
        self.ema = ema
        self.has_ema = ema is not None

    def construct(self):
        done = ops.ones((), ms.bool_)
        if self.gather:
            done = ops.depend(done, self.helper.all_gather_params())
        if self.has_ema:
            done = ops.depend(done, self.ema.ema_update())
        return done


def _shares_memory(param: Parameter) -> bool:
    return np.shares_memory(param.asnumpy(), param.asnumpy())


class HostOffload:
    """The host side of one ``ZeroHelper`` with offload ([Note: host step]). Not a Cell.

    Args:
        helper (ZeroHelper): sharded already; its ``opt_states`` are moved into the store.
        config (OffloadConfig): where the states go.
    """

    def __init__(self, helper, config: OffloadConfig):
        self.helper, self.config = helper, config
        self.rule = host_rule_for(helper.optimizer, "ZeroHelper")
        if config.device == "nvme":
            rank = get_rank() if GlobalComm.INITED else 0
            self.store = FileStore(config.path, f"rank{rank}_", config.chunk_size, config.keep_files)
        else:
            self.store = MemoryStore()
        self.chunk = max(1, config.chunk_size // 4)
        self.placeholders: List[Parameter] = []
        self.states = {attr: self._move(helper.opt_states[attr]) for attr in self.rule.states}
        self.in_place = [_shares_memory(p) for p in helper.opt_params]
        self.after = None

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
        self.after = _AfterStep(self.helper, ema)

    def step(self, grads) -> None:
        """One optimizer step on the host from ``grads`` (the train graph's outputs), then the
        agreement and ``after_step``. Collective (every rank, every optimizer step)."""
        from ..checkpoint.resume import _attempt, _agree  # the ranks' agreement lives with checkpoints

        _, error = _attempt(lambda: self._update(grads))
        _agree(self, error, "optimizer_offload", "the ranks' optimizer states now disagree: resume from the last "
                                                 "checkpoint (load_train_state).")
        if self.after.gather or self.after.has_ema:
            self.after()

    # ``_agree`` reads ``train_net.zero_helper``; a HostOffload answers for its helper
    @property
    def zero_helper(self):
        return self.helper

    def _update(self, grads) -> None:
        hyper = StepHyper.read(self.helper.optimizer, self.rule)
        for i, (param, grad) in enumerate(zip(self.helper.opt_params, grads)):
            weights = param.asnumpy()
            flat_w = weights.reshape(-1)
            flat_g = grad.asnumpy().reshape(-1)
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
            if not self.in_place[i]:
                param.set_data(Tensor(weights, param.dtype))

    def close(self) -> None:
        """Release the store (removing its files unless ``keep_files``)."""
        self.store.close()
