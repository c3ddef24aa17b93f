"""A Ray Data sink that stages result rows as parts: final-format files plus a sidecar written last.

Each block of result rows (``source``, ``ok``, ``record``) becomes one part::

    <staging>/outputs/<part>.<ext>   the block's output rows, in the run's output format
    <staging>/errors/<part>.<ext>    the block's error rows
    <staging>/parts/<part>.json      sidecar: the block's sources and counts; its presence commits the part

The sidecar also carries what the run report needs, kept small: when the part was written and
power-of-two histograms of its output rows' token counts (see :mod:`.report`).

A part without a sidecar (the job died while writing it) does not count and is removed on resume,
so a retry redoes at most the batches that were in flight. Commit reads only the sidecars.

The engine replicas write their batches' parts themselves (:meth:`StagedPartsSink.write_part`, see
:mod:`.engine_actor`); as a Ray Data sink it writes the rows that never reach the engine.
"""

from __future__ import annotations

import io
import json
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ray.data import Datasink
from ray.data.block import BlockAccessor

from airflow_provider_raybatch.pipeline import openai_batch, storage
from airflow_provider_raybatch.pipeline.commit import PART_FOLDERS, reason_kind
from airflow_provider_raybatch.pipeline.report import part_report_fields, row_tokens
from airflow_provider_raybatch.specs import ERROR_COLUMN, OutputFormat


def _encode(
    records: list[dict[str, Any]], output_format: OutputFormat, ascii_only: bool = False
) -> bytes:  # Any: row values.
    """:param ascii_only: escape every non-ASCII character, so that no reader splitting lines on
    Unicode separators (str.splitlines splits on U+2028 and U+0085) cuts a line in two."""
    if output_format == "jsonl":
        return "".join(json.dumps(record, ensure_ascii=ascii_only) + "\n" for record in records).encode()
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), buffer)
    return buffer.getvalue()


class StagedPartsSink(Datasink[None]):
    """Write result rows into a run's staging folder, one committed part per block."""

    def __init__(
        self, staging_uri: str, output_format: OutputFormat, count_labels: bool, openai_lines: bool = False
    ) -> None:
        """:param openai_lines: records are OpenAI batch output and error lines (tokens in ``usage``,
        the reason in ``error.message``), not rows."""
        self.staging_uri = staging_uri
        self.output_format = output_format
        self.count_labels = count_labels
        self.openai_lines = openai_lines
        self.extension = "parquet" if output_format == "parquet" else "jsonl"
        self.ascii_only = openai_lines  # as OpenAI's own batch output is
        self.tokens_of = openai_batch.token_counts if openai_lines else row_tokens
        self.reason_of = openai_batch.error_reason if openai_lines else (lambda record: record[ERROR_COLUMN])

    def settings(self) -> dict[str, Any]:  # Any: the constructor's keyword values.
        """The keywords that build this sink again (in an engine replica, which stages batches too)."""
        return {
            "staging_uri": self.staging_uri,
            "output_format": self.output_format,
            "count_labels": self.count_labels,
            "openai_lines": self.openai_lines,
        }

    def on_write_start(self, schema: Any = None) -> None:  # Any: pyarrow schema or None.
        for folder in PART_FOLDERS:
            filesystem, path = storage.filesystem(storage.join(self.staging_uri, folder))
            filesystem.create_dir(path, recursive=True)

    def write(self, blocks: Iterable[Any], ctx: Any) -> None:  # Any: Ray blocks and TaskContext.
        for block in blocks:
            rows = BlockAccessor.for_block(block).to_arrow().to_pylist()
            if rows:
                self.write_part(rows)

    def write_part(self, rows: list[dict[str, Any]]) -> None:  # Any: row values.
        """Stage result rows (``source``, ``ok``, ``record``) as one part, its sidecar last."""
        part = f"part-{uuid.uuid4().hex}"
        outputs = [json.loads(row["record"]) for row in rows if row["ok"]]
        errors = [json.loads(row["record"]) for row in rows if not row["ok"]]
        tokens = [self.tokens_of(record) for record in outputs]
        sidecar: dict[str, Any] = {  # Any: JSON values.
            "sources": [row["source"] for row in rows],
            "files": {},
            "rows_out": len(outputs),
            "rows_failed": len(errors),
            "tokens_in": sum(pair[0] for pair in tokens),
            "tokens_out": sum(pair[1] for pair in tokens),
            "errors_by_reason": dict(Counter(reason_kind(self.reason_of(record)) for record in errors)),
        }
        if self.count_labels:
            sidecar["generated_text_counts"] = dict(Counter(str(r.get("generated_text")) for r in outputs))
        for folder, records in (("outputs", outputs), ("errors", errors)):
            if records:
                name = f"{part}.{self.extension}"
                data = _encode(records, self.output_format, self.ascii_only)
                storage.write_bytes(storage.join(self.staging_uri, folder, name), data)
                sidecar["files"][folder] = name
        # written_at: now, when the part's data is in place
        sidecar.update(part_report_fields(outputs, tokens_of=self.tokens_of))
        # The sidecar last: until it exists the part's files do not count.
        storage.write_bytes(storage.join(self.staging_uri, "parts", f"{part}.json"), json.dumps(sidecar).encode())
