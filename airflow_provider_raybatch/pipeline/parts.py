"""Staged parts: how result rows are written to a run's staging folder, and read back.

Each group of result rows (``source``, ``ok``, ``record``) becomes one part::

    <staging>/outputs/<part>.<ext>   the part's output rows, in the run's output format
    <staging>/errors/<part>.<ext>    the part's error rows
    <staging>/parts/<part>.json      sidecar: the part's sources and counts; its presence commits the part

The sidecar lists the sources of the output rows first, then those of the error rows, each in file
order (``sources_in_file_order``), so that commit can take single rows out of a part
(:func:`.commit._drop_repeated_rows`). It also carries what the run report needs, kept small: when the
part was written and power-of-two histograms of its output rows' token counts (see :mod:`.report`).

A part without a sidecar (the job died while writing it) does not count and is removed on resume,
so a retry redoes at most the rows that were being staged. Commit reads only the sidecars.

No Ray here: the engine replicas (:mod:`.engine_actor`), the Ray Data sink (:mod:`.sink`) and commit
all write through :class:`PartWriter`.
"""

from __future__ import annotations

import io
import json
import uuid
from collections import Counter
from typing import Any

from airflow_provider_raybatch.pipeline import openai_batch, storage
from airflow_provider_raybatch.pipeline.commit import (
    PART_FOLDERS,
    SOURCES_IN_FILE_ORDER,
    StagedPart,
    reason_kind,
)
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


def _decode(data: bytes, output_format: OutputFormat) -> list[dict[str, Any]]:  # Any: row values.
    if output_format == "jsonl":
        return [json.loads(line) for line in data.decode().split("\n") if line]
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(data)).to_pylist()


class PartWriter:
    """Write result rows into a run's staging folder as parts, and read a part's rows back."""

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
        """The keywords that build this writer again (in an engine replica, which stages rows too)."""
        return {
            "staging_uri": self.staging_uri,
            "output_format": self.output_format,
            "count_labels": self.count_labels,
            "openai_lines": self.openai_lines,
        }

    def create_folders(self) -> None:
        for folder in PART_FOLDERS:
            filesystem, path = storage.filesystem(storage.join(self.staging_uri, folder))
            filesystem.create_dir(path, recursive=True)

    def write_part(self, rows: list[dict[str, Any]]) -> StagedPart:  # Any: row values.
        """Stage result rows (``source``, ``ok``, ``record``) as one part, its sidecar last."""
        part = f"part-{uuid.uuid4().hex}"
        outputs = [json.loads(row["record"]) for row in rows if row["ok"]]
        errors = [json.loads(row["record"]) for row in rows if not row["ok"]]
        tokens = [self.tokens_of(record) for record in outputs]
        in_file_order = [row for row in rows if row["ok"]] + [row for row in rows if not row["ok"]]
        sidecar: dict[str, Any] = {  # Any: JSON values.
            "sources": [row["source"] for row in in_file_order],
            SOURCES_IN_FILE_ORDER: True,
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
        sidecar_uri = storage.join(self.staging_uri, "parts", f"{part}.json")
        storage.write_bytes(sidecar_uri, json.dumps(sidecar).encode())
        return StagedPart(part, sidecar)

    def read_part(self, part: StagedPart) -> list[dict[str, Any]]:  # Any: row values.
        """A part's rows as :meth:`write_part` took them; its sidecar must list them in file order."""
        if not part.sidecar.get(SOURCES_IN_FILE_ORDER):
            raise ValueError(f"staged part {part.name} does not list its rows in file order.")
        records: dict[str, list[dict[str, Any]]] = {"outputs": [], "errors": []}  # Any: row values.
        for folder, name in part.sidecar["files"].items():
            data = storage.read_bytes(storage.join(self.staging_uri, folder, name))
            records[folder] = _decode(data, self.output_format)
        ok = [True] * len(records["outputs"]) + [False] * len(records["errors"])
        if len(ok) != len(part.sidecar["sources"]):
            raise ValueError(f"staged part {part.name}: {len(ok)} rows in its files, "
                             f"{len(part.sidecar['sources'])} in its sidecar.")  # fmt: skip
        return [
            {"source": source, "ok": flag, "record": json.dumps(record, ensure_ascii=False)}
            for source, flag, record in zip(
                part.sidecar["sources"], ok, records["outputs"] + records["errors"], strict=True
            )
        ]
