"""The ``raybatch`` batch adapter of common.ai's ``@task.llm_batch``: the batch is one of our Ray jobs.

common.ai owns the task: it normalises the prompts, records its intent and the batch id under
``result_path/_airflow_batch_state/``, waits (deferred in its ``LLMBatchTrigger``, or polling), and
lands the results as JSONL with the XCom manifest. This adapter is what it calls for the batch
itself, and it reuses common.ai's own OpenAI adapter for both ends of the wire: the request lines
(chat completions, ``custom_id = <key>-<index>``, ``response_format`` for structured output) and the
parsing of OpenAI batch output and error lines. Between them runs our pipeline with
``openai_endpoint="/v1/chat/completions"``, which reads exactly those lines and writes exactly those
outputs, committed with ``manifest.json`` last. So nothing here translates prompts or results.

The batch id is the Ray job's submission id; its metadata carries the output folder, the request
count and common.ai's idempotency key and input fingerprint (for :meth:`find_orphaned_batch`).
common.ai reads the id back from a state file under ``result_path`` named by a hash without a
secret, which another deployment of the same DAG (or anyone who can write there) may have written:
every call on a batch id acts only on one this deployment issued (:meth:`_own_job`), and any other
reads as not found, so common.ai submits its own. For the same reason the job's folder and run key
are named by an HMAC of common.ai's key under this deployment's key (:func:`.settings.batch_key`):
another deployment's job of the same task instance never commits into this one's folder nor waits
on its staging, and a folder whose result is not the job's fails the landing (:meth:`_committed`).
common.ai builds adapters from the connection's host and password only (its dispatch), so the
trigger's adapter sees no port field and no extras: in the worker, :meth:`RayBatchAdapter.submit`
checks that the full ``ray`` connection says nothing those two fields do not, and fails naming
the field otherwise. See docs/common-ai-llm-batch.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import fields, replace
from typing import TYPE_CHECKING

from airflow.providers.common.ai.batch.base import BatchState, BatchStatus, RawResultItem, SubmitResult
from airflow.providers.common.ai.batch.openai import OpenAIBatchAdapter
from airflow.providers.common.ai.exceptions import LLMBatchLimitExceededError, LLMBatchModelMismatchError
from airflow.sdk import BaseHook, Connection

from airflow_provider_raybatch.common_ai import settings as job
from airflow_provider_raybatch.common_ai.files import iter_result_lines, write_lines
from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus, RayConnectionSettings, RayHook
from airflow_provider_raybatch.jobs import job_shipping
from airflow_provider_raybatch.jobs.committed_manifest import is_result_of, read_committed_manifest
from airflow_provider_raybatch.jobs.deployment_secret import deployment_key, engine_pool_scope
from airflow_provider_raybatch.jobs.task_tries import task_try_of
from airflow_provider_raybatch.shared.exceptions import (
    BatchSpecError,
    RayJobAlreadyExistsError,
    RayJobFailedError,
    RayJobNotFoundError,
)
from airflow_provider_raybatch.shared.job_ids import (
    MAX_SUBMISSION_ATTEMPTS,
    TaskTry,
    is_submission_id,
    issued_by,
)
from airflow_provider_raybatch.shared.json_types import ArgValue, JsonObject, RuntimeEnv
from airflow_provider_raybatch.shared.run_manifest import RunManifest
from airflow_provider_raybatch.triggers.ray import ProgressRelay
from airflow_provider_raybatch.utils.events import without_log_tail

if TYPE_CHECKING:
    from airflow.providers.common.ai.batch.base import BatchRequest
    from airflow.providers.common.ai.batch.output_schema import OutputSpec
    from airflow.sdk import Context

    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

log = logging.getLogger(__name__)

#: Ray job metadata keys (string values) this adapter writes and reads back.
KEY_META = "common_ai_idempotency_key"
FINGERPRINT_META = "common_ai_input_fingerprint"
OUTPUT_META = "raybatch_output_uri"
COUNT_META = "common_ai_request_count"
#: As common.ai's OpenAI adapter: intent time and job start are compared with this much slack.
CLOCK_SKEW_SLACK_MS = 300_000
#: Progress lines from the driver log go to the task log at most this often.
PROGRESS_INTERVAL_SECONDS = 60.0
#: A refused batch id is quoted in logs and errors up to this many characters.
_SHOWN_ID_LENGTH = 120


class RayBatchAdapter(OpenAIBatchAdapter):
    """Run a ``@task.llm_batch`` batch as an airflow-provider-raybatch Ray job (``raybatch:<model>``).

    :param api_key: the ``ray`` connection's password: the cluster's token (never logged).
    :param base_url: the ``ray`` connection's host: the dashboard address, port included
        (``http://ray-head:8265``; a bare name gets port 8265).
    :param client: a :class:`RayHook` to use instead (tests).
    """

    name = "raybatch"
    conn_types = frozenset({"ray"})
    #: No limit of Ray's: these bound what one worker builds and common.ai keeps in its task.
    max_requests = 1_000_000
    max_payload_bytes = 2 << 30
    #: One job runs one model (one engine configuration).
    allows_per_request_model = False

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: RayHook | None = None,  # or a test double
    ) -> None:
        # No OpenAI client (the parent's __init__ would build one): the wire is the Ray Jobs API.
        self._client = None
        self._connection_settings = _settings(api_key, base_url)
        self._hook: RayHook = client if client is not None else _FixedRayHook(self._connection_settings)
        self._progress: dict[str, ProgressRelay] = {}

    # -- before submitting ------------------------------------------------------------------------

    def validate_requests(
        self,
        requests: list[BatchRequest],
        *,
        model: str,
        output_spec: OutputSpec,
        idempotency_key: str,
        system_prompt: str = "",
        max_tokens: int = 1024,
        request_params: JsonObject | None = None,
        **kwargs: ArgValue,  # common.ai's batch-level context, passed on
    ) -> None:
        """Limits, one model, and the job settings, before any network call (common.ai's contract)."""
        self.check_custom_id_length(idempotency_key, len(requests))
        if len(requests) > self.max_requests:
            raise LLMBatchLimitExceededError(
                f"The raybatch adapter takes at most {self.max_requests} requests per batch; got "
                f"{len(requests)}. Split the input with .expand(), or run RayLLMBatchOperator on a file."
            )
        models = {
            self.resolve_request_model(r.get("model"), default_bare_model=model, request_index=i)
            for i, r in enumerate(requests)
        }
        if len(models) > 1:
            raise LLMBatchModelMismatchError(
                f"A raybatch batch runs one model; got {len(models)} ({sorted(models)!r}). Give each model "
                "its own task."
            )
        body_params, operator_settings = job.split_request_params(request_params)
        settings = job.job_settings(self._connection_extra(), operator_settings)
        job.build_spec(settings, model=model, input_uri="/in.jsonl", output_uri="/out", run_key="check")
        total = 0
        lines = self._iter_lines(
            requests,
            model=model,
            idempotency_key="0" * 16,
            directive=self.build_output_directive(output_spec),
            system_prompt=system_prompt,
            max_tokens=max_tokens,
            request_params=body_params,
        )
        for index, line in enumerate(lines):
            total += len(json.dumps(line).encode()) + 1
            if total > self.max_payload_bytes:
                raise LLMBatchLimitExceededError(
                    f"The raybatch adapter takes at most {self.max_payload_bytes} bytes of requests; request "
                    f"{index + 1} of {len(requests)} reached {total}. Split the input with .expand()."
                )

    # -- submit -----------------------------------------------------------------------------------

    def submit(
        self,
        requests: list[BatchRequest],
        *,
        model: str,
        idempotency_key: str,
        input_fingerprint: str,
        output_spec: OutputSpec,
        system_prompt: str = "",
        max_tokens: int = 1024,
        request_params: JsonObject | None = None,
        **kwargs: ArgValue,  # common.ai's batch-level context (completion_window: no meaning here)
    ) -> SubmitResult:
        """Write the request lines next to ``result_path``, ship the pipeline and submit the Ray job."""
        context, secret = _context(), deployment_key()
        body_params, operator_settings = job.split_request_params(request_params)
        settings = job.job_settings(self._connection_extra(context), operator_settings)
        # The folder and run key carry this deployment's key: common.ai's is the same in every deployment.
        key = job.batch_key(idempotency_key, secret)
        folder = job.batch_folder(settings, _operator_field(context, "result_path"), key)
        spec = job.build_spec(
            settings,
            model=model,
            input_uri=job.input_uri(folder, input_fingerprint),
            output_uri=job.output_uri(folder),
            run_key=job.run_key(key),
        )
        lines = self._iter_lines(
            requests,
            model=model,
            idempotency_key=idempotency_key,
            directive=self.build_output_directive(output_spec),
            system_prompt=system_prompt,
            max_tokens=max_tokens,
            request_params=body_params,
        )
        write_lines(spec.input_uri, lines)
        job_shipping.check_layout(self._hook, spec, settings.check_layout, log)
        runtime_env = job_shipping.upload_runtime_env(self._hook, spec, None, {}, engine_pool_scope())
        metadata = {
            KEY_META: idempotency_key,
            FINGERPRINT_META: input_fingerprint[:16],
            OUTPUT_META: spec.output_uri,
            COUNT_META: str(len(requests)),
            job_shipping.FINGERPRINT_KEY: spec.fingerprint(),
        }
        job_id = _submit(self._hook, task_try_of(context), secret, spec, runtime_env, metadata)
        log.info(
            "Submitted Ray job %s (%d requests, model %s): %s/#/jobs/%s; outputs at %s.",
            job_id,
            len(requests),
            model,
            self._hook.dashboard_url,
            job_id,
            spec.output_uri,
        )
        return SubmitResult(batch_id=job_id, provider_input_ref=spec.input_uri)

    def _connection_extra(self, context: Context | None = None) -> JsonObject:
        """The full ``ray`` connection's extras, after checking that host and password say it all.

        common.ai's trigger rebuilds this adapter from host and password alone; a port field or an
        extra that changes how the cluster is reached (headers, cookies, TLS) would work here and
        fail, or reach another address, there. So that fails now, naming the field.
        """
        context = context or _context()
        conn = BaseHook.get_connection(_operator_field(context, "llm_conn_id"))
        full = RayConnectionSettings.from_connection(conn)
        given = self._connection_settings
        differs = [f.name for f in fields(full) if getattr(full, f.name) != getattr(given, f.name)]
        if differs and conn.port:  # the usual cause of a base_url that differs: say which field
            differs = [
                f"port={conn.port} (the port field)" if name == "base_url" else name for name in differs
            ]
        if differs:
            raise BatchSpecError(
                f"ray connection {conn.conn_id!r}: {', '.join(differs)} would not reach common.ai's trigger, "
                "which rebuilds the adapter from the connection's host and password only. Put the port in "
                "the host (host='http://ray-head:8265', port empty) and the token in the password; extras "
                "that change how the cluster is reached (headers, cookies, verify, ca_bundle_path, "
                "timeout_seconds, retry_window_seconds) cannot be used with @task.llm_batch."
            )
        return conn.extra_dejson

    # -- while it runs ------------------------------------------------------------------------------

    def get_batch(self, batch_id: str) -> BatchState:
        """The job's status in common.ai's words; progress lines go to the task log, once a minute."""
        info = self._own_job(batch_id)
        relay = self._progress.setdefault(batch_id, ProgressRelay(batch_id, PROGRESS_INTERVAL_SECONDS, log))
        relay.relay(self._hook, info.status)
        committed = info.status in (JobStatus.FAILED, JobStatus.STOPPED) and self._committed(info) is not None
        status = batch_status(info.status, committed)
        counts = None
        if status == "cancelled":
            # Nothing was committed: every request is one the stop cancelled (common.ai's "cancelled").
            total = info.metadata.get(COUNT_META, "")
            if total.isdigit():
                counts = {"succeeded": 0, "errored": 0, "expired": 0, "cancelled": int(total)}
        message = None
        if status in ("failed", "cancelled"):
            tail = self._hook.get_job_log_tail(batch_id, lines=20) if status == "failed" else ""
            message = f"Ray job {batch_id} {info.status.value}: "
            message += f"{without_log_tail(info.message)}\n{tail}" if tail else info.message
        return BatchState(status=status, counts=counts, error_message=message)

    def cancel_batch(self, batch_id: str) -> None:
        """Stop the Ray job; rows it had staged are resumed by the next job of the same task instance."""
        self._own_job(batch_id)
        self._hook.stop_job(batch_id)

    # -- results --------------------------------------------------------------------------------------

    def iter_results(self, batch_id: str) -> Iterator[RawResultItem]:
        """The committed output and error lines of this job; none if it committed nothing (stopped).

        :raises RayJobFailedError: the job SUCCEEDED and its folder holds no result of it
            (:meth:`_committed`).
        """
        manifest = self._committed(self._own_job(batch_id))
        if manifest is None:
            return iter(())
        return self._parsed(batch_id, iter_result_lines(str(manifest.outputs_uri), str(manifest.errors_uri)))

    def _own_job(self, batch_id: str) -> JobInfo:
        """The Ray job ``batch_id`` names, once its id proves it this deployment's; else Ray's 404.

        The id must have our shape (checked before the cluster is asked) and be the one this
        deployment's key signs for the try its job's metadata names (:func:`issued_by`). In a task,
        the job must also be of that task instance (any try), as the operator's are; the triggerer
        has no task, and polls the id its task checked. A refused id is never stopped nor read:
        common.ai takes the 404 for a batch the provider no longer knows, and submits its own.

        :raises RayJobNotFoundError: (``status_code`` 404) no such job, or not this deployment's.
        """
        if not is_submission_id(batch_id):
            problem = "not a raybatch submission id"
        else:
            info = self._hook.get_job_info(batch_id)  # Ray's own 404 passes through as it is
            secret = deployment_key()
            if not issued_by(batch_id, info.metadata, secret):
                problem = "its HMAC is not this deployment's: another deployment's job, or a forged id"
            elif (task_try := _task_try()) is not None and not task_try.owns(batch_id, info.metadata, secret):
                problem = (
                    f"a job of another task instance than this one ({task_try.dag_id}.{task_try.task_id}, "
                    f"run {task_try.run_id!r}, map index {task_try.map_index})"
                )
            else:
                return info
        shown = repr(batch_id[:_SHOWN_ID_LENGTH]) + ("..." if len(batch_id) > _SHOWN_ID_LENGTH else "")
        log.warning(
            "Batch id %s is not this deployment's (%s): it reads as not found; the job is not stopped and "
            "its results are not read.",
            shown,
            problem,
        )
        raise RayJobNotFoundError(
            f"No Ray job of this deployment has the id {shown}: {problem}. common.ai submits a batch of its "
            "own; the job under that id, if any, is left alone.",
            status_code=404,
        )

    def _parsed(self, batch_id: str, lines: Iterator[tuple[str, str]]) -> Iterator[RawResultItem]:
        for where, line in lines:
            try:
                yield self._parse_result_line(json.loads(line))
            except (KeyError, IndexError, ValueError, AttributeError, TypeError) as err:
                # As common.ai's OpenAI adapter: one bad line becomes a "missing" request, not a lost batch.
                log.warning("Skipping unparsable result line %s of Ray job %s: %s", where, batch_id, err)

    def _committed(self, info: JobInfo) -> RunManifest | None:
        """The manifest this job committed at its output folder; None when it committed none there.

        A job that stopped or failed may have committed nothing: None, and common.ai counts its
        requests cancelled or fails the batch. A job that SUCCEEDED committed its result there; when
        the folder holds no result of it, an empty one would make common.ai count every request
        ``missing`` and, with its default ``fail_on_partial_error=False``, pass the task with nothing
        landed. So that fails loudly instead.

        :raises RayJobFailedError: (``status="superseded"``) the job SUCCEEDED and its folder's
            manifest is another job's, names no job, is not a complete commit, points outside the
            folder, or cannot be read. The message names the folder, the job and the other job.
        """
        output_uri = _output_uri(info)
        found = read_committed_manifest(output_uri)
        manifest = RunManifest.of(found.manifest) if found.manifest is not None else None
        problem = found.why_not if manifest is None else _not_a_result_of(manifest, info.job_id, output_uri)
        if problem is None:
            return manifest
        if info.status != JobStatus.SUCCEEDED:
            return None
        raise RayJobFailedError(
            f"Ray job {info.job_id} SUCCEEDED, but its output folder {output_uri} holds no result of it: "
            f"{problem}. Nothing is landed. Another run wrote to this folder after it (this deployment's "
            "same task instance, its DAG run re-created or cleared while the job ran), someone who can "
            "write under result_path changed it, or Airflow cannot read it (then set "
            "request_params['raybatch']['work_uri'] to a folder both reach). common.ai's state still names "
            "this job, so a retry lands the same: delete this task instance's state file under "
            "<result_path>/_airflow_batch_state/ to run the batch again.",
            job_id=info.job_id,
            status="superseded",
        )

    def find_orphaned_batch(
        self, idempotency_key: str, input_fingerprint: str, not_before: str
    ) -> str | None:
        """The newest job of this task instance with this input, started at or after ``not_before``.

        Only jobs whose submission id proves them this deployment's (the HMAC of
        :class:`TaskTry`) count: common.ai's key has no secret in it, so another deployment's job of
        the same DAG, task and run on a shared cluster would match it too.
        """
        from datetime import datetime

        task_try, secret = task_try_of(_context()), deployment_key()
        not_before_ms = (
            datetime.fromisoformat(not_before).timestamp() * 1000 - CLOCK_SKEW_SLACK_MS if not_before else 0
        )
        candidates = [
            info
            for info in self._hook.list_jobs()
            if info.metadata.get(KEY_META) == idempotency_key
            and info.metadata.get(FINGERPRINT_META) == input_fingerprint[:16]
            and (info.start_time_ms or 0) >= not_before_ms
            and task_try.owns(info.job_id, info.metadata, secret)
        ]
        newest = max(candidates, key=lambda info: info.start_time_ms or 0, default=None)
        return newest.job_id if newest is not None else None

    def close(self) -> None:
        """Nothing to release: each Jobs API call opens and closes its own client."""


def batch_status(status: JobStatus, committed: bool) -> BatchStatus:
    """A Ray job status as common.ai's :data:`BatchStatus`.

    A job that failed or was stopped after it committed its manifest has its results: common.ai
    lands them (``completed``) rather than discarding them. Without a commit, a stopped job is
    ``cancelled`` (its staged rows are resumed by the next job) and a failed one ``failed``.
    """
    if not status.is_terminal:
        return "in_progress"
    if status == JobStatus.SUCCEEDED or committed:
        return "completed"
    return "cancelled" if status == JobStatus.STOPPED else "failed"


def _submit(
    hook: RayHook,
    task_try: TaskTry,
    secret: bytes,
    spec: BatchInferenceSpec,
    runtime_env: RuntimeEnv,
    metadata: dict[str, str],
) -> str:
    """Submit under this try's first free submission id, as RayLLMBatchOperator does."""
    for attempt in range(1, MAX_SUBMISSION_ATTEMPTS + 1):
        this = replace(task_try, attempt=attempt)
        try:
            return hook.submit_job(
                job_shipping.entrypoint(spec),
                submission_id=this.submission_id(secret),
                runtime_env=runtime_env,
                metadata={**this.metadata(), **metadata},
            )
        except RayJobAlreadyExistsError:
            continue
    raise RayJobAlreadyExistsError(
        f"Ray already has jobs under all {MAX_SUBMISSION_ATTEMPTS} submission ids of this try; another "
        "deployment may share this one's [raybatch] job_identity_secret."
    )


def _settings(api_key: str | None, base_url: str | None) -> RayConnectionSettings:
    """The settings the trigger will have too: a ``ray`` connection of host and password only."""
    if not base_url:
        raise BatchSpecError(
            "the ray connection has no host: set it to the Ray dashboard's address, port included "
            "(e.g. http://ray-head:8265)."
        )
    return RayConnectionSettings.from_connection(
        Connection(conn_id="raybatch_common_ai", conn_type="ray", host=base_url, password=api_key)
    )


def _output_uri(info: JobInfo) -> str:
    """The output folder the adapter gave the job (its metadata)."""
    output_uri = info.metadata.get(OUTPUT_META)
    if not output_uri:
        raise BatchSpecError(
            f"Ray job {info.job_id} was not submitted by the raybatch common.ai adapter (no "
            f"{OUTPUT_META!r} in its metadata); common.ai's recorded batch id points elsewhere."
        )
    return output_uri


def _not_a_result_of(manifest: RunManifest, job_id: str, output_uri: str) -> str | None:
    """Why a manifest found at the job's output folder is not the job's committed result; None if it is.

    Only the job's own id counts, never the run-key fallback of a manifest without one: the folder is
    under result_path, and anyone who can write there could plant a manifest naming no job.
    """
    if manifest.job_id is None:
        return "its manifest.json names no job"
    if manifest.job_id != job_id:
        return f"its manifest.json is the commit of another Ray job, {manifest.job_id[:_SHOWN_ID_LENGTH]!r}"
    if not is_result_of(manifest, job_id, "", ""):
        return f"its manifest.json is not a complete commit (status {str(manifest.status)[:40]!r})"
    if not _results_inside(manifest, output_uri):
        return "its manifest.json points at results outside the folder"
    return None


def _results_inside(manifest: RunManifest, output_uri: str) -> bool:
    """Whether the manifest's outputs and errors are in the job's own output folder: the results are
    read from where the manifest says, and a planted one could point anywhere the worker can read."""
    folder = output_uri.rstrip("/") + "/"
    uris = (manifest.outputs_uri, manifest.errors_uri)
    return all(
        isinstance(uri, str) and uri.startswith(folder) and ".." not in uri[len(folder) :].split("/")
        for uri in uris
    )


def _task_try() -> TaskTry | None:
    """The running task's try in a worker; None in the triggerer, which runs no task."""
    try:
        context = _context()
    except RuntimeError:  # get_current_context: "no context was found"
        return None
    return task_try_of(context)


def _context() -> Context:
    """The running task's context: submit and the orphan lookup run in the worker, inside the task."""
    from airflow.sdk import get_current_context

    return get_current_context()


def _operator_field(context: Context, name: str) -> str:
    """A rendered field of the running LLMBatchOperator (the adapter is only ever called from one)."""
    value = getattr(context["task"], name, None)
    if not isinstance(value, str) or not value:
        raise BatchSpecError(
            f"the raybatch adapter runs inside common.ai's LLMBatchOperator, whose {name} it reads; the "
            f"running task {context['task'].task_id!r} has {name}={value!r}."
        )
    return value


class _FixedRayHook(RayHook):
    """A RayHook on settings given up front (common.ai passes host and password, not a conn id)."""

    def __init__(self, settings: RayConnectionSettings) -> None:
        super().__init__(ray_conn_id="raybatch_common_ai")
        self._settings = settings
