"""The optimizer update on the host: MindSpore's optimizer formulas in vectorised numpy, fp32.

No communication here; ``nn.AdamWeightDecay`` runs MindSpore's own CPU kernel function where the
installed MindSpore ships it ([Note: host kernel parity] in nnacl.py), the rest is numpy. A
``HostRule`` updates one chunk of one tensor in place, from the ``StepHyper`` read (learning rates
and weight decay, schedules included) once per step.

[Note: host update formulas]
Each rule follows the kernel the MindSpore optimizer runs on the device (MindSpore 2.10):

* ``nn.AdamWeightDecay`` (fused ``AdamWeightDecay``): ``m = b1 m + (1 - b1) g``,
  ``v = b2 v + (1 - b2) g^2``, ``w -= lr (m / (sqrt(v) + eps) + wd w)`` (``wd`` only where the
  optimizer's ``decay_flags`` say so). ``kernel="nnacl"`` (the default where available) calls the
  CPU kernel's own function, bit for bit; ``kernel="numpy"`` rounds every operation separately.
* ``nn.Adam`` (``Adam`` kernel; ``decay_weight`` adds the weight decay to the gradient):
  ``g += wd w``, ``b1p *= b1``, ``b2p *= b2``, ``lr_t = lr sqrt(1 - b2p) / (1 - b1p)``,
  ``m += (1 - b1)(g - m)``, ``v += (1 - b2)(g^2 - v)``, ``w -= lr_t m / (sqrt(v) + eps)``
  (Nesterov: ``w -= lr_t ((1 - b1) g + b1 m) / (sqrt(v) + eps)``).
* ``nn.Momentum`` (``ApplyMomentum``): ``g += wd w``, ``a = mu a + g``, ``w -= lr a``
  (Nesterov: ``w -= lr (g + mu a)``, ApplyMomentum's documented formula; MindSpore 2.10's CPU
  kernel ignores ``use_nesterov`` and applies ``w -= lr a``, so on CPU a Nesterov run differs).
* ``nn.SGD`` (``SGD`` kernel): ``g += wd w``; with momentum ``a = g`` on the first step (``stat``
  is 1) else ``a = mu a + (1 - dampening) g``, then ``g = a`` (Nesterov: ``g + mu a``);
  ``w -= lr g``; ``stat = 0``.

Adam, Momentum and SGD then divide the gradient by their ``loss_scale`` (``scale_grad``).
Everything is computed in float32, as the kernels do; only the nnacl path repeats the kernels'
fused operations, so the numpy rules agree with the device within round-off (tests/unit/test_offload.py
checks the tolerance).
"""
import logging
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from ..core.ms_internals import optimizer_parameters
from .config import OffloadConfig
from .nnacl import adam_weight_decay_kernel

__all__ = ["HostRule", "StepHyper", "host_rule_for", "offload_for", "SUPPORTED"]

_logger = logging.getLogger(__name__)

SUPPORTED = ("nn.AdamWeightDecay", "nn.Adam", "nn.Momentum", "nn.SGD")
_F32 = np.float32
_NNACL_ADAMW = adam_weight_decay_kernel()


def _scalar(x) -> float:
    if isinstance(x, Tensor):
        return float(x.asnumpy().reshape(-1)[0])
    return float(x)


def _per_param(value, n):
    """A per-parameter tuple of floats from a scalar or a per-group tuple."""
    if isinstance(value, (tuple, list)):
        return tuple(_scalar(v) for v in value)
    return (_scalar(value),) * n


@dataclass
class StepHyper:
    """What one optimizer step needs, per parameter and per step."""

    lr: Tuple[float, ...]
    weight_decay: Tuple[float, ...]  # 0 where the optimizer does not decay the parameter
    grad_scale: float  # 1 / the optimizer's loss_scale
    beta1_power: float = 1.0
    beta2_power: float = 1.0

    @classmethod
    def read(cls, optimizer, rule: "HostRule") -> "StepHyper":
        """Read the step's values from ``optimizer`` for its current ``global_step``, then advance it
        (and Adam's beta powers) as its ``construct`` would, so that checkpoints and schedules stay right."""
        n = len(optimizer_parameters(optimizer))
        lr = _per_param(optimizer.get_lr(), n)
        decay = optimizer.get_weight_decay() if optimizer.exec_weight_decay else 0.0
        flags = getattr(optimizer, "decay_flags", None) or (True,) * n
        wd = tuple(w if f else 0.0 for w, f in zip(_per_param(decay, n), flags))
        scale = _scalar(optimizer.reciprocal_scale) if getattr(optimizer, "need_scale", False) else 1.0
        step = optimizer.global_step
        step.set_data(Tensor(step.asnumpy() + 1, step.dtype))
        hyper = cls(lr, wd, scale)
        if rule.name == "Adam":
            b1p = _F32(_scalar(optimizer.beta1_power)) * _F32(rule.beta1)
            b2p = _F32(_scalar(optimizer.beta2_power)) * _F32(rule.beta2)
            optimizer.beta1_power.set_data(Tensor(b1p, ms.float32))
            optimizer.beta2_power.set_data(Tensor(b2p, ms.float32))
            hyper.beta1_power, hyper.beta2_power = float(b1p), float(b2p)
        return hyper


@dataclass
class HostRule:
    """One optimizer's update rule: its state attributes and hyper-parameters.

    ``states`` are the optimizer's per-parameter ParameterTuple attributes the rule updates, in
    the optimizer's naming (so checkpoints of offloaded and on-device runs are interchangeable).
    """

    name: str
    states: Tuple[str, ...]
    beta1: float = 0.0
    beta2: float = 0.0
    eps: float = 0.0
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    kernel: str = "numpy"  # "nnacl": MindSpore's CPU kernel function ([Note: host kernel parity])

    def update(self, w: np.ndarray, g: np.ndarray, states: Dict[str, np.ndarray], i: int, hyper: StepHyper) -> None:
        """Update the float32 chunk ``w`` and its ``states`` in place from gradient chunk ``g``
        (parameter index ``i``), per [Note: host update formulas]."""
        g = g.astype(_F32, copy=False)
        lr, wd = _F32(hyper.lr[i]), _F32(hyper.weight_decay[i])
        if self.name == "AdamWeightDecay":  # its construct neither decays nor scales the gradient
            self._adam_weight_decay(w, g, states["moments1"], states["moments2"], lr, wd)
            return
        if wd != 0:  # decay_weight, then scale_grad, as the optimizer's construct
            g = g + wd * w
        if hyper.grad_scale != 1.0:
            g = g * _F32(hyper.grad_scale)
        if self.name == "Adam":
            self._adam(w, g, states["moment1"], states["moment2"], lr, hyper)
        elif self.name == "Momentum":
            self._momentum(w, g, states["moments"], lr)
        else:
            self._sgd(w, g, states["accum"], states["stat"], lr)

    def _adam_weight_decay(self, w, g, m, v, lr, wd):
        if self.kernel == "nnacl":
            _NNACL_ADAMW(w, m, v, np.ascontiguousarray(g), lr, self.beta1, self.beta2, self.eps, wd)
            return
        b1, b2 = _F32(self.beta1), _F32(self.beta2)
        m *= b1
        m += (_F32(1) - b1) * g
        v *= b2
        v += (_F32(1) - b2) * np.square(g)
        update = m / (np.sqrt(v) + _F32(self.eps))
        if wd != 0:
            update += wd * w
        w -= lr * update

    def _adam(self, w, g, m, v, lr, hyper):
        b1, b2 = _F32(self.beta1), _F32(self.beta2)
        lr_t = lr * np.sqrt(_F32(1) - _F32(hyper.beta2_power)) / (_F32(1) - _F32(hyper.beta1_power))
        m += (_F32(1) - b1) * (g - m)
        v += (_F32(1) - b2) * (np.square(g) - v)
        num = ((_F32(1) - b1) * g + b1 * m) if self.nesterov else m
        w -= lr_t * num / (np.sqrt(v) + _F32(self.eps))

    def _momentum(self, w, g, a, lr):
        mu = _F32(self.momentum)
        a *= mu
        a += g
        w -= lr * (g + mu * a) if self.nesterov else lr * a

    def _sgd(self, w, g, a, stat, lr):
        mu = _F32(self.momentum)
        if mu > 0:
            first = stat > 0
            a[:] = np.where(first, g, mu * a + (_F32(1) - _F32(self.dampening)) * g)
            g = g + mu * a if self.nesterov else a
        w -= lr * g
        stat[:] = 0


def host_rule_for(optimizer, where: str = "prepare_train_network") -> HostRule:
    """The host rule of ``optimizer``; raises ValueError naming ``optimizer_offload`` when the
    optimizer has none (before anything is changed). The entry points go through ``offload_for``,
    which warns instead."""
    rule = _rule_of(optimizer)
    if rule is None:
        raise ValueError(
            f"For '{where}', the argument 'optimizer_offload' needs an optimizer with a host update "
            f"({', '.join(SUPPORTED)}; Adam without amsgrad, lazy or offload), but got "
            f"{type(optimizer).__name__}."
        )
    return rule


def offload_for(optimizer_offload, optimizer, where: str = "prepare_train_network") -> Tuple[OffloadConfig, Optional[HostRule]]:
    """``optimizer_offload`` parsed for ``optimizer`` ([Note: offload argument] in config.py), and the
    optimizer's host rule when it is offloaded (else None).

    An optimizer without a host rule (anything but ``SUPPORTED``) runs on the device without
    offload, after a warning naming its type: MindOne's meaning, which warns and ignores
    ``optimizer_offload`` for an optimizer other than ``nn.AdamWeightDecay``. The argument is still
    checked, but an nvme ``path`` is then neither created nor written. Not collective.

    Raises:
        ValueError: ``optimizer_offload`` is malformed (``OffloadConfig.parse``).
    """
    asked = optimizer_offload is not None and optimizer_offload is not False
    rule = _rule_of(optimizer) if asked else None
    config = OffloadConfig.parse(optimizer_offload, where, check_path=rule is not None)
    if config.enabled and rule is None:
        _logger.warning(
            "For '%s', optimizer_offload=%r has no effect with the optimizer %s: the host update covers %s (Adam "
            "without amsgrad, lazy or offload). The optimizer step runs on the device, without offload, as MindOne "
            "does for an optimizer other than nn.AdamWeightDecay.",
            where, optimizer_offload, type(optimizer).__name__, ", ".join(SUPPORTED))
        return OffloadConfig(), None
    return config, (rule if config.enabled else None)


def _rule_of(optimizer) -> Optional[HostRule]:
    """The host rule of ``optimizer`` ([Note: host update formulas]), or None."""
    if isinstance(optimizer, nn.AdamWeightDecay):
        return HostRule("AdamWeightDecay", ("moments1", "moments2"), _scalar(optimizer.beta1),
                        _scalar(optimizer.beta2), _scalar(optimizer.eps),
                        kernel="nnacl" if _NNACL_ADAMW is not None else "numpy")
    if (isinstance(optimizer, nn.Adam) and not isinstance(optimizer, (nn.AdamOffload, nn.LazyAdam))
            and not getattr(optimizer, "use_amsgrad", False) and not getattr(optimizer, "use_lazy", False)
            and not getattr(optimizer, "use_offload", False)):
        return HostRule("Adam", ("moment1", "moment2"), _scalar(optimizer.beta1), _scalar(optimizer.beta2),
                        _scalar(optimizer.eps), nesterov=bool(optimizer.use_nesterov))
    if isinstance(optimizer, nn.Momentum):
        return HostRule("Momentum", ("moments",), momentum=_scalar(optimizer.momentum),
                        nesterov=bool(optimizer.use_nesterov))
    if isinstance(optimizer, nn.SGD):
        return HostRule("SGD", ("accum", "stat"), momentum=_scalar(optimizer.momentum),
                        dampening=float(optimizer.dampening), nesterov=bool(optimizer.nesterov))
    return None
