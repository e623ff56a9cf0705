"""MindSpore's own CPU optimizer kernel, called on host numpy arrays.

[Note: host kernel parity]
MindSpore's CPU ``AdamWeightDecay`` kernel (the op ``nn.AdamWeightDecay`` runs on float32
parameters) calls ``AdamWeightDecayFp32`` of nnacl, MindSpore's C kernel library, which ships in
the wheel as ``mindspore/lib/libnnacl.so``. That function fuses multiplies and adds (FMA) and
orders the update in its own way, so numpy's separately rounded float32 operations differ from it
in the last bit of a large share of elements, and the difference grows over steps. Calling the same
function here, through ``ctypes``, on each chunk gives the on-device run's bits: its result for an
element depends only on that element's inputs, not on where a chunk (or one of the kernel's thread
ranges) starts or ends (tests/unit/test_offload.py checks both). Where the library or the function
is missing (another MindSpore build), the host falls back to numpy, within that test's tolerance.
"""
import ctypes
import os
from typing import Callable, Optional

import numpy as np

__all__ = ["adam_weight_decay_kernel"]

_FLOAT_P = ctypes.POINTER(ctypes.c_float)
_LOADED = {}


def _library() -> Optional[ctypes.CDLL]:
    if "lib" not in _LOADED:
        try:
            import mindspore

            path = os.path.join(os.path.dirname(mindspore.__file__), "lib", "libnnacl.so")
            _LOADED["lib"] = ctypes.CDLL(path)
        except OSError:
            _LOADED["lib"] = None
    return _LOADED["lib"]


def _pointer(array: np.ndarray):
    return array.ctypes.data_as(_FLOAT_P)


def adam_weight_decay_kernel() -> Optional[Callable]:
    """nnacl's ``AdamWeightDecayFp32`` as ``fn(w, m, v, g, lr, beta1, beta2, eps, decay)``, updating
    the float32 arrays ``w``, ``m``, ``v`` in place from ``g`` (all contiguous, one length), or None
    when this MindSpore build does not ship it ([Note: host kernel parity])."""
    lib = _library()
    fn = getattr(lib, "AdamWeightDecayFp32", None) if lib is not None else None
    if fn is None:
        return None
    fn.argtypes = [_FLOAT_P] * 3 + [ctypes.c_float] * 5 + [_FLOAT_P, ctypes.c_size_t, ctypes.c_size_t]
    fn.restype = ctypes.c_int

    def run(w, m, v, g, lr, beta1, beta2, eps, decay):
        for a in (w, m, v, g):
            if a.dtype != np.float32 or not a.flags.c_contiguous or a.size != w.size:
                raise ValueError(f"For 'AdamWeightDecayFp32', every array must be contiguous float32 of {w.size} "
                                 f"elements, but got {a.dtype} of {a.size} (contiguous: {a.flags.c_contiguous}).")
        if not (w.flags.writeable and m.flags.writeable and v.flags.writeable):
            raise ValueError("For 'AdamWeightDecayFp32', 'w', 'm' and 'v' must be writable arrays.")
        ret = fn(_pointer(w), _pointer(m), _pointer(v), lr, beta1, beta2, eps, decay, _pointer(g), 0, w.size)
        if ret != 0:
            raise RuntimeError(f"For 'AdamWeightDecayFp32', nnacl returned error {ret}.")

    return run
