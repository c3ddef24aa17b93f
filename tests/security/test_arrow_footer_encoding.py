"""The Arrow-type check must hold however the footer's Thrift spells the ``ARROW:schema`` key.

``arrow_types.checked_parquet_schema`` hides the stored Arrow schema from pyarrow by replacing the bytes
``b"\\x0cARROW:schema"`` (a one-byte varint length, then the key) before its first open. Thrift's compact
protocol reads a length written as a longer varint too (``b"\\x8c\\x00"`` is 12), which that byte search
misses: pyarrow then resolves the stored schema at that first open and runs each registered extension
type's deserializer before any type is checked. Ray's tensor types (registered in every Ray Data worker)
``cloudpickle.loads`` metadata that is not JSON under ``RAY_DATA_AUTOLOAD_CLOUDPICKLE_TENSOR_METADATA=1``,
Ray's switch for files written by Ray 2.49-2.54; the check depends on no such switch
(docs/security.md). The check hides the key's bytes wherever they stand, and counts the key in every
spelling of its length.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.pipeline.ray_env import run_in_ray_env

_READ = """
import json, os
os.environ["RAY_DATA_AUTOLOAD_CLOUDPICKLE_TENSOR_METADATA"] = "1"  # before ray.data reads it
import ray.data  # registers Ray's extension types, as in every Ray Data worker
from airflow_provider_raybatch.pipeline.read import rows

report = {}
for name in ("plain", "long_varint"):
    with open(os.path.join(FOLDER, name + ".parquet"), "rb") as source:
        records = list(rows.parse_file(name + ".parquet", source.read(), "parquet"))
    ran = os.path.exists(MARKER)
    if ran:
        os.unlink(MARKER)
    report[name] = {"ran": ran, "records": [(r["source"], r["error"]) for r in records]}
print(json.dumps(report))
"""


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:  # Any: pickle's reduce value
        return (Path.write_text, (self.marker, "the file's code ran"))


def _forged_tensor_file(marker: Path, long_varint: bool) -> bytes:
    """A Parquet file whose column claims Ray's ``ray.data.arrow_tensor`` type, its metadata a pickle."""

    class Forged(pa.ExtensionType):
        def __init__(self) -> None:
            super().__init__(pa.list_(pa.float32()), "ray.data.arrow_tensor")

        def __arrow_ext_serialize__(self) -> bytes:
            return pickle.dumps(_Payload(marker))

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type: Any, serialized: bytes) -> Forged:  # Any: pa type
            return cls()

    column = pa.ExtensionArray.from_storage(Forged(), pa.array([[1.0, 2.0]], pa.list_(pa.float32())))
    buffer = io.BytesIO()
    pq.write_table(pa.table({"prompt": column}), buffer)
    data = buffer.getvalue()
    if not long_varint:
        return data
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - length : -8]
    assert footer.count(b"\x0cARROW:schema") == 1
    footer = footer.replace(b"\x0cARROW:schema", b"\x8c\x00ARROW:schema")  # 12 as a two-byte varint
    return data[: -8 - length] + footer + (length + 1).to_bytes(4, "little") + b"PAR1"


@pytest.mark.timeout(300)
def test_a_footer_whose_arrow_schema_key_has_a_longer_length_runs_no_type_loader(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for name, long_varint in (("plain", False), ("long_varint", True)):
        (tmp_path / f"{name}.parquet").write_bytes(_forged_tensor_file(marker, long_varint))
    code = f"FOLDER = {str(tmp_path)!r}\nMARKER = {str(marker)!r}\n{_READ}"

    report = run_in_ray_env(code)

    assert report["plain"]["ran"] is False  # the check holds for pyarrow's own footer
    assert report["long_varint"]["ran"] is False, "the file's pickle ran while its types were checked"
    [(source, error)] = report["long_varint"]["records"]
    assert source == "long_varint.parquet:0"
    assert "column 'prompt' has Arrow type extension<ray.data.arrow_tensor>" in error, error
    assert os.path.exists(marker) is False
