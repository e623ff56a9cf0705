"""Lazy, one-tensor-at-a-time readers of MindSpore checkpoint files (``.ckpt``, ``.safetensors``).

The offline combine (``convert.convert_checkpoints``) must not hold all rank files in
memory at once. Each reader indexes names, shapes and dtypes when it is opened, reading
headers only, and ``read(name)`` loads that one tensor. Not collective; no MindSpore context
is needed.

[Note: ckpt layout]
A MindSpore ``.ckpt`` file is the protobuf message ``Checkpoint`` of
``mindspore/train/checkpoint.proto``: a run of top-level field-1 records, each a
``Value {1: tag (string); 2: tensor (TensorProto {1: dims, 2: tensor_type, 3: tensor_content});
3: maptensor}``. ``save_checkpoint`` writes one record per tensor and cuts tensors larger than
512 MB into consecutive records with the same tag; a file saved with ``crc_check=True`` ends
with ``b"crc_num"`` and 10 bytes of CRC. MindSpore 2.10 offers no lazy reader for this format:
``load_checkpoint`` reads and parses the whole file even with ``choice_func`` (so one call per
tensor costs the file's size in memory and the file's parse time per tensor), and
``ckpt_to_safetensors`` also loads the whole file. ``CkptFile`` therefore walks the record
headers with seeks, decoding protobuf's wire format for these three small messages only, and
reads a tensor's bytes straight into a numpy buffer. Encrypted files and MapParameters are not
supported and are reported as unreadable.

[Note: ranged reads]
``read_rows(name, start, stop)`` of either reader returns rows ``[start, stop)`` of dim 0 of a
tensor and reads only their bytes: a tensor is stored row-major, so those rows are the contiguous
bytes ``[start * row_bytes, stop * row_bytes)`` of its data. In a ``.safetensors`` file the data
lies at ``8 + header length + data_offsets`` (the header's JSON, read when the file is opened and
checked against the file's size, so a truncated file is refused at open); in a ``.ckpt`` file it
may span several records of the same tag ([Note: ckpt layout]), so the range is cut across them.
The pretrained loader (``pretrained.load_full_checkpoint``) reads each rank's block this way.
"""
import json
import os
import struct
from typing import Dict, List, NamedTuple, Tuple, Union

import mindspore  # noqa: F401  (registers numpy's bfloat16)
import numpy as np

__all__ = ["FORMATS", "CKPT_DTYPES", "SAFETENSORS_DTYPES", "TensorInfo", "format_of_path", "open_checkpoint",
           "CkptFile", "SafetensorsFile", "row_bytes_range"]

FORMATS = ("ckpt", "safetensors")

CKPT_DTYPES = {
    "Bool": np.bool_, "Int8": np.int8, "UInt8": np.uint8, "Int16": np.int16, "UInt16": np.uint16,
    "Int32": np.int32, "UInt32": np.uint32, "Int64": np.int64, "UInt64": np.uint64,
    "Float16": np.float16, "Float32": np.float32, "Float64": np.float64,
    # Importing mindspore registers its numpy bfloat16 type under this name.
    "BFloat16": np.dtype("bfloat16"),
}
# safetensors' type names of the numpy dtypes (its own numpy binding lacks BF16; mindspore's bfloat16 has it)
SAFETENSORS_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16, "F16": np.float16,
    "BF16": np.dtype("bfloat16"), "I32": np.int32, "U32": np.uint32, "F32": np.float32, "C64": np.complex64,
    "F64": np.float64, "I64": np.int64, "U64": np.uint64,
}
_CRC_TRAILER = 17  # b"crc_num" + 10 bytes


class TensorInfo(NamedTuple):
    """Shape and dtype of one stored tensor; ``dtype`` is the file format's own type name."""

    shape: Tuple[int, ...]
    dtype: str


def format_of_path(path: str) -> str:
    """``"safetensors"`` for a ``.safetensors`` path, else ``"ckpt"`` (MindSpore's default)."""
    return "safetensors" if str(path).endswith(".safetensors") else "ckpt"


class _Corrupt(Exception):
    pass


def row_bytes_range(shape: Tuple[int, ...], itemsize: int, start: int, stop) -> Tuple[int, int]:
    """Byte range ``[begin, end)`` of rows ``[start, stop)`` of a row-major tensor of ``shape``
    ([Note: ranged reads]); ``stop`` None means the last row. A 0-d tensor has one "row": itself,
    read whole (``start`` 0, ``stop`` None).

    Raises:
        ValueError: a range outside ``[0, shape[0]]`` or a row range of a 0-d tensor.
    """
    if len(shape) == 0:
        if start != 0 or stop is not None:
            raise ValueError(f"For 'read_rows', a 0-d tensor is read whole, but got rows [{start}, {stop}).")
        return 0, itemsize
    stop = shape[0] if stop is None else stop
    if not 0 <= start <= stop <= shape[0]:
        raise ValueError(f"For 'read_rows', rows [{start}, {stop}) are outside the {shape[0]} rows of {shape}.")
    row = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
    return start * row, stop * row


def _rows_shape(shape: Tuple[int, ...], start: int, stop) -> Tuple[int, ...]:
    if len(shape) == 0:
        return ()
    return ((shape[0] if stop is None else stop) - start,) + tuple(shape[1:])


def _read_into(f, view, offset: int, path: str, name: str) -> None:
    f.seek(offset)
    if f.readinto(view) != len(view):
        raise ValueError(f"The checkpoint file '{path}' was truncated while reading {name!r}.")


def _varint(f) -> int:
    result = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise _Corrupt("the file ends inside a field header")
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return result
        shift += 7
        if shift > 63:
            raise _Corrupt("a varint is longer than 10 bytes")


def _length(f, end: int) -> int:
    n = _varint(f)
    if f.tell() + n > end:
        raise _Corrupt(f"a field of {n} bytes at offset {f.tell()} runs past its end at {end}")
    return n


def _skip(f, wire: int, end: int) -> None:
    if wire == 0:
        _varint(f)
    elif wire in (1, 5):
        f.seek(8 if wire == 1 else 4, os.SEEK_CUR)
    elif wire == 2:
        f.seek(_length(f, end), os.SEEK_CUR)
    else:
        raise _Corrupt(f"unknown protobuf wire type {wire} at offset {f.tell()}")


def _tensor_header(f, end: int) -> Tuple[List[int], str, Tuple[int, int]]:
    """Fields of a TensorProto ending at ``end``: dims, type name, (content offset, length)."""
    dims, dtype, content = [], None, None
    while f.tell() < end:
        key = _varint(f)
        field, wire = key >> 3, key & 7
        if field == 1 and wire == 0:
            dims.append(_varint(f))
        elif field == 1 and wire == 2:  # packed dims
            n = _length(f, end)
            stop = f.tell() + n
            while f.tell() < stop:
                dims.append(_varint(f))
        elif field == 2 and wire == 2:
            dtype = f.read(_length(f, end)).decode("utf-8", "replace")
        elif field == 3 and wire == 2:
            n = _length(f, end)
            content = (f.tell(), n)
            f.seek(n, os.SEEK_CUR)
        else:
            _skip(f, wire, end)
    if f.tell() != end or dtype is None or content is None:
        raise _Corrupt(f"a tensor record ending at offset {end} is incomplete")
    return dims, dtype, content


def _value_record(f, end: int):
    """(tag, tensor header) of one ``Checkpoint.Value`` ending at ``end``."""
    tag, tensor = None, None
    while f.tell() < end:
        key = _varint(f)
        field, wire = key >> 3, key & 7
        if field == 1 and wire == 2:
            tag = f.read(_length(f, end)).decode("utf-8", "replace")
        elif field == 2 and wire == 2:
            n = _length(f, end)
            tensor = _tensor_header(f, f.tell() + n)
        elif field == 3:
            raise _Corrupt(f"the record {tag!r} holds a MapParameter, which is not supported")
        else:
            _skip(f, wire, end)
    if f.tell() != end or tag is None or tensor is None:
        raise _Corrupt(f"the record ending at offset {end} has no name or no tensor")
    return tag, tensor


class CkptFile:
    """Index of a ``.ckpt`` file; ``read(name)`` loads one tensor. See [Note: ckpt layout].

    Args:
        path: the file.
        caller: function name used in error messages.

    Raises:
        ValueError: if the file is truncated, corrupted, encrypted, or holds an unsupported type.
    """

    format = "ckpt"

    def __init__(self, path: str, caller: str = "open_checkpoint"):
        self.path = path
        self.infos: Dict[str, TensorInfo] = {}
        self._chunks: Dict[str, List[Tuple[int, int]]] = {}
        try:
            self._index()
        except _Corrupt as err:
            raise ValueError(f"For '{caller}', the checkpoint file '{path}' is truncated or corrupted: "
                             f"{err}.") from None

    def _index(self) -> None:
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            end = size
            if size >= _CRC_TRAILER:
                f.seek(size - _CRC_TRAILER)
                end = size - _CRC_TRAILER if f.read(7) == b"crc_num" else size
            f.seek(0)
            last = None
            while f.tell() < end:
                if _varint(f) != 0x0A:  # field 1, length-delimited
                    raise _Corrupt(f"offset {f.tell()} does not start a checkpoint record")
                n = _varint(f)
                stop = f.tell() + n
                if stop > end:
                    raise _Corrupt(f"the record at offset {f.tell()} needs {stop - end} more bytes than the file has")
                tag, (dims, dtype, chunk) = _value_record(f, stop)
                if tag != last and tag in self._chunks:
                    raise _Corrupt(f"the name {tag!r} appears twice")
                self._chunks.setdefault(tag, []).append(chunk)
                self.infos[tag] = TensorInfo(tuple(dims), dtype)
                last = tag
        for name, info in self.infos.items():
            self._check_size(name, info)

    def _check_size(self, name: str, info: TensorInfo) -> None:
        if info.dtype == "str":
            return
        if info.dtype not in CKPT_DTYPES:
            raise _Corrupt(f"the tensor {name!r} has the unsupported type {info.dtype!r}")
        shape = () if info.shape == (0,) else info.shape  # MindSpore's loader reads dims [0] as 0-d
        self.infos[name] = TensorInfo(shape, info.dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(CKPT_DTYPES[info.dtype]).itemsize
        stored = sum(n for _, n in self._chunks[name])
        if stored != nbytes:
            raise _Corrupt(f"the tensor {name!r} of shape {shape} holds {stored} bytes instead of {nbytes}")

    def numpy_dtype(self, name: str):
        """The numpy dtype ``read(name)`` returns, or ``str`` for a string entry."""
        dtype = self.infos[name].dtype
        return str if dtype == "str" else np.dtype(CKPT_DTYPES[dtype])

    def read(self, name: str) -> Union[np.ndarray, str]:
        """The tensor ``name`` as a new numpy array (a ``str`` for string entries)."""
        chunks = self._chunks[name]
        buf = np.empty(sum(n for _, n in chunks), dtype=np.uint8)
        view, pos = memoryview(buf), 0
        with open(self.path, "rb") as f:
            for offset, n in chunks:
                _read_into(f, view[pos:pos + n], offset, self.path, name)
                pos += n
        info = self.infos[name]
        if info.dtype == "str":
            return str(np.frombuffer(buf.tobytes(), dtype=f"U{len(buf) // 4}")[0]) if len(buf) else ""
        return buf.view(CKPT_DTYPES[info.dtype]).reshape(info.shape)

    def read_rows(self, name: str, start: int = 0, stop=None) -> np.ndarray:
        """Rows ``[start, stop)`` of dim 0 of the tensor ``name`` (``stop`` None: to the end), reading
        only their bytes, across the records they span ([Note: ranged reads]); a 0-d tensor whole."""
        info, dtype = self.infos[name], self.numpy_dtype(name)
        if dtype is str:
            raise ValueError(f"For 'read_rows', {name!r} of '{self.path}' is a string entry, not a tensor.")
        begin, end = row_bytes_range(info.shape, dtype.itemsize, start, stop)
        buf = np.empty(end - begin, dtype=np.uint8)
        view, pos, chunk_start = memoryview(buf), 0, 0
        with open(self.path, "rb") as f:
            for offset, n in self._chunks[name]:
                lo, hi = max(begin, chunk_start), min(end, chunk_start + n)
                if lo < hi:
                    _read_into(f, view[pos:pos + hi - lo], offset + lo - chunk_start, self.path, name)
                    pos += hi - lo
                chunk_start += n
        return buf.view(dtype).reshape(_rows_shape(info.shape, start, stop))


class SafetensorsFile:
    """Index of a ``.safetensors`` file; ``read(name)`` loads one tensor.

    The file is opened (memory-mapped by ``safetensors``) only for the duration of each call:
    pages of a mapping that stays open count towards the process's resident memory, which
    would grow to the size of every rank file read so far.

    Args:
        path: the file.
        caller: function name used in error messages.

    Raises:
        ValueError: if ``safetensors`` cannot parse the file (truncated, corrupted).
    """

    format = "safetensors"

    def __init__(self, path: str, caller: str = "open_checkpoint"):
        from safetensors import safe_open

        self.path = path
        self._open = safe_open
        try:
            with safe_open(path, framework="np") as f:
                self.infos = {}
                for name in f.keys():
                    tensor = f.get_slice(name)
                    self.infos[name] = TensorInfo(tuple(tensor.get_shape()), tensor.get_dtype())
            self._base, self._offsets = self._data_offsets()
        except Exception as err:  # safetensors raises its own SafetensorsError and OSError
            raise ValueError(f"For '{caller}', the checkpoint file '{path}' is truncated or corrupted: "
                             f"{err}.") from None

    def _data_offsets(self) -> Tuple[int, Dict[str, Tuple[int, int]]]:
        """(where the data starts, {name: (begin, end)} relative to it), from the header's JSON,
        every range checked against the file's size ([Note: ranged reads])."""
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _Corrupt("the file is shorter than its 8-byte header length")
            n = struct.unpack("<Q", head)[0]
            if 8 + n > size:
                raise _Corrupt(f"its header of {n} bytes runs past the end of the file ({size} bytes)")
            header = json.loads(f.read(n))
        base, offsets = 8 + n, {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = (int(x) for x in entry["data_offsets"])
            if not 0 <= begin <= end or base + end > size:
                raise _Corrupt(f"the tensor {name!r} lies at bytes [{begin}, {end}) of the data, past the end of "
                               f"the file ({size - base} bytes of data)")
            offsets[name] = (begin, end)
        return base, offsets

    def numpy_dtype(self, name: str):
        """The numpy dtype of the tensor ``name``.

        Raises:
            ValueError: a dtype numpy cannot hold.
        """
        dtype = self.infos[name].dtype
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"The tensor {name!r} of '{self.path}' has the dtype {dtype}, which numpy cannot hold.")
        return np.dtype(SAFETENSORS_DTYPES[dtype])

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a numpy array."""
        with self._open(self.path, framework="np") as f:
            return f.get_tensor(name)

    def read_rows(self, name: str, start: int = 0, stop=None) -> np.ndarray:
        """Rows ``[start, stop)`` of dim 0 of the tensor ``name`` (``stop`` None: to the end), reading
        only their bytes at the header's data offsets ([Note: ranged reads]); a 0-d tensor whole.

        Raises:
            ValueError: a dtype numpy cannot hold, or stored bytes that do not match the shape.
        """
        info, dtype = self.infos[name], self.numpy_dtype(name)
        begin, end = row_bytes_range(info.shape, dtype.itemsize, start, stop)
        first, last = self._offsets[name]
        total = int(np.prod(info.shape, dtype=np.int64)) * dtype.itemsize
        if last - first != total:
            raise ValueError(f"The tensor {name!r} of '{self.path}' of shape {info.shape} and dtype {info.dtype} "
                             f"holds {last - first} bytes instead of {total}.")
        buf = np.empty(end - begin, dtype=np.uint8)
        with open(self.path, "rb") as f:
            _read_into(f, memoryview(buf), self._base + first + begin, self.path, name)
        return buf.view(dtype).reshape(_rows_shape(info.shape, start, stop))


def open_checkpoint(path: str, caller: str = "open_checkpoint"):
    """A ``CkptFile`` or ``SafetensorsFile`` for ``path``, chosen by its extension.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file cannot be parsed.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"For '{caller}', the checkpoint file '{path}' does not exist.")
    return SafetensorsFile(path, caller) if format_of_path(path) == "safetensors" else CkptFile(path, caller)
