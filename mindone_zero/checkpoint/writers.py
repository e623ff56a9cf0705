"""Streaming writers of MindSpore checkpoint files (``.ckpt``, ``.safetensors``), one tensor at a time.

The offline combine (``convert.convert_checkpoints``) must not hold its whole output in
memory: ``mindspore.save_checkpoint`` takes every tensor in one call. These writers produce the
same bytes as ``save_checkpoint`` would for the same tensors (a safetensors file declares the
format ``transformers`` reads, [Note: safetensors metadata]), but take them one by one, so the
caller can free each tensor once it is written. Not collective; no MindSpore context is needed.

[Note: streamed ckpt]
``save_checkpoint`` writes, for each tensor in order, the protobuf message ``Checkpoint`` holding
one ``Value {1: tag; 2: TensorProto {1: dims (int64, unpacked: proto2); 2: tensor_type; 3:
tensor_content}}`` (see [Note: ckpt layout] in readers.py), cutting a tensor's bytes
into records of at most ``_CKPT_RECORD_BYTES`` with the same tag. String entries (only
accepted through ``append_dict``) come after every tensor, as ``dims [0]``, type ``"str"`` and
the UTF-32 bytes of ``numpy.array(s)``. Every field is length-delimited, so a record's header
is known from the name, shape, dtype and byte count alone, and the tensor's bytes are written
straight from its numpy buffer, with no serialised copy.

[Note: streamed safetensors]
A safetensors file is an 8-byte little-endian header length, a JSON header padded with spaces
to a multiple of 8 bytes, then the raw little-endian data. The ``safetensors`` package lays
tensors out by descending dtype (its ``Dtype`` enum order, ``_SAFETENSORS_ORDER``), then by name,
and writes the header with ``__metadata__`` first and the tensors in that same order. The header
depends only on names, shapes and dtypes, so it is written first and the tensors follow in
``write_order``.

[Note: safetensors metadata]
A safetensors header may carry ``__metadata__``; readers look at its ``"format"``. ``transformers``'
``from_pretrained`` accepts ``pt``, ``tf``, ``flax`` and ``mlx`` and refuses any other value, and
``mindone.transformers`` accepts ``pt``, ``tf``, ``flax`` and ``np``; ``mindspore.load_checkpoint``
and ``load_full_checkpoint`` do not look at it. ``mindspore.save_checkpoint`` writes ``{"format":
"ms"}``, which both ``transformers`` refuse. Every file written here carries ``{"format": "pt"}``
(``SAFETENSORS_METADATA``), what ``save_pretrained`` writes: the data is plain little-endian C-order
arrays, the layout every framework reads, so one value serves every reader and there is no option.
Only those two bytes differ from ``save_checkpoint``'s file (none when there is no tensor).
"""
import json
from typing import List, Sequence, Tuple, Union

import numpy as np

from ..core.atomic_files import atomic_file
from .readers import CKPT_DTYPES, SAFETENSORS_DTYPES

__all__ = ["TensorEntry", "CkptWriter", "SafetensorsWriter", "stream_checkpoint", "ckpt_type_name",
           "SAFETENSORS_METADATA"]

# mindspore.train.serialization.SLICE_SIZE (KB) * 1024: the record size of _write_parameter_bytes_data.
_CKPT_RECORD_BYTES = 512 * 1024 * 1024
_SAFETENSORS_NAMES = {np.dtype(v): k for k, v in SAFETENSORS_DTYPES.items()}
# Ascending, as safetensors' Dtype enum (dtypes numpy lacks left out); the data is laid out descending.
_SAFETENSORS_ORDER = ("BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64",
                      "U64")
_CKPT_NAMES = {np.dtype(v): k for k, v in CKPT_DTYPES.items()}
# What every streamed safetensors file declares ([Note: safetensors metadata]).
SAFETENSORS_METADATA = {"format": "pt"}

# (name, shape, dtype): numpy dtype for a tensor, ``str`` for a string entry (ckpt only).
TensorEntry = Tuple[str, Tuple[int, ...], Union[np.dtype, type]]


def ckpt_type_name(dtype) -> str:
    """MindSpore's ``tensor_type`` string of a numpy dtype ("Float32", ...).

    Raises:
        ValueError: for a dtype that a ``.ckpt`` file cannot hold.
    """
    name = _CKPT_NAMES.get(np.dtype(dtype))
    if name is None:
        raise ValueError(f"For 'ckpt_type_name', the dtype {np.dtype(dtype)} cannot be stored in a .ckpt file.")
    return name


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload_len: int) -> bytes:
    """Key and length of a length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(payload_len)


def _ckpt_record_header(name: str, dims: Sequence[int], type_name: str, nbytes: int) -> bytes:
    """Everything of one record but its ``nbytes`` of tensor content (see [Note: streamed ckpt])."""
    tag, tname = name.encode("utf-8"), type_name.encode("utf-8")
    tensor_head = b"".join(_varint(1 << 3) + _varint(int(d)) for d in dims)
    tensor_head += _field(2, len(tname)) + tname + _field(3, nbytes)
    tensor_len = len(tensor_head) + nbytes
    value_head = _field(1, len(tag)) + tag + _field(2, tensor_len)
    return _field(1, len(value_head) + tensor_len) + value_head + tensor_head


def _raw(array: np.ndarray) -> np.ndarray:
    """The bytes of ``array`` in C order, as a uint8 view where it is contiguous (no copy)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat.view(np.uint8)


class CkptWriter:
    """Writes a ``.ckpt`` file tensor by tensor, byte for byte as ``mindspore.save_checkpoint``.

    Tensors are written in the order of ``write``; string values are kept and written after
    every tensor on ``finish``, as ``save_checkpoint`` does with ``append_dict``.

    Args:
        f: a file opened for binary writing.
    """

    def __init__(self, f):
        self._f = f
        self._strings: List[Tuple[str, str]] = []

    def write(self, name: str, value: Union[np.ndarray, str]) -> None:
        """Append one tensor (or keep one string for ``finish``)."""
        if isinstance(value, str):
            self._strings.append((name, value))
            return
        data = _raw(value)
        type_name = ckpt_type_name(value.dtype)
        dims = tuple(value.shape)
        for start in range(0, data.size, _CKPT_RECORD_BYTES):  # an empty tensor gets no record, as in MindSpore
            chunk = data[start:start + _CKPT_RECORD_BYTES]
            self._f.write(_ckpt_record_header(name, dims, type_name, chunk.size))
            self._f.write(chunk)

    def finish(self) -> None:
        """Write the kept string entries."""
        for name, text in self._strings:
            content = np.array(text).tobytes()
            self._f.write(_ckpt_record_header(name, (0,), "str", len(content)) + content)


class SafetensorsWriter:
    """Writes a ``.safetensors`` file tensor by tensor, as ``mindspore.save_checkpoint`` would but
    with the metadata ``transformers`` reads ([Note: safetensors metadata]).

    The header is written at once from ``entries``; then ``write`` must be called for every
    entry in ``write_order`` (see [Note: streamed safetensors]).

    Args:
        f: a file opened for binary writing.
        entries: ``(name, shape, numpy dtype)`` of every tensor.

    Raises:
        ValueError: a dtype safetensors cannot hold.
    """

    def __init__(self, f, entries: Sequence[TensorEntry]):
        self._f = f
        kinds = {}
        for name, _, dtype in entries:
            kind = _SAFETENSORS_NAMES.get(np.dtype(dtype))
            if kind is None:
                raise ValueError(f"For 'SafetensorsWriter', the tensor {name!r} has the dtype {np.dtype(dtype)}, "
                                 f"which safetensors cannot store.")
            kinds[name] = kind
        ordered = sorted(entries, key=lambda e: (-_SAFETENSORS_ORDER.index(kinds[e[0]]), e[0]))
        header = {"__metadata__": dict(SAFETENSORS_METADATA)} if ordered else {}
        offset, self._expected = 0, []
        for name, shape, dtype in ordered:
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            header[name] = {"dtype": kinds[name], "shape": [int(d) for d in shape],
                            "data_offsets": [offset, offset + nbytes]}
            self._expected.append((name, tuple(int(d) for d in shape), np.dtype(dtype)))
            offset += nbytes
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        text += b" " * (-len(text) % 8)
        f.write(len(text).to_bytes(8, "little") + text)
        self._next = 0

    @property
    def write_order(self) -> List[str]:
        """The names in the order ``write`` takes them."""
        return [e[0] for e in self._expected]

    def write(self, name: str, value: np.ndarray) -> None:
        """Append the data of the next tensor of ``write_order``.

        Raises:
            ValueError: another name, shape or dtype than the header announced.
        """
        want = self._expected[self._next] if self._next < len(self._expected) else None
        got = (name, tuple(value.shape), value.dtype)
        if got != want:
            raise ValueError(f"For 'SafetensorsWriter.write', expected the tensor {want}, but got {got}.")
        self._f.write(_raw(value))
        self._next += 1

    def finish(self) -> None:
        """Check that every announced tensor was written."""
        if self._next != len(self._expected):
            raise ValueError(f"For 'SafetensorsWriter.finish', {len(self._expected) - self._next} tensors announced "
                             f"in the header were not written.")


def stream_checkpoint(path: str, fmt: str, entries: Sequence[TensorEntry], produce, on_written=None) -> str:
    """Write ``path`` tensor by tensor, atomically ([Note: atomic files] in core/atomic_files.py).

    ``produce(name)`` is called once per entry, in the order the format needs (``entries``' own
    order for ``.ckpt``, ``SafetensorsWriter.write_order`` for ``.safetensors``), and its value is
    written and dropped before the next call. The file is the one ``mindspore.save_checkpoint``
    would write for the same tensors (in ``entries``' order; a safetensors file with ``transformers``'
    metadata, [Note: safetensors metadata]) and is made read-only for its owner, as
    ``save_checkpoint`` does. Not collective.

    Args:
        path: destination file; its folder must exist.
        fmt: ``"ckpt"`` or ``"safetensors"``.
        entries: ``(name, shape, dtype)`` per tensor (dtype ``str`` for a ``.ckpt`` string entry).
        produce: name -> numpy array (or ``str``).
        on_written: called as ``on_written(name)`` after each entry is written.

    Returns:
        ``path``.

    Raises:
        Exception: whatever ``produce`` or the file system raises; ``path`` then keeps its old
            content (or stays absent) and no temporary file remains.
    """
    with atomic_file(path, "wb", read_only=True) as f:
        if fmt == "safetensors":
            writer = SafetensorsWriter(f, entries)
            order = writer.write_order
        else:
            writer = CkptWriter(f)
            order = [e[0] for e in entries]
        for name in order:
            writer.write(name, produce(name))
            if on_written is not None:
                on_written(name)
        writer.finish()
    return path
