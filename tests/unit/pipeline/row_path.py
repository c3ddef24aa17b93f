"""The whole row path of a batch, in process and without Ray: what ``run.run_batch`` does to each row.

parse -> prepare (preprocess, id, sampling parameters, prompt) -> duplicates -> the engine request ->
our chat-template step -> a stand-in engine -> stage (output row, postprocess, or error row) -> commit
-> publish, each through the pipeline's own functions (:mod:`airflow_provider_raybatch.pipeline.row_steps`,
``parts``, ``commit``). Only Ray Data's plumbing and vLLM are stood in for:

* between steps, rows go through an Arrow table and back, as Ray Data's blocks take them, so a column
  whose values Arrow cannot hold fails here as it would on the cluster;
* the engine answers deterministically: a ``choice`` constraint's first label (or the label named by
  ``answer_with`` in the prompt), a JSON constraint's object of the prompt's last words, else those
  words; it fails the row (ray.data.llm's error column) when the prompt asks for it with ``FAIL_ROW``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_raybatch.pipeline import row_marks, row_steps, storage
from airflow_provider_raybatch.pipeline.read import dedupe
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: A prompt holding this word makes the stand-in engine fail that row.
FAIL_ROW = "FAIL_ROW"
_STAGE_ROWS = 3  # rows per staged part in the stand-in replica: several parts per run


@dataclass
class RowPathResult:
    manifest: dict[str, Any]  # Any: JSON values.
    outputs: list[dict[str, Any]]  # Any: row values.
    errors: list[dict[str, Any]]  # Any: row values.
    engine_requests: list[dict[str, Any]]  # what reached the stand-in engine, decoded


def _through_arrow(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # Any: row values.
    """What a Ray Data block does to rows: one Arrow table, then rows again."""
    if not rows:
        return rows
    return pa.Table.from_pylist(rows).to_pylist()


def _failed(row: dict[str, Any]) -> bool:  # Any: row values.
    """Ray Data LLM's own test (stages/base.py): a row whose error column is not "" failed earlier."""
    return row.get(row_marks.INFERENCE_ERROR, "") != ""


def _render(row: dict[str, Any]) -> dict[str, Any]:  # Any: row values.
    """The chat-template step's contract (pipeline/prompt/chat_template.py): JSON messages -> one prompt, ""
    in the error column; a conversation whose roles do not alternate is rejected, as strict templates do."""
    good = {row_marks.INFERENCE_ERROR: ""}
    if row.get("messages") is None:
        return {"prompt": row.get("prompt"), **good}
    conversation = json.loads(row["messages"])
    roles = [message["role"] for message in conversation]
    if any(a == b for a, b in zip(roles, roles[1:], strict=False)):
        reason = "chat template failed: TemplateError: Conversation roles must alternate"
        return {"prompt": "", row_marks.INFERENCE_ERROR: row_marks.ROW_REASON_MARK + reason}
    parts = []
    for message in conversation:
        content = message["content"]
        if isinstance(content, list):
            content = " ".join(part.get("text", "<image>") for part in content if isinstance(part, dict))
        parts.append(f"{message['role']}: {content}")
    return {"prompt": "\n".join(parts), **good}


def _generate(row: dict[str, Any], requests: list[dict[str, Any]]) -> dict[str, Any]:  # Any: row values.
    """The stand-in engine: deterministic answers, honouring the row's own sampling parameters."""
    params = json.loads(row["sampling_params"])
    requests.append({"prompt": row["prompt"], "sampling_params": params, "source": row["source"]})
    if FAIL_ROW in (row["prompt"] or ""):
        return {row_marks.INFERENCE_ERROR: "stand-in engine: asked to fail"}
    structured = params.get("structured_outputs") or {}
    choices = structured.get("choice")
    if choices:
        wanted = [choice for choice in choices if f"answer_with {choice}" in row["prompt"]]
        text = (wanted or choices)[0]
    elif structured.get("json") is not None or structured.get("json_object"):
        text = json.dumps({"answer": " ".join((row["prompt"] or "").split()[-3:])})
    else:
        text = " ".join((row["prompt"] or "").split()[-3:])[: 8 * (params.get("max_tokens") or 16)]
    tokens = len(text.split())
    return {
        "generated_text": text,
        "num_input_tokens": len(row["prompt"].split()),
        "num_generated_tokens": tokens,
    }


def run_rows(files: dict[str, bytes], spec: BatchInferenceSpec, tmp_path: Path) -> RowPathResult:
    """Run ``files`` (name -> bytes, under ``spec.input_uri``) through the row path and commit them.

    ``spec.output_uri`` should lie under ``tmp_path``.
    """
    input_dir = tmp_path / "input"
    input_dir.mkdir(exist_ok=True)
    records = []
    for name, data in files.items():
        path = input_dir / name
        path.write_bytes(data)
        file_row = {"path": str(path), "bytes": data}
        binary = (spec.image_column,) if spec.image_column else ()
        records += row_steps.parse_file_row(
            file_row, str(input_dir), spec.resolved_input_format, binary, spec.id_column
        )
    prepared = _through_arrow([row_steps.prepare_row(record, spec) for record in records])
    rows_in = len(prepared)
    triples = ((r["id"], r["source"], r["error"]) for r in prepared)
    first, _, rows_repeated = row_marks.first_sources_of_duplicates(triples)
    prepared = dedupe.mark_duplicates_in_batch(
        pa.Table.from_pylist(prepared), dedupe.first_sources_table(first)
    ).to_pylist()

    layout = OutputLayout(spec.output_uri, spec.run_key)
    commit.open_staging(layout, spec)
    parts = PartWriter(
        layout.staging_uri,
        spec.output_format,
        count_labels=spec.openai_endpoint is None,
        openai_lines=spec.openai_endpoint is not None,
        data_uri=commit.staged_data_uri(layout),
    )
    parts.create_folders()
    rejected = [row_steps.rejected_result(row, spec) for row in prepared if row["error"] is not None]
    if rejected:
        parts.write_part(rejected)
    accepted = [row for row in prepared if row["error"] is None]
    with_images = row_steps.may_carry_images(spec)
    requests: list[dict[str, Any]] = []  # Any: decoded engine requests
    # ray.data.llm's preprocess wrapper: the request's fields laid over the row's.
    engine_rows = [{**row, **row_steps.engine_request(row, with_images=with_images)} for row in accepted]
    for row in engine_rows:
        row.pop("multimodal_data", None)  # decoded images: Ray pickles them; nothing to check here
    # Each stage takes a block (Arrow) and passes by the rows that failed before it, by Ray's test.
    rendered = _through_arrow(
        [row if _failed(row) else {**row, **_render(row)} for row in _through_arrow(engine_rows)]
    )
    finished = [row if _failed(row) else {**row, **_generate(row, requests)} for row in rendered]
    for start in range(0, len(finished), _STAGE_ROWS):
        row_steps.stage_engine_rows(finished[start : start + _STAGE_ROWS], spec, parts)

    committed = commit.write_version(layout, spec, rows_in, rewriter=parts, rows_duplicate=rows_repeated)
    manifest = {
        "version": committed.version,
        "rows_in": rows_in,
        "rows_out": committed.rows_out,
        "rows_failed": committed.rows_failed,
        "rows_duplicate": committed.rows_duplicate,
        "tokens_in": committed.tokens_in,
        "tokens_out": committed.tokens_out,
        "errors_by_reason": committed.errors_by_reason,
        "json_columns": committed.json_columns,
        "failed_rows_message": committed.failed_rows_message,
        "generated_text_counts": committed.generated_text_counts,
    }
    if committed.held:  # as pipeline/run.py: a run its failed rows fail replaces nothing
        commit.hold(layout, manifest)
    else:
        commit.publish(layout, manifest, keep_versions=False)
    return RowPathResult(
        manifest=manifest,
        outputs=read_rows(committed.outputs_uri, spec.output_format),
        errors=read_rows(committed.errors_uri, spec.output_format),
        engine_requests=requests,
    )


def read_rows(folder: str, output_format: str) -> list[dict[str, Any]]:  # Any: row values.
    """Every row of a committed folder, as a reader would get them (Parquet: one dataset)."""
    files = storage.list_files(folder)
    if not files:
        return []
    if output_format == "jsonl":
        lines = (line for path in sorted(files) for line in Path(path).read_text().split("\n"))
        return [json.loads(line) for line in lines if line]
    return pq.read_table(folder).to_pylist()
