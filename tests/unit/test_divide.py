"""[Note: Div on CPU] in mindone_zero/core/comm.py: ``divide`` (RealDiv) gives the same bits as ``x / n``
(Div) in both modes, for float32 normals, zeros, infinities and NaN, and for float16 and bfloat16.
Subnormal quotients are left out: they follow the thread's flush-to-zero state, which an earlier
test in the same process may have set for one kernel's thread and not the other's."""
import numpy as np
import mindspore as ms
import pytest
from mindspore import Tensor, nn

from mindone_zero.core.comm import divide

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")


class _Both(nn.Cell):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def construct(self, x):
        return divide(x, self.n), x / self.n


def _float32_classes():
    rng = np.random.default_rng(0)
    mantissas = rng.standard_normal(4096).astype(np.float32)
    exponents = rng.integers(-45, 38, 4096).astype(np.float32)
    special = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -1e-45, 3e-39, 1.17549435e-38, 3.4028235e38]
    return np.concatenate([mantissas * np.float32(10) ** exponents, np.array(special, np.float32)])


def _normal_or_special(q):
    return ~((q != 0) & (np.abs(q) < np.finfo(np.float32).tiny))


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_divide_is_bitwise_the_division(mode, n):
    ms.set_context(mode=mode)
    x = _float32_classes().reshape(-1, 2)
    got, want = _Both(n)(Tensor(x))
    assert got.dtype == want.dtype == ms.float32
    got, want = got.asnumpy().ravel(), want.asnumpy().ravel()
    keep = _normal_or_special(got) & _normal_or_special(want)
    assert keep.sum() > 0.9 * keep.size
    assert np.array_equal(got[keep].view(np.uint32), want[keep].view(np.uint32))


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16])
def test_divide_keeps_narrow_dtypes(dtype):
    ms.set_context(mode=ms.GRAPH_MODE)
    x = Tensor(np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)).astype(dtype)
    got, want = _Both(3)(x)
    assert got.dtype == want.dtype == dtype
    assert np.array_equal(got.astype(ms.float32).asnumpy(), want.astype(ms.float32).asnumpy())

