"""Stage 3 gathers in the dtype MindSpore's mixed precision sets (docs/guides/mixed-precision.md).

``to_float`` and ``mindspore.amp.auto_mixed_precision``'s levels O2 and O3 mark Cells with a compute
dtype, which each ZeRO-3 gather wrapper takes (O2 keeps its black list, LayerNorm here, in float32);
O1 casts around single operators inside ``construct`` and marks no Cell, so the gathers move the
parameters' own dtype. In one process the group has one rank, so this checks the gathers' dtypes and
that the sharded network computes what the unsharded one does; the collectives in those dtypes run at
N=2 in tests/dist/test_zero_parity.py (a float16 ``to_float`` layer at stage 3).
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

import parallel_modules as pm

ms.set_device("CPU")


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.norm = nn.LayerNorm((16,))
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(self.norm(self.fc1(x)))


F16, F32 = ms.float16, ms.float32
EXPECTED = {  # compute dtype of each layer's gathers
    "to_float": {"fc1": F16, "norm": F16, "fc2": F16},
    "O1": {"fc1": F32, "norm": F32, "fc2": F32},
    "O2": {"fc1": F16, "norm": F32, "fc2": F16},
    "O3": {"fc1": F16, "norm": F16, "fc2": F16},
}


def _mixed(level):
    net = Net()
    if level == "to_float":
        return net.to_float(F16), net
    return ms.amp.auto_mixed_precision(net, level), net


@pytest.mark.parametrize("level", sorted(EXPECTED))
def test_stage_3_gathers_in_the_compute_dtype_of_each_layer(level, graph_mode, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # O1's rewrite writes the rewritten code to ./rewritten_network/
    ms.set_seed(0)
    reference, _ = _mixed(level)
    ms.set_seed(0)
    mixed, inner = _mixed(level)
    names = [p.name for p in inner.trainable_params()]
    sharded = pm.shard_network(mixed)
    seen = {}
    for path, cell in sharded.cells_and_names():
        if isinstance(cell, pm.ZeroParamWrapper):
            layer = next(part for part in ("fc1", "norm", "fc2") if f"{part}." in f"{path}.")
            seen.setdefault(layer, set()).add(cell.gather.compute_dtype)
    assert seen == {layer: {dtype} for layer, dtype in EXPECTED[level].items()}, seen
    # the parameters stay float32 under their own names; only the gathered copies are cast
    assert [p.name for p in sharded.trainable_params()] == names
    assert all(p.dtype == F32 for p in sharded.trainable_params())
    x = Tensor(np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32))
    np.testing.assert_array_equal(sharded(x).asnumpy(), reference(x).asnumpy())
