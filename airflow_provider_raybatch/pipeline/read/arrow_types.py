"""The Arrow types a file the job reads may hold, checked before any of its values is read.

Why: turning a cell into Python runs the code of the cell's type when that type is an extension type
registered in the process. Importing ``ray.data``, as every Ray Data worker does, registers Ray's
``ray.data.arrow_pickled_object``, whose cells are pickles: ``to_pylist`` unpickled them, so a Parquet
file that anyone could write ran its own code with the worker's rights. Some types run code even
earlier, when a schema naming them is read: pyarrow's ``arrow.py_extension_type`` (pyarrow < 21, loaded
where Ray's ``RAY_DATA_AUTOLOAD_PYEXTENSIONTYPE=1`` is set) unpickles the type itself. Hence:

* An allowlist of Arrow's built-in types, whose values are plain data, and the nested types built of
  them, rather than a list of known bad types: an extension type is refused whatever its name, and
  whether this process registered it or not (pyarrow reads an unregistered one as its storage type,
  with its name left in the field's metadata).
* A Parquet file's types are read from its footer with every extension name hidden from pyarrow
  (:func:`checked_parquet_schema`), so the check itself runs no registered type's code. Only a file
  that passes is opened by pyarrow's reader.

Ray's own ``read_parquet`` refuses Ray's pickled type only, and not where
``RAY_DATA_AUTOLOAD_PICKLE_OBJECT_SCALAR=1`` is set; this check depends on neither.
"""

from __future__ import annotations

import base64
import functools
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

#: The field metadata key that makes a field an extension type (Arrow's IPC format).
EXTENSION_NAME_KEY = b"ARROW:extension:name"
#: What the key becomes while a file's own schema is checked. As long as the key, so the serialized
#: schema stays valid; pyarrow knows no such key, so it resolves no extension type and runs no code.
_HIDDEN_EXTENSION_NAME_KEY = b"ARROW:extension:NAME"
#: Where Arrow keeps a Parquet file's Arrow schema: a footer key whose value is the base64 of the
#: schema in Arrow's IPC format; and what it becomes while the footer is opened for the check.
_ARROW_SCHEMA_KEY = b"ARROW:schema"
_HIDDEN_ARROW_SCHEMA_KEY = b"ARROW:SCHEMA"
#: The key as the footer's Thrift may write it: its length (12) as a varint, then its bytes. Writers
#: use one byte, but Thrift's compact protocol reads 12 written in up to five (``\x8c\x00``, ...), so
#: every spelling counts. The footer also holds the columns' min/max statistics, which are row values:
#: a cell that merely holds "ARROW:schema" is not a key and is not counted as one.
_KEY_LENGTHS = tuple(
    bytes([len(_ARROW_SCHEMA_KEY) | 0x80]) + b"\x80" * extra + b"\x00" for extra in range(4)
) + (bytes([len(_ARROW_SCHEMA_KEY)]),)
_HIDDEN_ARROW_SCHEMA_KEY_FIELDS = tuple(length + _HIDDEN_ARROW_SCHEMA_KEY for length in _KEY_LENGTHS)

#: The allowed types in words, for error messages.
ALLOWED_TYPES = (
    "null, bool, integers, floats, decimals, strings, binaries, dates, times, timestamps and durations, "
    "and lists, structs, maps and dictionaries of them"
)
#: ``pyarrow.types`` predicates of the allowed types that hold no other type: each cell is plain data.
_PLAIN = tuple(
    """
    is_null is_boolean is_integer is_floating is_decimal
    is_string is_large_string is_string_view
    is_binary is_large_binary is_fixed_size_binary is_binary_view
    is_date is_time is_timestamp is_duration
    """.split()
)
#: Predicates of the allowed types that hold others (each checked in turn). Not unions, run-end
#: encoded arrays or intervals: no input needs them, and Parquet stores none of them.
_NESTED = (
    "is_list",
    "is_large_list",
    "is_fixed_size_list",
    "is_list_view",
    "is_large_list_view",
    "is_struct",
    "is_map",
)
#: How much of a name or a type's text a reason quotes: both come from the file.
_QUOTED_CHARS = 200


class RefusedArrowTypeError(ValueError):
    """A file holds an Arrow type off the allowlist; the message names the column and the type."""


def check_schema(schema: pa.Schema) -> None:
    """Raise :class:`RefusedArrowTypeError` naming the first column that is, or holds, a type not
    allowed (:data:`ALLOWED_TYPES`)."""
    for field in schema:
        refused = _refused_type(field)
        if refused is not None:
            raise RefusedArrowTypeError(
                f"column {_quoted(field.name)!r} has Arrow type {_quoted(refused)}, which a file the job "
                f"reads may not use (allowed: {ALLOWED_TYPES})"
            )


def _refused_type(field: pa.Field) -> str | None:
    """The text of the first type in ``field`` (itself, or one it holds) that is not allowed, or None."""
    import pyarrow as pa

    metadata = field.metadata or {}
    for key in (EXTENSION_NAME_KEY, _HIDDEN_EXTENSION_NAME_KEY):
        if key in metadata:  # an extension type unregistered here, or hidden by checked_parquet_schema
            return f"extension<{metadata[key].decode('utf-8', 'replace')}>"
    data_type = field.type
    if isinstance(data_type, pa.BaseExtensionType):
        return f"extension<{data_type.extension_name}>"
    if pa.types.is_dictionary(data_type):  # integer indices into values of the value type
        return _refused_type(pa.field("value", data_type.value_type))
    if any(getattr(pa.types, name)(data_type) for name in _NESTED):
        children = (_refused_type(data_type.field(index)) for index in range(data_type.num_fields))
        return next((refused for refused in children if refused is not None), None)
    if any(getattr(pa.types, name)(data_type) for name in _PLAIN):
        return None
    return str(data_type)


def _quoted(text: str) -> str:
    return text if len(text) <= _QUOTED_CHARS else text[:_QUOTED_CHARS] + "..."


def checked_parquet_schema(file: bytes | pa.NativeFile) -> pa.Schema:
    """The Arrow schema pyarrow reads a Parquet file with, once every type in it is allowed.

    Reads the footer only, and runs no registered extension type's code: the Arrow schema stored in
    the footer is checked with its extension names hidden, and only when it names none is it resolved.

    :param file: the file's bytes, or a pyarrow random-access file (only its footer is read).
    :raises RefusedArrowTypeError: a column is, or holds, a type that is not allowed.
    :raises ValueError: the file has no Parquet footer that can be read (pyarrow's errors too).
    """
    return checked_parquet_footer(file)[0]


def checked_parquet_footer(
    file: bytes | pa.NativeFile, most_bytes: int | None = None
) -> tuple[pa.Schema, pq.FileMetaData]:
    """:func:`checked_parquet_schema`, and the footer parsed (pyarrow's ``metadata=`` takes it, so
    that a reader parses it once: parsed, a footer takes about 12 times its bytes).

    :param most_bytes: the longest footer read; a longer one is refused before pyarrow parses it.
        Default: any.
    :raises FooterTooLongError: the footer is longer than ``most_bytes``.
    """
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    footer, tail = _footer(pa.BufferReader(file) if isinstance(file, bytes) else file)
    if most_bytes is not None and len(footer) > most_bytes:
        raise FooterTooLongError(
            f"its footer is {len(footer):,} bytes, more than a file's may be ({most_bytes:,}); such a "
            "footer describes many small row groups: write it with fewer, larger row groups or split it "
            "into several files"
        )
    # Opening a reader resolves the stored Arrow schema, so the first one opens the footer with the key
    # renamed wherever its bytes stand, however its length is spelled (the same length: the Thrift
    # stays valid); it sees Parquet's own types only.
    hidden_footer = footer.replace(_ARROW_SCHEMA_KEY, _HIDDEN_ARROW_SCHEMA_KEY)
    # Keys are bytes as written, so this counts every one (and a cell crafted to look like one, which
    # refuses only that file). pyarrow reads the first of two; the dict of the footer's metadata keeps
    # the last, which then would be the one checked.
    if sum(hidden_footer.count(field) for field in _HIDDEN_ARROW_SCHEMA_KEY_FIELDS) > 1:
        raise RefusedArrowTypeError("its footer holds more than one Arrow schema")
    stored = (pq.ParquetFile(pa.BufferReader(_MAGIC + hidden_footer + tail)).metadata.metadata or {}).get(
        _HIDDEN_ARROW_SCHEMA_KEY
    )  # that parse is dropped here, before the next
    if stored is not None:
        try:  # strict: a lenient decoder could read other bytes than Arrow's does
            serialized = base64.b64decode(stored, validate=True)
        except ValueError as err:
            raise ValueError(f"its Arrow schema is not valid base64: {err}") from err
        hidden = serialized.replace(EXTENSION_NAME_KEY, _HIDDEN_EXTENSION_NAME_KEY)
        check_schema(pyarrow.ipc.read_schema(pa.py_buffer(hidden)))
    # The stored schema names no extension type: the schema the reader will use, resolved in full.
    parquet = open_parquet(pa.BufferReader(_MAGIC + footer + tail))
    schema = parquet.schema_arrow
    check_schema(schema)
    return schema, parquet.metadata


class FooterTooLongError(ValueError):
    """A Parquet footer longer than its reader takes; the message says so and what to do."""


def open_parquet(
    source: BinaryIO | pa.NativeFile,
    read_dictionary: list[str] | None = None,
    metadata: pq.FileMetaData | None = None,
) -> pq.ParquetFile:
    """A Parquet reader that reads Parquet's own UUID and JSON columns (Spark's, DuckDB's) as their
    storage types, fixed-size binary and string: pyarrow 18+ makes them the extension types
    ``arrow.uuid`` and ``arrow.json`` by default, which the allowlist refuses like any extension type.

    :param read_dictionary: columns to read as Arrow dictionaries (pyarrow's ``read_dictionary``).
    :param metadata: the file's footer, already parsed (:func:`checked_parquet_footer`); default:
        parsed from ``source``.
    """
    import pyarrow.parquet as pq

    if _reader_takes_extension_switch():
        return pq.ParquetFile(
            source, metadata=metadata, read_dictionary=read_dictionary, arrow_extensions_enabled=False
        )
    return pq.ParquetFile(source, metadata=metadata, read_dictionary=read_dictionary)


@functools.cache
def _reader_takes_extension_switch() -> bool:
    """Whether this pyarrow's Parquet reader can leave Parquet's UUID and JSON types unresolved."""
    import inspect

    import pyarrow.parquet as pq

    return "arrow_extensions_enabled" in inspect.signature(pq.ParquetFile).parameters


#: A Parquet file ends with its footer's length (4 bytes, little-endian) and this magic.
_MAGIC = b"PAR1"


def _footer(file: pa.NativeFile) -> tuple[bytes, bytes]:
    """A Parquet file's footer (its Thrift metadata) and the 8 bytes after it, read from its end."""
    size = file.size()
    if size < len(_MAGIC) + 8:
        raise ValueError(f"{size} bytes is too short for a Parquet file")
    file.seek(size - 8)
    tail = file.read(8)
    if tail[4:] != _MAGIC:  # also an encrypted footer ("PARE"), which the job cannot read
        raise ValueError("the file does not end with Parquet's footer")
    length = int.from_bytes(tail[:4], "little")
    if length > size - len(_MAGIC) - 8:
        raise ValueError(f"its footer claims {length} bytes, more than the file holds")
    file.seek(size - 8 - length)
    return bytes(file.read(length)), tail
