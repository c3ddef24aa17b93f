"""RayLLMBatchOperator: one Airflow task = one LLM batch job (Ray Data + vLLM) on a Ray cluster."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

import airflow_provider_raybatch
from airflow_provider_raybatch.exceptions import BatchSpecError, RayJobNotFoundError
from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.manifest import manifest_from_log
from airflow_provider_raybatch.specs import BatchInferenceSpec
from airflow_provider_raybatch.triggers.ray import RayJobTrigger, event_for_job
from airflow_provider_raybatch.utils.events import job_failed_error, validate_event
from airflow_provider_raybatch.utils.job_ids import TaskTry
from airflow_provider_raybatch.utils.packaging import build_py_module_package

if TYPE_CHECKING:
    from airflow.sdk import Context

PIPELINE_MODULE = "airflow_provider_raybatch.pipeline"
# Spec fields that take a dict or list; after templating they may arrive as JSON text.
_JSON_PARAMS = ("sampling_params", "engine_kwargs", "replica_resources", "keep_columns", "concurrency")
_TUPLE_TEXT = re.compile(r"^\(\s*\d+\s*,\s*\d+\s*\)$")  # "(1, 4)", as a tuple renders


class RayLLMBatchOperator(BaseOperator):
    """Run LLM batch inference over a dataset on a Ray cluster and hand the output location on.

    The batch parameters (``model``, ``input_uri``, ``output_uri``, ``input_format``, ``output_format``,
    ``messages_column``, ``system_prompt``, ``user_template``, ``preprocess``, ``postprocess``,
    ``sampling_params``, ``engine_kwargs``, ``batch_size``, ``concurrency``, ``accelerator_type``,
    ``replica_resources``, ``id_column``, ``keep_columns``) are the fields of
    :class:`~airflow_provider_raybatch.specs.BatchInferenceSpec`, whose descriptions document them;
    they are validated together before anything is submitted. Dict and list parameters may be given as
    JSON text, so they can come from templates such as ``"{{ params.engine_kwargs | tojson }}"``.

    On success the task returns ``output_uri`` and pushes the XComs ``output_uri``, ``manifest``
    (the run's counts, as a dict) and ``job_id``.

    :param ray_conn_id: Airflow connection of type ``ray``. Default ``ray_default``.
    :param runtime_env: Extra Ray runtime_env for the job (``env_vars``, ``pip``, more ``py_modules``).
        The pipeline module and the modules of ``preprocess`` / ``postprocess`` are added to it.
    :param entrypoint_resources: Custom resources the job's driver needs, e.g. ``{"head": 1}``.
    :param deferrable: Wait in the triggerer (default) rather than in a worker slot.
    :param poll_interval_seconds: Seconds between job status checks. Default 10.
    """

    template_fields: Sequence[str] = (
        "model",
        "input_uri",
        "output_uri",
        "input_format",
        "output_format",
        "messages_column",
        "system_prompt",
        "user_template",
        "sampling_params",
        "engine_kwargs",
        "concurrency",
        "replica_resources",
        "accelerator_type",
        "id_column",
        "keep_columns",
    )
    template_fields_renderers = {"sampling_params": "json", "engine_kwargs": "json", "user_template": "jinja"}
    ui_color = "#cfe6ff"

    def __init__(
        self,
        *,
        model: str,
        input_uri: str,
        output_uri: str,
        input_format: str | None = None,
        output_format: str = "parquet",
        messages_column: str | None = None,
        system_prompt: str | None = None,
        user_template: str | None = None,
        preprocess: str | None = None,
        postprocess: str | None = None,
        sampling_params: dict[str, Any] | str | None = None,  # Any: vLLM SamplingParams values.
        engine_kwargs: dict[str, Any] | str | None = None,  # Any: vLLM engine arguments.
        batch_size: int = 64,
        concurrency: int | tuple[int, int] | str = 1,
        accelerator_type: str | None = None,
        replica_resources: dict[str, float] | str | None = None,
        id_column: str | None = None,
        keep_columns: list[str] | str | None = None,
        ray_conn_id: str = RayHook.default_conn_name,
        runtime_env: dict[str, Any] | None = None,  # Any: Ray runtime_env values.
        entrypoint_resources: dict[str, float] | None = None,
        deferrable: bool = True,
        poll_interval_seconds: float = 10.0,
        **kwargs: Any,  # Any: BaseOperator's arguments.
    ) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.input_uri = input_uri
        self.output_uri = output_uri
        self.input_format = input_format
        self.output_format = output_format
        self.messages_column = messages_column
        self.system_prompt = system_prompt
        self.user_template = user_template
        self.preprocess = preprocess
        self.postprocess = postprocess
        self.sampling_params = sampling_params or {}
        self.engine_kwargs = engine_kwargs or {}
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.accelerator_type = accelerator_type
        self.replica_resources = replica_resources
        self.id_column = id_column
        self.keep_columns = keep_columns
        self.ray_conn_id = ray_conn_id
        self.runtime_env = runtime_env or {}
        self.entrypoint_resources = entrypoint_resources
        self.deferrable = deferrable
        self.poll_interval_seconds = poll_interval_seconds
        self.job_id: str | None = None

    @property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    # -- spec ------------------------------------------------------------------------------------

    def build_spec(self) -> BatchInferenceSpec:
        """The validated job spec from the (rendered) parameters; raises BatchSpecError naming the field."""
        params = {name: getattr(self, name) for name in BatchInferenceSpec.model_fields}
        for name in _JSON_PARAMS:
            value = params[name]
            if not isinstance(value, str):
                continue
            text = value.strip()
            if text in ("", "null", "None"):
                del params[name]  # an unset Param rendered through a template: the spec's default
            elif name == "concurrency" and _TUPLE_TEXT.match(text):
                params[name] = tuple(int(part) for part in re.findall(r"\d+", text))
            elif name == "concurrency" and text.isdigit():
                params[name] = int(text)
            elif text[:1] in ("{", "["):
                try:
                    params[name] = json.loads(text)
                except json.JSONDecodeError as err:
                    raise BatchSpecError(f"{name}={value!r} is text but not valid JSON: {err.msg}.") from err
        if isinstance(params.get("concurrency"), list):
            params["concurrency"] = tuple(params["concurrency"])
        return BatchInferenceSpec.build(**params)

    def entrypoint(self, spec: BatchInferenceSpec) -> str:
        return f"python -m {PIPELINE_MODULE} --spec {shlex.quote(spec.model_dump_json())}"

    def _local_modules(self, spec: BatchInferenceSpec) -> list[Path]:
        """The provider package plus the DAG author's modules named by preprocess / postprocess."""
        paths = [Path(airflow_provider_raybatch.__file__).parent]
        for dotted_path in filter(None, (spec.preprocess, spec.postprocess)):
            module_name = dotted_path.partition(":")[0] if ":" in dotted_path else dotted_path.rpartition(".")[0]
            top_name = module_name.split(".")[0]
            try:
                importlib.import_module(module_name)
            except ImportError as err:
                field = "preprocess" if dotted_path == spec.preprocess else "postprocess"
                raise BatchSpecError(
                    f"{field}={dotted_path!r}: module {module_name!r} cannot be imported here ({err}); "
                    "put it beside the DAG file or in the DAGs folder so it can be shipped with the job."
                ) from err
            top = sys.modules[top_name]
            path = Path(top.__path__[0]) if hasattr(top, "__path__") else Path(top.__file__ or "")
            if path not in paths:
                paths.append(path)
        return paths

    def _runtime_env(self, hook: RayHook, spec: BatchInferenceSpec) -> dict[str, Any]:  # Any: runtime_env.
        uploaded = [hook.upload_package(build_py_module_package(path)) for path in self._local_modules(spec)]
        runtime_env = dict(self.runtime_env)
        runtime_env["py_modules"] = [*uploaded, *runtime_env.get("py_modules", [])]
        return runtime_env

    # -- lifecycle -------------------------------------------------------------------------------

    def execute(self, context: Context) -> str | None:
        spec = self.build_spec()
        self.log.info("Batch spec %s validated: %s -> %s.", spec.fingerprint(), spec.input_uri, spec.output_uri)
        ti = context["ti"]
        task_try = TaskTry(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number)
        hook = self.hook
        self.job_id = self._submit_or_attach(hook, spec, task_try)
        # Record the job id the instant it exists so it can be stopped or found even if the worker dies.
        ti.xcom_push(key="job_id", value=self.job_id)
        if self.deferrable:
            timeout = self.execution_timeout.total_seconds() if self.execution_timeout else None
            self.defer(
                trigger=RayJobTrigger(
                    job_id=self.job_id,
                    ray_conn_id=self.ray_conn_id,
                    poll_interval_seconds=self.poll_interval_seconds,
                    timeout_seconds=timeout,
                ),
                method_name="execute_complete",
                timeout=None if timeout is None else timedelta(seconds=timeout + 60),
            )
        return self.execute_complete(context, self._wait_in_worker(hook, self.job_id))

    def _submit_or_attach(self, hook: RayHook, spec: BatchInferenceSpec, task_try: TaskTry) -> str:
        submission_id = task_try.submission_id()
        try:
            existing = hook.get_job_info(submission_id)
        except RayJobNotFoundError:
            existing = None
        if existing is not None:
            self.log.info("Ray job %s exists already (%s); attaching to it.", submission_id, existing.status.value)
            return submission_id
        job_id = hook.submit_job(
            self.entrypoint(spec),
            submission_id=submission_id,
            runtime_env=self._runtime_env(hook, spec),
            metadata={**task_try.metadata(), "raybatch_spec_fingerprint": spec.fingerprint()},
            entrypoint_resources=self.entrypoint_resources,
        )
        self.log.info("Submitted Ray job %s to %s.", job_id, hook.dashboard_url)
        return job_id

    def _wait_in_worker(self, hook: RayHook, job_id: str) -> dict[str, str]:
        try:
            while True:
                info = hook.get_job_info(job_id)
                if info.status.is_terminal:
                    return event_for_job(info)
                self.log.info("Ray job %s is %s.", job_id, info.status.value)
                time.sleep(self.poll_interval_seconds)
        except BaseException:
            # Timeout, kill signal or interrupt while waiting: do not leave the batch running unowned.
            self._stop_job(hook, job_id)
            raise

    def execute_complete(self, context: Context, event: dict[str, str] | None = None) -> str:
        event = validate_event(event)
        hook = self.hook
        job_id = event["job_id"]
        if event["status"] != "success":
            raise job_failed_error(event, hook.get_job_log_tail(job_id))
        manifest = manifest_from_log(hook.get_job_logs(job_id))
        if manifest is None:
            raise job_failed_error(
                {**event, "message": f"Ray job {job_id} succeeded but printed no run manifest."},
                hook.get_job_log_tail(job_id),
            )
        ti = context["ti"]
        ti.xcom_push(key="job_id", value=job_id)
        ti.xcom_push(key="manifest", value=manifest)
        ti.xcom_push(key="output_uri", value=manifest["output_uri"])
        self.log.info(
            "Ray job %s done: %d rows in, %d out, %d failed; output at %s.",
            job_id, manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"], manifest["output_uri"],
        )  # fmt: skip
        return manifest["output_uri"]

    def _stop_job(self, hook: RayHook, job_id: str) -> None:
        try:
            if hook.get_job_status(job_id) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                hook.stop_job(job_id)
                self.log.info("Stopped Ray job %s.", job_id)
        except Exception as err:  # noqa: BLE001 - best effort while the task is already failing.
            self.log.warning("Could not stop Ray job %s: %s", job_id, err)

    def on_kill(self) -> None:
        if self.job_id:
            self._stop_job(self.hook, self.job_id)
