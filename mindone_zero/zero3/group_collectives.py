"""The wire formats of a ZeRO-3 gather group: how its shards and gradients travel.

[Note: gather groups]
The unit of communication at stage 3 is a group of parameters (``GatherGroup`` in gather_group.py),
as FSDP2's ``FSDPParamGroup`` is: a lone parameter is a group of one. Two methods of the group's ``waiting``
Cell move it: ``construct`` (forward: every member's full tensor from this rank's shards) and
``reduce_scatter_members`` (backward: this rank's block of the group mean of every member's
gradient). A group of one sends its shard as it is: a tensor in, a tensor out, no buffer. A group of
several packs its shards into one buffer and sends it in one collective ([Note: coalesced gathers]
in coalesce.py; [Note: packed layout] in core/packing.py), and its methods take and return tuples
in member order.

How the bytes travel is the group's wire format, an object it holds, not a branch of those
methods: ``gather_wire`` (the shards in the wire dtype, [Note: wire dtype] in
core/comm_records.py, or ZeRO++'s qwZ int8 blocks) and ``reduce_wire`` (the gradients as they are,
or ZeRO++'s qgZ int8 blocks summed in float32). Quantized formats serve groups of one only: gathers
with ZeRO++ options are never coalesced ([Note: ZeRO++ at build] in param_wrapper.py).
"""
from mindspore import nn

__all__ = ["gather_wire", "reduce_wire"]


class _PlainGather(nn.Cell):
    """All-gather in the wire dtype: cast first where it is narrower than the parameter's."""

    def __init__(self, comm, record):
        super().__init__(auto_prefix=False)
        self.comm = comm
        self.cast_before = record.cast_before_gather
        self.wire_dtype = record.wire_dtype
        self.cast_after = record.cast_after_gather  # the gathered tensors are cast to the compute dtype

    def send(self, x):
        if self.cast_before:
            x = x.astype(self.wire_dtype)
        return self.comm.all_gather(x)


class _QuantizedGather(nn.Cell):
    """ZeRO++'s qwZ: the shard all-gathered as int8 blocks and dequantized to the parameter's dtype."""

    cast_after = True  # from the parameter's dtype to the compute dtype

    def __init__(self, comm, record):
        super().__init__(auto_prefix=False)
        self.comm = comm
        self.block, self.blocks = record.block, record.blocks

    def send(self, x):
        return self.comm.all_gather_quantized(x, self.block, self.blocks)


class _PlainReduce(nn.Cell):
    """Reduce-scatter (sum) of the padded gradient in the parameter's dtype."""

    def __init__(self, comm, record):
        super().__init__(auto_prefix=False)
        self.comm = comm

    def send(self, g):
        return self.comm.reduce_scatter(g)


class _QuantizedReduce(nn.Cell):
    """ZeRO++'s qgZ: each destination's block quantized to int8, summed in float32."""

    def __init__(self, comm, record):
        super().__init__(auto_prefix=False)
        self.comm = comm
        self.block, self.blocks = record.block, record.blocks
        self.param_dtype = record.param_dtype

    def send(self, g):
        return self.comm.reduce_scatter_quantized(g, self.block, self.blocks).astype(self.param_dtype)


def gather_wire(comm, record) -> nn.Cell:
    """The forward wire format of a gather (``record``: its ``GatherRecord``) over ``comm``."""
    return (_QuantizedGather if record.quantize_weights else _PlainGather)(comm, record)


def reduce_wire(comm, record) -> nn.Cell:
    """The backward wire format of a gather's gradients over ``comm``."""
    return (_QuantizedReduce if record.quantize_grads else _PlainReduce)(comm, record)
