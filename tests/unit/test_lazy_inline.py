"""ZeRO-3 and MindSpore's ``@lazy_inline`` ([Note: lazy_inline key] in mindone_zero/zero3/rewrite.py).

``@lazy_inline`` compiles equal blocks once, on Ascend: what can be checked on CPU is that a
wrapped block keeps what the decorator set: it is still an instance of its class, its key
(``cell_init_args``) keeps the decorator's prefix and stays equal across equal blocks (whatever the
wrapping appends names no parameter), and ``policy="front"``'s ``no_inline`` stays. One process
in ParallelMode.DATA_PARALLEL: a group of one rank, so stage 3 really shards."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, lazy_inline, nn, ops
from mindspore.context import ParallelMode

from mindone_zero import prepare_network
from mindone_zero.core.partition import zero_spec_of

ms.set_device("CPU")
WIDTH = 8


class Block(nn.Cell):
    """A LayerNorm and a Dense (library-wrapped children) and a Parameter read by the block itself."""

    @lazy_inline
    def __init__(self, width):
        super().__init__()
        self.ln = nn.LayerNorm((width,))
        self.fc = nn.Dense(width, width)
        self.scale = Parameter(Tensor(np.ones((width,), np.float32)), name="scale")

    def construct(self, x):
        return x + self.fc(self.ln(x)) * self.scale


class FrontBlock(Block):
    @lazy_inline(policy="front")
    def __init__(self, width):
        super().__init__(width)


class Net(nn.Cell):
    def __init__(self, block, depth=3):
        super().__init__()
        self.blocks = nn.CellList([block(WIDTH) for _ in range(depth)])

    def construct(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.fixture(autouse=True)
def data_parallel():
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL)
    yield
    ms.reset_auto_parallel_context()


@pytest.mark.parametrize("block", [Block, FrontBlock])
@pytest.mark.parametrize("units", [False, True])
def test_wrapped_blocks_keep_what_lazy_inline_set(block, units):
    net = Net(block)
    keys = [b.cell_init_args for b in net.blocks]
    front = [b.__dict__.get("no_inline") for b in net.blocks]
    assert keys[0].startswith(f"lazy_inline_{block.__name__}") and len(set(keys)) == 1
    prepare_network(net, zero_stage=3, gather_units=(block,) if units else None)
    assert all(zero_spec_of(p) is not None for p in net.trainable_params())  # really sharded
    wrapped = list(net.blocks)
    assert all(isinstance(b, block) for b in wrapped)
    after = [b.cell_init_args for b in wrapped]
    assert all(k.startswith(keys[0]) for k in after)
    assert len(set(after)) == 1, after  # equal blocks keep equal keys: no parameter name in them
    assert not any(p.name in k for b, k in zip(wrapped, after) for p in b.get_parameters())
    assert [b.__dict__.get("no_inline") for b in wrapped] == front
    if block is FrontBlock:
        assert front == [False] * 3
