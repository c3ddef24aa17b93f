"""What an output's columns cost a Parquet part's footer, and the most they may cost together.

Why: a reader parses a footer of at most :data:`..read.parquet_plan.MAX_FOOTER_BYTES` (8 MiB), and
every part of an output is given the output's one schema at commit. A footer does not hold a schema's
names once: each column chunk repeats its leaf's whole path (a struct's name once for each of its
leaves), each node's name is in the Parquet schema and again in the Arrow schema pyarrow stores
(base64), and each leaf brings about 180 bytes of chunk metadata (encodings, offsets, statistics).
Counting column names and type text missed the paths: 8 files of one 115-character struct of 4,000
short leaves each were 0.96 MB of names and types, and 10 MB of footer.

:func:`field_bytes` measures a column the way pyarrow writes it (one row group, as a part is),
calibrated against pyarrow 26's real footers (``tests/unit/pipeline/test_part_schema.py`` holds it
at or above them): for 1,000 leaves, 207 B a leaf of 10-character names and 510 B of 100-character
ones (estimated 261 and 576). Statistics of text leaves would be data, not schema (their min and max
values, up to 4 KiB each): parts are written without them (:func:`.part_schema.encode_parquet`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read import parquet_plan

if TYPE_CHECKING:
    import pyarrow as pa

#: The most a part's columns may cost its footer (:func:`schema_bytes`): three quarters of what a
#: reader parses, the rest a margin for the estimate. 10,000 columns
#: of 30-character names cost about 3.3 MB (2.7 MB written).
MAX_FOOTER_SCHEMA_BYTES = parquet_plan.MAX_FOOTER_BYTES * 3 // 4
#: A node's name in the Parquet schema (once) and in the Arrow schema (base64: 4/3), as halves.
_NAME_HALVES = 5
#: A node's own fields in both schemas (type, repetition, child count).
_NODE_BYTES = 24
#: A leaf's column chunk: its path's length prefixes aside, type, encodings, codec, counts, offsets,
#: statistics of fixed-width values, encoding stats (174 B measured for an int64 of one row).
_LEAF_BYTES = 200
#: Each component of a leaf's path: its length prefix.
_PATH_PART_BYTES = 2
#: The repeated group Parquet puts between a list or map and its items (``list``, ``key_value``).
_REPEATED_GROUP = "key_value"
#: The file's own fields: version, row count, row group, creator, the schema's key.
_FILE_BYTES = 1024


class OutputTooWideError(RuntimeError):
    """The rows together have more columns than one output file's footer can describe; the message
    names the count, the size and what to do."""


def name_bytes(name: str) -> int:
    """The least a top-level column of this name costs a footer (as one leaf): before its values
    are built, what its name alone takes."""
    size = len(name.encode("utf-8", "surrogatepass"))
    return size * _NAME_HALVES // 2 + _NODE_BYTES + size + _PATH_PART_BYTES + _LEAF_BYTES


def field_bytes(field: pa.Field) -> int:
    """What a column of this Arrow field costs a footer: each node's name and fields, each leaf's
    whole path and chunk metadata."""
    return _node_bytes(field, 0)


def _node_bytes(field: pa.Field, path_bytes: int) -> int:
    """The field's node and all below it, where its ancestors' path takes ``path_bytes``."""
    import pyarrow as pa

    name = len(field.name.encode("utf-8", "surrogatepass"))
    size = name * _NAME_HALVES // 2 + _NODE_BYTES + _metadata_bytes(field)
    path_bytes += name + _PATH_PART_BYTES
    data_type = field.type
    if data_type.num_fields == 0:  # a leaf
        return size + path_bytes + _LEAF_BYTES
    if not pa.types.is_struct(data_type):  # list, map: a repeated group between it and its items
        group = len(_REPEATED_GROUP)
        size += group * _NAME_HALVES // 2 + _NODE_BYTES
        path_bytes += group + _PATH_PART_BYTES
    children = (data_type.field(index) for index in range(data_type.num_fields))
    return size + sum(_node_bytes(child, path_bytes) for child in children)


def _metadata_bytes(field: pa.Field) -> int:
    """A field's key-value metadata, stored in the Arrow schema (base64)."""
    if not field.metadata:
        return 0
    return sum(len(key) + len(value) + 8 for key, value in field.metadata.items()) * 3 // 2


def schema_bytes(fields: Iterable[pa.Field]) -> int:
    """What a footer of these columns (one row group) takes, as :func:`field_bytes` counts them."""
    return _FILE_BYTES + sum(field_bytes(field) for field in fields)


def refusal(columns: int, size: int, what: str) -> OutputTooWideError | None:
    """The error for ``what`` (``the run's outputs``, ``a part's rows``) whose ``columns`` cost a
    footer ``size`` bytes, or None where that is within :data:`MAX_FOOTER_SCHEMA_BYTES`."""
    if size <= MAX_FOOTER_SCHEMA_BYTES:
        return None
    return OutputTooWideError(
        f"{what} have {columns:,} columns that take about {size:,} bytes to describe in a Parquet "
        f"file's footer, more than one output file can describe ({MAX_FOOTER_SCHEMA_BYTES:,}): the rows "
        "bring different columns (input files with keys of their own, nested objects with many keys, "
        "or a preprocess or postprocess that adds keys), and every output file names all of them. Keep "
        "the columns the output needs with keep_columns, or give the rows one set of columns."
    )
