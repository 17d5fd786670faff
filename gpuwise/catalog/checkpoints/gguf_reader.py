"""GGUF headers through the gguf package's GGUFReader, bounded against hostile files.

GGUFReader memory-maps the file and views each tensor in place (no tensor is loaded into
RAM). On its own it trusts the counts in the header: an array length past the end of the file
makes it loop forever on empty reads. The subclass below checks every read against the file
size and every count against the bytes left, so a malformed file fails fast with a clear error.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuwise.catalog.checkpoints.gguf_config import config_from_gguf, metadata_values
from gpuwise.catalog.checkpoints.records import (
    MAX_FILE_BYTES,
    Checkpoint,
    QuantisedWeight,
    StoredTensor,
)
from gpuwise.errors import GpuwiseError
from gpuwise.files import regular_file, shown

INSTALL_HINT = "pip install 'gpuwise[checkpoints]' (or: pip install gguf)"
CORRUPT_HINT = "the file is truncated or corrupt; download it again"
MAX_ARRAY = 1 << 24  # elements in one metadata array: real vocabularies hold ~256K
MAX_NESTING = 4  # arrays of arrays
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 50  # far beyond any tensor, far below int64 overflow
PLAIN_TYPES = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}


class _Malformed(Exception):
    """Raised inside the bounded reader; turned into a GpuwiseError by read_gguf."""


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise GpuwiseError("reading a .gguf file needs the gguf package", INSTALL_HINT) from None
    return gguf


def _bounded_reader_class(gguf: Any) -> Any:
    import numpy as np

    value_type = gguf.GGUFValueType
    scalar_sizes = {t: np.dtype(d).itemsize for t, d in gguf.GGUFReader.gguf_scalar_to_np.items()}

    class BoundedReader(gguf.GGUFReader):  # type: ignore[misc,name-defined]
        _depth = 0

        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            count, offset = int(count), int(offset)
            end = offset + np.dtype(dtype).itemsize * count
            if offset < 0 or count < 0 or end > self.data.size:
                raise _Malformed(f"the header points past the end of the file (byte {end:,} of "
                                 f"{self.data.size:,}): truncated")
            return super()._get(offset, dtype, count, override_order)

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
            if raw_type != value_type.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            item_type = int(self._get(orig_offs, np.uint32)[0])
            length = int(self._get(orig_offs + 4, np.uint64)[0])
            least = 8 if item_type == value_type.STRING else scalar_sizes.get(item_type, 12)
            _check_array(length, least, self.data.size - orig_offs, self._depth)
            if self.byte_order == "I" and item_type in scalar_sizes:
                return self._scalar_array(orig_offs, item_type, length)
            if self.byte_order == "I" and item_type == value_type.STRING:
                return self._string_array(orig_offs, length)
            self._depth += 1
            try:
                return super()._get_field_parts(orig_offs, raw_type)
            finally:
                self._depth -= 1

        # gguf walks arrays one element at a time (seconds for a 128K vocabulary); gpuwise
        # needs only the numbers and the lengths, so scalars are one view and strings a skip.
        def _scalar_array(self, offs: int, item_type: int, length: int) -> Any:
            head = [self._get(offs, np.uint32), self._get(offs + 4, np.uint64)]
            values = self._get(offs + 12, gguf.GGUFReader.gguf_scalar_to_np[item_type], length)
            return 12 + int(values.nbytes), [*head, values], [2], [value_type.ARRAY, item_type]

        def _string_array(self, offs: int, length: int) -> Any:
            head = [self._get(offs, np.uint32), self._get(offs + 4, np.uint64)]
            end = _strings_end(self.data, offs + 12, length)
            return end - offs, head, [], [value_type.ARRAY, value_type.STRING]

        def _build_fields(self, offs: int, count: int) -> int:
            # each entry: key length + type + one byte, at least
            _check_room(int(count), 13, self.data.size - offs, "metadata entries")
            return int(super()._build_fields(offs, count))

        def _build_tensor_info(self, offs: int, count: int) -> Any:
            # each: name length, dims, type, offset
            _check_room(int(count), 24, self.data.size - offs, "tensors")
            offs, fields = super()._build_tensor_info(offs, count)
            for field in fields:
                _check_tensor_info(gguf, field)
            return offs, fields

    return BoundedReader


def _strings_end(data: Any, at: int, length: int) -> int:
    """Where an array of `length` GGUF strings (a u64 length, then the bytes) that starts at
    `at` ends; a string past the end of the file fails."""
    buf, size = memoryview(data), data.size
    for _ in range(length):
        if at + 8 > size:
            raise _Malformed("a string array runs past the end of the file: truncated")
        at += 8 + int.from_bytes(buf[at : at + 8], "little")
    if at > size:
        raise _Malformed("a string array runs past the end of the file: truncated")
    return at


def _check_array(length: int, least: int, room: int, depth: int) -> None:
    """Refuse a metadata array of `length` elements, `least` bytes each at least, that cannot
    fit in the `room` bytes left, or one nested `depth` arrays deep past MAX_NESTING."""
    if length > MAX_ARRAY or length * least > room:
        raise _Malformed(f"a metadata array claims {length:,} elements, more than the file "
                         "can hold")
    if depth >= MAX_NESTING:
        raise _Malformed("metadata arrays nested too deep")


def _check_room(count: int, least: int, room: int, what: str) -> None:
    """Refuse a header count whose entries, `least` bytes each, cannot fit in `room` bytes."""
    if count * least > room:
        raise _Malformed(f"the header claims {count:,} {what}, more than the file can hold")


def _check_tensor_info(gguf: Any, field: Any) -> None:
    """Refuse absurd shapes and unknown types before GGUFReader multiplies them out."""
    _len, _name, n_dims, dims, raw_type, _offset = field.parts
    name = field.name[:80]
    if int(n_dims[0]) > MAX_DIMS:
        raise _Malformed(
            f"tensor {name!r} has {int(n_dims[0])} dimensions (GGML allows {MAX_DIMS})"
        )
    elements = 1
    for d in dims.tolist():
        elements *= int(d)
    if elements > MAX_ELEMENTS:
        raise _Malformed(f"tensor {name!r} has an absurd shape {dims.tolist()}")
    try:
        qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
    except ValueError:
        raise _Malformed(f"tensor {name!r} has unknown ggml type {int(raw_type[0])}") from None
    block, _size = gguf.GGML_QUANT_SIZES[qtype]
    if dims.size and int(dims[0]) % block:
        raise _Malformed(f"tensor {name!r} row of {int(dims[0])} is not a whole number of "
                         f"{qtype.name} blocks of {block}")


def _open(path: Path) -> Any:
    regular_file(path, "GGUF file", MAX_FILE_BYTES, CORRUPT_HINT)
    gguf = _gguf()
    reader_class = _bounded_reader_class(gguf)
    try:
        return gguf, reader_class(str(path), "r")
    except _Malformed as exc:
        raise GpuwiseError(f"{shown(path)} is not a valid GGUF file: {exc}", CORRUPT_HINT) from None
    except OSError as exc:
        raise GpuwiseError(f"cannot read {shown(path)}: {exc.strerror or exc}",
                           "check the path") from None
    except Exception as exc:  # anything the reader trips on is a malformed file
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise GpuwiseError(f"{shown(path)} is not a valid GGUF file ({text})", CORRUPT_HINT) from None


def _nominal_bits(type_name: str, block: int, size: int) -> int:
    match = re.search(r"(\d+)", type_name)
    return int(match.group(1)) if match else max(1, round(8 * size / block))


def read_gguf(path: Path) -> Checkpoint:
    """Every tensor's exact stored bytes (GGML block sizes), and the model's config."""
    gguf, reader = _open(path)
    tensors, quantised = [], []
    for t in reader.tensors:
        block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGML lists dims fastest first
        elements = int(t.n_elements)
        stored = elements // block * size
        type_name = t.tensor_type.name
        tensors.append(StoredTensor(t.name, type_name, shape, stored))
        if type_name not in PLAIN_TYPES:
            bits = _nominal_bits(type_name, block, size)
            quantised.append(QuantisedWeight(t.name, type_name, bits, shape, elements, block,
                                             stored, (t.name,)))
    meta = metadata_values(gguf, reader)
    config = config_from_gguf(meta, {t.name: t for t in tensors}, path)
    return Checkpoint(str(path), "gguf", tuple(tensors), tuple(quantised), config,
                      "GGUF metadata", meta, (path.name,))
