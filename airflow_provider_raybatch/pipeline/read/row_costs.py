"""What each row of an Arrow table costs once the reader has made it a record, before it does.

A row becomes Python values (``to_pylist``) and then one JSON text (``records.row_to_json``), and both
can be far larger than the row's bytes in Arrow: JSON writes a control character as six characters,
Python holds a whole string at four bytes a character once one character is outside the Basic
Multilingual Plane (and the row's JSON text too, which holds that string), a struct's field names
are written again in every one of its values, and a table's column names in every row. So a row is
charged, from its Arrow values and without making any of them Python:

* its values in Arrow, and again in Python (a string at its own width: 1, 2 or 4 bytes a
  character), with what each Python object, dict and list takes (``parquet_plan``'s measured costs);
* its JSON text: each string's bytes plus five more for each character JSON escapes, bytes as a
  base64 data URL, a number or date at most 80 characters, the names of its columns and struct
  fields; all of it at the width of the row's widest character.

Every figure is an upper bound, computed with Arrow's vectorised kernels and numpy per column, so a
batch of ordinary rows costs a few passes over its text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read import parquet_plan

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

#: What Python takes for each value, dict and list besides their payload (``parquet_plan``'s figures).
_PY_VALUE = parquet_plan.PY_VALUE_BYTES
_PY_DICT = parquet_plan.PY_DICT_BYTES
_PY_LIST = parquet_plan.PY_LIST_BYTES
#: What a date, time, timestamp or duration takes in Python: where pandas is installed (as on Ray's
#: workers), pyarrow makes a nanosecond one a pandas ``Timestamp`` or ``Timedelta``, measured at up
#: to 375 B each with their ISO text.
_PY_TEMPORAL = 512
#: The longest JSON text of a number, date, time or duration (a 76-digit decimal with its sign and
#: point, in exponent form: 92 characters measured).
_SCALAR_JSON = 100
_DATA_URL_PREFIX = len("data:application/octet-stream;base64,") + 2


@dataclass(frozen=True, slots=True)
class _Costs:
    """Per value of an array: bytes held in Arrow and Python, JSON characters, and character width."""

    held: np.ndarray
    json: np.ndarray
    width: np.ndarray


#: The most one row may cost, and what the rows made Python at a time may: 64 MiB of ASCII text is
#: 192 MiB held (in Arrow, in Python and as JSON text).
ROW_COST_BYTES = 3 * parquet_plan.PARQUET_DECODE_BYTES


@dataclass(frozen=True, slots=True)
class RowCosts:
    """Per row of a table: the bytes it holds once a record, and those of its JSON text, at most."""

    held: np.ndarray
    text: np.ndarray


def row_costs(table: pa.Table) -> RowCosts:
    """Each row's bytes once it is Arrow, Python and JSON text, at most (see the module's docstring)."""
    import numpy as np

    rows = table.num_rows
    held = np.full(rows, _PY_DICT, dtype=np.int64)
    text = np.full(rows, 2, dtype=np.int64)
    width = np.ones(rows, dtype=np.int64)
    for name, column in zip(table.column_names, table.columns, strict=True):
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        costs = _array_costs(array)
        name_text, name_width = _name_json(name)
        held += costs.held + 2 * name_text * name_width
        text += costs.json + name_text
        width = np.maximum(width, np.maximum(costs.width, name_width))
    return RowCosts(held=held + text * width, text=text * width)


#: What a null value costs a row at most at width 1, names aside: a number's (its Python value, 16 B
#: of Arrow and its JSON text) or a struct's own (its dict and braces), whichever is more.
_NULL_VALUE_COST = max(_PY_VALUE + 16 + _SCALAR_JSON, _PY_DICT + 2)


def null_cost(values: int, names_text: int) -> int:
    """At most what a row's null cell costs read back at width 1, before the row is built: ``values``
    null values (a struct's null is a null in each field) whose names take ``names_text`` JSON
    characters (:func:`name_json_length`); each name is charged twice held and once as text."""
    return values * _NULL_VALUE_COST + 3 * names_text


def name_json_length(name: str) -> int:
    """A column's or field's name as a row is charged it: its JSON characters with colon and comma."""
    return _name_json(name)[0]


def _name_json(name: str) -> tuple[int, int]:
    """A key's JSON characters (quoted, escaped, with its colon and comma) and its width."""
    quoted = json.dumps(name, ensure_ascii=False)
    widest = max(map(ord, quoted), default=0)
    return len(quoted) + 2, 4 if widest > 0xFFFF else 2 if widest > 0xFF else 1


def _array_costs(array: pa.Array) -> _Costs:
    import numpy as np
    import pyarrow as pa

    data_type = array.type
    rows = len(array)
    if pa.types.is_dictionary(data_type):
        values = _array_costs(array.dictionary)
        # a null's index: one past the values, whose costs a null's are (the dictionary may be empty)
        null = len(array.dictionary)
        indices = array.indices.fill_null(null).to_numpy(zero_copy_only=False).astype(np.int64)
        return _Costs(
            np.append(values.held, 0)[indices] + 8,
            np.append(values.json, 4)[indices],
            np.append(values.width, 1)[indices],
        )
    if pa.types.is_string_view(data_type) or pa.types.is_binary_view(data_type):
        # Arrow's string kernels take the offsets layouts
        return _array_costs(array.cast(pa.large_string() if _is_text(data_type) else pa.large_binary()))
    if _is_text(data_type):
        return _text_costs(array)
    if _is_binary(data_type):
        lengths = _lengths(array)
        return _Costs(
            2 * lengths + _PY_VALUE, (lengths + 2) // 3 * 4 + _DATA_URL_PREFIX, np.ones(rows, np.int64)
        )
    if pa.types.is_struct(data_type):
        return _struct_costs(array)
    if pa.types.is_map(data_type) or _is_list(data_type):
        return _list_costs(array)
    # a number, boolean, date, time, duration or null
    held = _PY_TEMPORAL if pa.types.is_temporal(data_type) else _PY_VALUE + 16
    return _Costs(
        np.full(rows, held, np.int64),
        np.full(rows, _SCALAR_JSON, np.int64),
        np.ones(rows, np.int64),
    )


def _text_costs(array: pa.Array) -> _Costs:
    import numpy as np
    import pyarrow as pa

    wide_offsets = pa.types.is_large_string(array.type)
    offsets = np.frombuffer(array.buffers()[1], np.int64 if wide_offsets else np.int32)
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = array.buffers()[2]
    text = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    escaped = _counts(text, offsets, lambda part: (part < 0x20) | (part == 0x22) | (part == 0x5C))
    width = np.ones(len(array), np.int64)
    if not text.size or int(text.max()) < 0x80:  # ASCII: a byte a character
        return _Costs(2 * lengths + _PY_VALUE, lengths + 5 * escaped + 2, width)
    # UTF-8 lead bytes: 0xF0 and up start a character past U+FFFF, 0xC4 to 0xEF one past U+00FF
    width = np.where(_counts(text, offsets, lambda part: (part >= 0xC4) & (part < 0xF0)) > 0, 2, width)
    width = np.where(_counts(text, offsets, lambda part: part >= 0xF0) > 0, 4, width)
    return _Costs(lengths + lengths * width + _PY_VALUE, lengths + 5 * escaped + 2, width)


#: The bytes of text looked at a time: what counting takes beside the text is a few times this.
_COUNT_CHUNK = 4 << 20


def _counts(text: np.ndarray, offsets: np.ndarray, match: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """How many bytes of each value (``text[offsets[i]:offsets[i + 1]]``) ``match`` picks."""
    import numpy as np

    values = len(offsets) - 1
    counts = np.zeros(values, np.int64)
    for start in range(int(offsets[0]), int(offsets[-1]), _COUNT_CHUNK):
        hits = np.flatnonzero(match(text[start : min(start + _COUNT_CHUNK, int(offsets[-1]))])) + start
        if hits.size:  # each hit to the value it is in: the last one starting at or before it
            counts += np.bincount(np.searchsorted(offsets, hits, side="right") - 1, minlength=values)[:values]
    return counts


def _struct_costs(array: pa.StructArray) -> _Costs:
    import numpy as np

    rows = len(array)
    held = np.full(rows, _PY_DICT, np.int64)
    text = np.full(rows, 2, np.int64)
    width = np.ones(rows, np.int64)
    for index, child in enumerate(array.flatten()):
        costs = _array_costs(child)
        name_text, name_width = _name_json(array.type.field(index).name)
        held += costs.held + 2 * name_text * name_width
        text += costs.json + name_text
        width = np.maximum(width, np.maximum(costs.width, name_width))
    return _Costs(held, text, width)


def _list_costs(array: pa.Array) -> _Costs:
    """A list's (or a map's: a list of key and value pairs) items summed up to the list they are in."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list_view(array.type) or pa.types.is_large_list_view(array.type):
        array = array.cast(pa.large_list(array.type.value_type))
    rows = len(array)
    if pa.types.is_map(array.type):  # each pair a Python tuple and a JSON list of two
        # as a list of the pairs' indices: Arrow's list kernels do not take maps
        pairs = pa.ListArray.from_arrays(array.offsets, pa.array(range(len(array.keys)), pa.int64()))
        taken = pairs.flatten()
        parents = pc.list_parent_indices(pairs).to_numpy(zero_copy_only=False).astype(np.int64)
        keys, values = _array_costs(array.keys.take(taken)), _array_costs(array.items.take(taken))
        item = _Costs(
            keys.held + values.held + _PY_DICT,
            keys.json + values.json + 4,
            np.maximum(keys.width, values.width),
        )
    else:
        item = _array_costs(array.flatten())
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False).astype(np.int64)
    held = np.bincount(parents, weights=item.held + 8, minlength=rows).astype(np.int64) + _PY_LIST
    text = np.bincount(parents, weights=item.json + 1, minlength=rows).astype(np.int64) + 2
    width = np.ones(rows, np.int64)
    np.maximum.at(width, parents, item.width)
    return _Costs(held, text, width)


def _lengths(array: pa.Array) -> np.ndarray:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_fixed_size_binary(array.type):
        return np.where(_valid(array), array.type.byte_width, 0).astype(np.int64)
    return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _valid(array: pa.Array) -> np.ndarray:
    return array.is_valid().to_numpy(zero_copy_only=False)


def _is_text(data_type: pa.DataType) -> bool:
    return _is_any(data_type, ("is_string", "is_large_string", "is_string_view"))


def _is_binary(data_type: pa.DataType) -> bool:
    return _is_any(data_type, ("is_binary", "is_large_binary", "is_fixed_size_binary", "is_binary_view"))


def _is_list(data_type: pa.DataType) -> bool:
    kinds = ("is_list", "is_large_list", "is_fixed_size_list", "is_list_view", "is_large_list_view")
    return _is_any(data_type, kinds)


def _is_any(data_type: pa.DataType, checks: tuple[str, ...]) -> bool:
    """Whether any of ``pyarrow.types``' checks of these names holds for the type."""
    import pyarrow as pa

    return any(getattr(pa.types, check)(data_type) for check in checks)
