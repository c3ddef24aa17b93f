"""RayLLMBatchOperator: one Airflow task = one LLM batch job (Ray Data + vLLM) on a Ray cluster."""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import jinja2
import pendulum
from airflow.sdk import Asset, BaseOperator, conf

from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus, RayHook
from airflow_provider_raybatch.jobs import job_shipping
from airflow_provider_raybatch.jobs.deployment_secret import deployment_key, engine_pool_scope
from airflow_provider_raybatch.jobs.job_shipping import PIPELINE_MODULE as PIPELINE_MODULE  # re-exported
from airflow_provider_raybatch.jobs.task_tries import submission_order, task_try_of, try_number_of
from airflow_provider_raybatch.links import (
    DASHBOARD_URL_XCOM_KEY,
    JOB_ID_XCOM_KEY,
    BatchOutputLink,
    RayJobLink,
    RunReportLink,
)
from airflow_provider_raybatch.operators import (
    arguments,
    job_results,
    mapped_tasks,
    partition_dates,
    written_values,
)
from airflow_provider_raybatch.operators.job_choice import Start, choose_start
from airflow_provider_raybatch.operators.spec_params import SPEC_PARAMETERS as SPEC_PARAMETERS  # re-exported
from airflow_provider_raybatch.operators.spec_params import rendered_flag, spec_from_params
from airflow_provider_raybatch.shared.exceptions import (
    BatchSpecError,
    RayHookError,
    RayJobNotFoundError,
)
from airflow_provider_raybatch.shared.job_ids import TaskTry
from airflow_provider_raybatch.shared.json_types import ArgValue, JsonObject, Kwargs, RuntimeEnv
from airflow_provider_raybatch.shared.manifest import describe_engine_pool, describe_timings
from airflow_provider_raybatch.shared.run_manifest import DryRunManifest, RunManifest
from airflow_provider_raybatch.shared.specs import (
    DEFAULT_MAX_FAILED_FRACTION,
    DEFAULT_MODEL_CACHE_DIR,
    BatchInferenceSpec,
)
from airflow_provider_raybatch.triggers import poll_pace
from airflow_provider_raybatch.triggers.ray import (
    DEFAULT_PROGRESS_INTERVAL_SECONDS,
    ProgressRelay,
    RayJobTrigger,
    StatusLine,
    event_for_job,
    settle_deadline,
)
from airflow_provider_raybatch.utils.events import job_failed_error, validate_event

if TYPE_CHECKING:
    from pathlib import Path

    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Context
    from airflow.sdk.definitions.mappedoperator import MappedOperator, OperatorPartial

#: Key under which the job id is kept in Airflow's task state store across tries.
JOB_ID_STATE_KEY = "raybatch_job_id"
#: How long a superseded job may take to stop before a new job takes over its staging folder.
STOP_WAIT_SECONDS = 120.0
#: The context's datetimes a test of validate() may write as text.
_CONTEXT_DATES = ("logical_date", "data_interval_start", "data_interval_end", "run_after")
#: How long after Airflow's deferral deadline Airflow itself gives up on the trigger: the trigger
#: acts at the deadline (stops the job, fires an event), so Airflow's timeout is only a backstop.
DEFERRAL_GRACE_SECONDS = 60.0
#: A job this try attached to that stopped within this long of the attach was stopped by the earlier
#: try's own cleanup (a clear or mark-failed of that try races this try's start): run again. Stopped
#: later, someone stopped it on purpose (``ray job stop``): the task fails.
CLEANUP_RACE_SECONDS = 60.0
#: Retry window of the calls that clean up after a failure (stop, log tail): short, the task is failing.
CLEANUP_RETRY_WINDOW_SECONDS = 30.0
#: Airflow's ``next_method`` when a deferred task is resumed only to fail: its deferral timeout
#: passed or its trigger crashed (airflow.sdk.bases.operator.TRIGGER_FAIL_REPR).
_TRIGGER_FAIL = "__fail__"
#: Added to the error of a job stopped while this try waited on it, which this try did not stop.
_STOPPED_FROM_OUTSIDE = (
    " It was stopped from outside this task: `ray job stop`, the dashboard, an earlier try's cleanup, or "
    "another Airflow deployment that shares this one's [raybatch] job_identity_secret (or [core] "
    "fernet_key) and runs this DAG with the same run id: each deployment needs a secret of its own."
)

#: Added instead when this task stopped it: Airflow killed the task (SIGTERM, a timeout), and its
#: ``on_kill`` stops the job rather than leave it running unowned.
#: Jobs this process asked Ray to stop. ``airflow dags test`` and ``tasks test`` resume a deferred task
#: after its (inline) trigger on another copy of the operator than the one ``on_kill`` ran on, so the
#: copy's own record would say a stop it made came from outside.
_STOPS_ASKED_HERE: set[str] = set()
_STOPPED_BY_THIS_TASK = (
    " This task stopped it: Airflow ended the task (it was killed, marked failed or timed out), and the "
    "task stops its job rather than leave it running. A retry resumes from the rows it staged."
)


class RayLLMBatchOperator(BaseOperator, metaclass=arguments.NamesMissingArguments):
    """Run LLM batch inference over a dataset on a Ray cluster and hand the output location on.

    The batch parameters (``model``, ``input_uri``, ``output_uri``, ``input_format``, ``output_format``,
    ``openai_endpoint``,
    ``messages_column``, ``system_prompt``, ``user_template``, ``image_column``, ``image_size``,
    ``image_max_side``, ``image_allowed_hosts``, ``image_allowed_local_path``,
    ``image_allowed_s3_prefixes``, ``preprocess``, ``postprocess``,
    ``sampling_params``, ``engine_kwargs``, ``batch_size``, ``concurrency``, ``max_concurrent_batches``,
    ``accelerator_type``,
    ``replica_resources``, ``id_column``, ``keep_columns``, ``max_failed_fraction``, ``max_failed_rows``)
    are the fields of
    :class:`~airflow_provider_raybatch.shared.specs.BatchInferenceSpec`, whose descriptions document them;
    they are validated together before anything is submitted. Dict and list parameters may be given as
    JSON text, so they can come from templates such as ``"{{ params.engine_kwargs | tojson }}"``.

    On success the task returns ``output_uri`` and pushes the XComs ``output_uri``, ``manifest``
    (the run's counts, as a dict) and ``job_id``.

    :param max_failed_fraction: Fail the task (``RayBatchRowsFailedError``) when more than this share of
        the distinct rows failed: error rows less duplicate ids over rows in less duplicate ids (an id
        counts once, whichever of its rows failed). Default 0.1. Such a run commits nothing: the
        output's current version stays, the run's outputs, errors and report are kept for a look, and
        the ``manifest`` XCom says where; no output Asset event is emitted. A retry with looser
        thresholds (nothing else changed) commits those rows without generating them again; any
        other retry starts afresh. A run whose every row failed always fails; an empty input never
        does. Templated.
    :param max_failed_rows: Also fail the task when more than this many rows failed (duplicate ids not
        counted). Default None: only ``max_failed_fraction`` applies. Templated.
    :param ray_conn_id: Airflow connection of type ``ray``. Default ``ray_default``.
    :param aws_conn_id: Airflow AWS connection whose credentials, region and ``endpoint_url`` the job
        uses for ``s3://`` input, output and model (for an S3-compatible store too). They wait in the
        cluster's in-memory store for the job's driver, which deletes them when it ends; never in the
        job's entrypoint, environment, metadata or any node's disk (pipeline/credentials.py). Unset (the
        default and the better choice where possible): the cluster's own credentials, e.g. an IAM role.
        An assumed role's short-lived credentials must outlast the job.
    :param model_cache_dir: Where each node keeps an ``s3://`` model it fetched (with ``aws_conn_id``):
        a folder only the Ray user can write (made 0700 when missing; another user's, a link or one
        others can write fails the job). Copies are private to the Ray user and checked against the
        bucket's listing (ETags) before each run; see docs/security.md.
    :param compile_cache_dir: Where each GPU node keeps vLLM's compiled graphs and Triton's kernels
        between runs, e.g. a persistent volume: a daily run then skips torch.compile and the kernel
        builds (tens of seconds per replica). Unset: the nodes' defaults (``~/.cache/vllm``,
        ``~/.triton/cache``); either way the second run on a node finds the first run's kernels.
        vLLM runs what it holds: a folder only the Ray user can write (made 0700 when missing; another
        user's, a link or one others can write fails the job); see docs/security.md.
    :param keep_warm_seconds: Run on a warm engine pool: use the engine replicas that an earlier job
        with the same model and engine settings left running (or start them), and keep them this many
        seconds after the last job leaves them, then free the GPUs. A backfill or several small daily
        DAGs on one model then pay the engine start-up once. Unset (default): the job starts its own
        engines and stops them when it ends. See docs/warm-engines.md.
    :param output_asset: An Asset (or its URI) for this batch's output: each successful run emits an
        event on it, with extras ``output_uri`` (this run's), ``manifest_uri``, ``rows_in``,
        ``rows_out``, ``rows_failed``, ``version`` and ``job_id``, so other DAGs can be scheduled on it.
    :param input_asset: An Asset (or its URI) for the input, recorded as the task's inlet (lineage).
    :param check_layout: Before submitting, check that the planned replicas fit the cluster's alive
        nodes and fail at once if not (default). Turn off for a cluster whose worker groups scale
        up from zero, where the nodes appear only once the job asks for them.
    :param runtime_env: Extra Ray runtime_env for the job (``env_vars``, ``pip``, more ``py_modules``).
        The pipeline module, the packages of ``preprocess`` / ``postprocess`` (without hidden files,
        private keys or dependency folders: shared/packaging.py) and the job package holding the spec
        (``raybatch_job``) are added to it.
    :param entrypoint_resources: Custom resources the job's driver needs, e.g. ``{"head": 1}``.
    :param keep_versions: Keep earlier committed versions of ``output_uri`` (default: a rerun replaces them).
    :param dry_run: Run everything but the engine, to check a day's or a backfill's input before paying
        for GPUs: every row is read, validated and deduped, every prompt rendered with the model's chat
        template and tokenized, on CPUs. Writes ``manifest.json`` and ``report.html`` under
        ``output_uri/_dry_runs/<run_key>/`` (rows, rows that would fail by reason, duplicate ids, prompt
        tokens with a histogram, an estimate of engine time and GPU-seconds) and returns that folder;
        commits nothing, emits no output Asset event. Fails, like a real run, when the rows that would
        fail are over ``max_failed_fraction`` / ``max_failed_rows``.
    :param dry_run_rows_per_second: The throughput a dry run estimates engine time with; unset: the
        rows per second of the last run committed at ``output_uri``, if any.
    :param reuse_earlier_result: A retry or clear of a run that committed with the same parameters
        takes that version instead of paying for the same rows again (default): its job checks on the
        cluster that the input files, the code, the model and the engine are as they made it, and
        generates nothing (else it generates again, its log saying what changed). So too when Ray no
        longer knows the earlier job (a restarted cluster). Set False to always run again. Templated:
        ``"{{ params.reuse_earlier_result }}"`` lets a run's conf turn it off; the rendered text is
        ``True`` / ``False`` (also ``true``, ``1``, ``yes``, ...); unset or empty is the default.
    :param deferrable: Wait for the job in the triggerer, which frees the worker slot for the hours
        a batch can take, rather than polling in the worker. Default: Airflow's
        ``[operators] default_deferrable`` setting, as for every deferrable operator; Airflow ships it
        ``False``, so set it to ``True`` (``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE=true``) or pass
        ``deferrable=True``, as the example DAGs do, to defer. The setting is read when this module
        is first imported, in each process that parses the DAG.
    :param poll_interval_seconds: Seconds between job status checks. None (default) paces them: every
        second while the waiting process (the triggerer, or the worker) waits on up to 50 jobs, up to
        every 10 s at 500, so the task goes on within about a second of the job's end.
    :param progress_interval_seconds: Least seconds between two progress lines in the task log
        (rows done / total, rows/s, output tokens/s, ETA). Default 60; 0 turns them off.

    With the OpenLineage provider installed, the task reports ``input_uri`` and ``output_uri`` as its
    input and output datasets, with the run's row counts (:mod:`airflow_provider_raybatch.lineage`).
    """

    template_fields: Sequence[str] = (
        "model",
        "input_uri",
        "output_uri",
        "input_format",
        "output_format",
        "openai_endpoint",
        "messages_column",
        "system_prompt",
        "user_template",
        "image_column",
        "image_size",
        "image_max_side",
        "image_allowed_hosts",
        "image_allowed_local_path",
        "image_allowed_s3_prefixes",
        "sampling_params",
        "engine_kwargs",
        "concurrency",
        "replica_resources",
        "accelerator_type",
        "id_column",
        "keep_columns",
        "max_failed_fraction",
        "max_failed_rows",
        "keep_warm_seconds",
        "aws_conn_id",
        "reuse_earlier_result",
    )
    operator_extra_links = (RayJobLink(), BatchOutputLink(), RunReportLink())
    template_fields_renderers = {"sampling_params": "json", "engine_kwargs": "json", "user_template": "jinja"}
    ui_color = "#cfe6ff"
    #: The Ray job of this task, once it has submitted or found one.
    job_id: str | None = None
    #: The committed run's manifest, once execute_complete has read it (for lineage).
    manifest: JsonObject | None = None
    #: The job this operator asked Ray to stop (its own kill or timeout), so that a stop it sees is said
    #: to be its own, and a second cleanup path does not ask again.
    _stop_requested_for: str | None = None

    def __init__(
        self,
        *,
        model: str,
        input_uri: str,
        output_uri: str,
        input_format: str | None = None,
        output_format: str | None = None,
        openai_endpoint: str | None = None,
        messages_column: str | None = None,
        system_prompt: str | None = None,
        user_template: str | None = None,
        image_column: str | None = None,
        image_size: tuple[int, int] | list[int] | str | None = None,
        image_max_side: int | str | None = None,
        image_allowed_hosts: list[str] | str | None = None,
        image_allowed_local_path: str | None = None,
        image_allowed_s3_prefixes: list[str] | str | None = None,
        preprocess: str | None = None,
        postprocess: str | None = None,
        sampling_params: Kwargs | str | None = None,
        engine_kwargs: Kwargs | str | None = None,
        batch_size: int = 64,
        concurrency: int | tuple[int, int] | str | None = None,
        max_concurrent_batches: int | None = None,
        accelerator_type: str | None = None,
        replica_resources: dict[str, float] | str | None = None,
        id_column: str | None = None,
        keep_columns: list[str] | str | None = None,
        max_failed_fraction: float | str = DEFAULT_MAX_FAILED_FRACTION,
        max_failed_rows: int | str | None = None,
        keep_versions: bool = False,
        dry_run: bool = False,
        dry_run_rows_per_second: float | None = None,
        reuse_earlier_result: bool | str | None = True,
        ray_conn_id: str = RayHook.default_conn_name,
        aws_conn_id: str | None = None,
        model_cache_dir: str = DEFAULT_MODEL_CACHE_DIR,
        compile_cache_dir: str | None = None,
        keep_warm_seconds: float | None = None,
        output_asset: Asset | str | None = None,
        input_asset: Asset | str | None = None,
        check_layout: bool = True,
        runtime_env: RuntimeEnv | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval_seconds: float | None = None,
        progress_interval_seconds: float = DEFAULT_PROGRESS_INTERVAL_SECONDS,
        **kwargs: ArgValue,
    ) -> None:
        operator = type(self).__name__
        arguments.refuse_unknown(operator, kwargs, RayLLMBatchOperator.__init__)
        super().__init__(**kwargs)
        self.model, self.input_uri = model, input_uri
        self.output_uri, self.input_format, self.output_format = output_uri, input_format, output_format
        self.openai_endpoint, self.messages_column = openai_endpoint, messages_column
        self.system_prompt, self.user_template = system_prompt, user_template
        self.image_column, self.image_size, self.image_max_side = image_column, image_size, image_max_side
        self.image_allowed_hosts = image_allowed_hosts or []
        self.image_allowed_local_path = image_allowed_local_path
        self.image_allowed_s3_prefixes = image_allowed_s3_prefixes or []
        arguments.refuse_functions(operator, self.task_id, preprocess=preprocess, postprocess=postprocess)
        self.preprocess, self.postprocess = preprocess, postprocess
        self.sampling_params = sampling_params or {}
        self.engine_kwargs = engine_kwargs or {}
        self.batch_size, self.concurrency = batch_size, concurrency
        self.max_concurrent_batches, self.accelerator_type = max_concurrent_batches, accelerator_type
        self.replica_resources, self.id_column, self.keep_columns = replica_resources, id_column, keep_columns
        self.max_failed_fraction, self.max_failed_rows = max_failed_fraction, max_failed_rows
        self.keep_versions, self.dry_run_rows_per_second = keep_versions, dry_run_rows_per_second
        self.reuse_earlier_result = reuse_earlier_result
        self.ray_conn_id, self.aws_conn_id = ray_conn_id, aws_conn_id
        self.model_cache_dir, self.compile_cache_dir = model_cache_dir, compile_cache_dir
        self.keep_warm_seconds, self.check_layout = keep_warm_seconds, check_layout
        self._set_outputs(dry_run, output_asset, input_asset)
        self.runtime_env, self.entrypoint_resources = runtime_env or {}, entrypoint_resources
        self._set_waiting(deferrable, poll_interval_seconds, progress_interval_seconds)
        self._check_as_written(runtime_env, kwargs)

    def _set_outputs(
        self, dry_run: bool, output_asset: Asset | str | None, input_asset: Asset | str | None
    ) -> None:
        """The batch's ``dry_run`` flag, and the task's output and input assets added to its outlets and
        inlets (a dry run's output is not announced)."""
        # The batch's dry_run flag (a documented parameter) shadows BaseOperator.dry_run(), a method that
        # renders the template fields and that nothing in Airflow calls.
        self.dry_run = dry_run  # type: ignore[method-assign,assignment]
        self.output_asset = Asset(output_asset) if isinstance(output_asset, str) else output_asset
        self.input_asset = Asset(input_asset) if isinstance(input_asset, str) else input_asset
        if self.output_asset is not None and not dry_run:  # a dry run writes no output to announce
            self.outlets = [*self.outlets, self.output_asset]
        if self.input_asset is not None:
            self.inlets = [*self.inlets, self.input_asset]

    def _set_waiting(
        self, deferrable: bool, poll_interval_seconds: float | None, progress_interval_seconds: float
    ) -> None:
        """How the task waits on its job: in the triggerer or the worker, how often it polls and logs."""
        if poll_interval_seconds is not None and not poll_interval_seconds > 0:
            # Here, not only in the trigger: a deferred task builds its trigger after the job is submitted.
            raise ValueError(
                f"{type(self).__name__} (task_id: {self.task_id}): poll_interval_seconds="
                f"{poll_interval_seconds!r} must be > 0 (or None: paced)."
            )
        self.deferrable = deferrable
        self.poll_interval_seconds = poll_interval_seconds
        self.progress_interval_seconds = progress_interval_seconds

    def _check_as_written(self, runtime_env: RuntimeEnv | None, kwargs: Kwargs) -> None:
        """Values written as is are checked now, as the DAG is parsed: a mistake is an import error in
        the UI, not a task that fails when it runs. Templated ones are checked when rendered, or by
        validate(). Airflow's check of a mapped task's arguments passes placeholders: nothing to check.
        Warnings name the DAG file's line that built the operator (``stacklevel`` 3: past __init__).

        :param kwargs: ``__init__``'s own ``**kwargs`` (BaseOperator took a copy), where Airflow's check
            of a mapped task's arguments sets its flag.
        """
        mapped_validation = bool(kwargs.get("_airflow_mapped_validation_only"))
        task = f"{type(self).__name__} (task_id: {self.task_id})"
        values = {name: getattr(self, name) for name in SPEC_PARAMETERS}
        #: The parameters written as templates (or XComs): their rendered values are text to read back.
        self._templated_parameters = frozenset(
            name for name, value in values.items() if not arguments.is_literal(value)
        )
        if not mapped_validation:
            written_values.check_as_written(
                task,
                {**values, "reuse_earlier_result": self.reuse_earlier_result},
                template_fields=self.template_fields,
                complete=True,
                dag_file=self._dag_file,
            )
            extra = {"runtime_env": runtime_env, "entrypoint_resources": self.entrypoint_resources}
            written_values.warn_of_likely_mistakes(
                task, {**values, **extra}, stacklevel=3, dag_file=self._dag_file
            )
        if self.has_dag() and (
            reads_today := partition_dates.todays_partition_warning(
                self.dag.timetable, self.input_uri, self.dag.schedule
            )
        ):
            warnings.warn(f"{task}: {reads_today}", stacklevel=3)

    @classmethod
    def partial(cls, **kwargs: ArgValue) -> OperatorPartial:
        """Airflow's ``partial`` for a mapped task, whose values written as is are checked now, and
        whose ``expand`` builds and checks each map index the DAG file lists
        (operators/mapped_tasks.py): a mistake fails the DAG's import, naming the map index."""
        mapped_tasks.check_partial(cls, kwargs)
        return mapped_tasks.CheckedPartial.of(super().partial(**kwargs))

    @staticmethod
    def validate_mapped(
        task: MappedOperator,
        context: Mapping[str, ArgValue] | None = None,
        expand: Mapping[str, Sequence[ArgValue]] | Sequence[Mapping[str, ArgValue]] | None = None,
    ) -> list[BatchInferenceSpec]:
        """:meth:`validate` for a mapped task (``dag.get_task(...)`` of a ``partial(...).expand(...)``):
        each map index built as a run builds it and validated; the job specs in map index order.

        :param context: as for :meth:`validate`.
        :param expand: the values of what is mapped over an upstream task's XCom, which the DAG file
            does not hold: ``{"input_uri": [...]}`` for ``expand(input_uri=...)``, a list of dicts for
            ``expand_kwargs(...)``.
        """
        return mapped_tasks.validate_mapped(task, context, expand)

    @property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    # -- spec ------------------------------------------------------------------------------------

    def build_spec(self, run_key: str = "manual") -> BatchInferenceSpec:
        """The validated job spec from the (rendered) parameters; raises BatchSpecError naming the field.

        :param run_key: the logical run's identity (:meth:`TaskTry.run_key`); retries share it.
        """
        params = {name: getattr(self, name) for name in SPEC_PARAMETERS}
        return spec_from_params(params, run_key, self._templated_parameters)

    def validate(self, context: Mapping[str, ArgValue] | None = None) -> BatchInferenceSpec:
        """Render this task's templated parameters as a run would, and check them all, without a run:
        for a DAG's own test in CI. Returns the job spec; raises BatchSpecError naming the parameter,
        or Jinja's error naming a template variable ``context`` lacks. A ``preprocess`` /
        ``postprocess`` whose module is found here must define its function (read from the module's
        source: the module is not imported), and a rendered ``reuse_earlier_result`` must be a yes or
        no. Likely mistakes in the rendered values (a misspelled engine argument, ...) are warnings.
        A mapped task: :meth:`validate_mapped`.

        :param context: the template variables the parameters use, e.g.
            ``{"data_interval_start": pendulum.datetime(2026, 11, 20), "params": {"model": "..."}}``;
            ``params`` is laid over the task's Param defaults. Literal values were checked already,
            when the task was built.
        """
        given = dict(context or {})
        # A date written as text ("2026-11-20"), as a DAG's test would: what a run's context holds.
        for key in _CONTEXT_DATES:
            if isinstance(given.get(key), str):
                given[key] = pendulum.parse(given[key])
        defaults = {key: self.params[key] for key in self.params} if self.params else {}
        given["params"] = {**defaults, **given.get("params", {})}
        rendered = copy.copy(self)  # rendering sets the copy's attributes; this task stays as written
        task = f"{type(self).__name__} (task_id: {self.task_id})"
        # Strict: a variable the context lacks is an error naming it, not an empty path segment.
        strict = self.get_template_env().overlay(undefined=jinja2.StrictUndefined)
        try:
            rendered.render_template_fields(given, jinja_env=strict)  # type: ignore[arg-type]
        except jinja2.UndefinedError as err:
            raise BatchSpecError(
                f"{task}: a templated parameter uses a variable the context does not give: {err.message}. "
                "Pass it in validate(context), as a run's context has it."
            ) from None
        except jinja2.TemplateSyntaxError as err:
            field = arguments.first_unparsable_template(
                {name: getattr(self, name) for name in self.template_fields}
            )
            raise BatchSpecError(
                f"{task}: {field or 'a templated parameter'} is not a valid Jinja template: {err.message}. "
                "In a user_template only {Column} is ours: a doubled brace starts Jinja's {{ ... }}."
            ) from None
        try:
            spec = rendered.build_spec()
            job_shipping.check_user_functions(self._dag_file, **dict(job_shipping.user_functions(spec)))
            rendered_flag("reuse_earlier_result", rendered.reuse_earlier_result, default=True)
        except BatchSpecError as err:
            raise BatchSpecError(f"{task}: {err}") from None
        if self._templated_parameters:  # what was written as is was warned of as the DAG was parsed
            rendered_values = {name: getattr(spec, name) for name in self._templated_parameters}
            written_values.warn_of_likely_mistakes(
                task,
                {**rendered_values, "preprocess": spec.preprocess},
                stacklevel=2,
                dag_file=self._dag_file,
            )
        return spec

    @property
    def _dag_file(self) -> str | None:
        """The DAG file this task is in, if it is in a DAG: pre/postprocess modules beside it are found
        even where its DAGs folder is not on ``sys.path`` (a DAG's own test; Airflow puts it there)."""
        return self.dag.fileloc if self.has_dag() else None

    # -- shipping (jobs/job_shipping.py) ----------------------------------------------------

    def entrypoint(self, spec: BatchInferenceSpec) -> str:
        """A few words whatever the spec's size: the spec travels in the job package (_runtime_env)."""
        return job_shipping.entrypoint(spec)

    def _local_modules(self, spec: BatchInferenceSpec) -> list[Path]:
        """The provider package plus the DAG author's modules named by preprocess / postprocess."""
        return job_shipping.local_modules(spec)

    def _s3_settings(self, spec: BatchInferenceSpec) -> dict[str, str | None] | None:
        """The S3 settings ``aws_conn_id`` gives the job, or None (:func:`job_shipping.s3_settings`)."""
        return job_shipping.s3_settings(self.aws_conn_id, spec)

    def _runtime_env(self, hook: RayHook, spec: BatchInferenceSpec) -> RuntimeEnv:
        """Upload the code, the job package and the S3 settings (:func:`job_shipping.upload_runtime_env`)."""
        return job_shipping.upload_runtime_env(
            hook, spec, self.aws_conn_id, self.runtime_env, engine_pool_scope()
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def execute(self, context: Context) -> str | None:
        deadline = self._deadline()
        task_try = task_try_of(context)
        spec = self.build_spec(run_key=task_try.run_key())
        reuse_earlier_result = rendered_flag("reuse_earlier_result", self.reuse_earlier_result, default=True)
        self.log.info(
            "Batch spec %s validated: %s -> %s.", spec.fingerprint(), spec.input_uri, spec.output_uri
        )
        secret = deployment_key()
        hook = self.hook
        choice = choose_start(self._previous_job(hook, task_try, secret, context), spec.fingerprint())
        previous = choice.previous
        if choice.start is Start.STOP_AND_SUBMIT and previous is not None:
            self.log.warning(
                "Ray job %s of try %s of this run has other parameters; stopping it. (Were it another "
                "Airflow deployment's, the two would share [raybatch] job_identity_secret or "
                "[core] fernet_key: give each deployment its own.)",
                previous.job_id,
                try_number_of(previous),
            )
            self._stop_job(hook, previous.job_id, wait_seconds=STOP_WAIT_SECONDS)
        if choice.previous_ended and previous is not None:
            # Its committed version (a succeeded job's) is taken by the new job, on the cluster, only if
            # the input files, the code, the model and the engine are as they made it
            # (pipeline/stage/reuse.py); the rows a failed or stopped job staged are resumed on the same
            # terms (its Ray job's log says which it did).
            if previous.status is JobStatus.SUCCEEDED and reuse_earlier_result:
                then = (
                    "the new job takes the version this run committed if nothing it was made from has "
                    "changed, else generates again"
                )
            elif previous.status is JobStatus.SUCCEEDED:
                then = "reuse_earlier_result is off: the new job generates again"
            else:
                then = (
                    "the new job resumes the rows it staged if they were made from the same input files, "
                    "code and model, else starts afresh (the new Ray job's log says which)"
                )
            self.log.info(
                "Ray job %s of an earlier try ended %s; %s.", previous.job_id, previous.status.value, then
            )
        attached_at = None
        if choice.start is Start.ATTACH and previous is not None:
            self.log.info(
                "Ray job %s of an earlier try is %s; attaching to it.", previous.job_id, previous.status.value
            )
            self.job_id = previous.job_id
            attached_at = time.time()
        else:
            # A failed or stopped earlier job left its finished rows in staging: the new job resumes. With
            # no earlier job found (a Ray cluster restarted since) it too takes a version this run
            # committed from the same input, code and model.
            self.job_id = self._submit_and_record(hook, spec, task_try, secret, context)
        return self._wait(context, hook, self.job_id, deadline, attached_at)

    def _deadline(self) -> float | None:
        """This try's one absolute deadline (epoch seconds): ``execution_timeout`` from now, or None.

        Carried in the trigger's arguments and through ``execute_complete``, so neither a triggerer
        restart nor a resubmission nor Airflow's own deferral timeout ever extends it.
        """
        return (
            None if self.execution_timeout is None else time.time() + self.execution_timeout.total_seconds()
        )

    def _submit_and_record(
        self, hook: RayHook, spec: BatchInferenceSpec, task_try: TaskTry, secret: bytes, context: Context
    ) -> str:
        """Submit, and keep the job id in the task state store (where Airflow has one) for later tries."""
        job_id = self._submit(hook, spec, task_try, secret)
        store = context.get("task_state_store")
        if store is not None:
            store.set(JOB_ID_STATE_KEY, job_id)
        return job_id

    def _wait(
        self,
        context: Context,
        hook: RayHook,
        job_id: str,
        deadline: float | None,
        attached_at: float | None = None,
    ) -> str:
        """Wait for the job: defer (``deferrable``), or poll in the worker; then finish as it ended.

        :param deadline: the try's absolute deadline (:meth:`_deadline`); the trigger stops the job
            at it, and Airflow's own deferral timeout comes only :data:`DEFERRAL_GRACE_SECONDS` later.
        :param attached_at: when this try attached to an earlier try's running job (a stop after it may
            be that try's cleanup).
        """
        # Record the job id the instant it exists so it can be stopped or found even if the worker dies.
        self._push_job_link(context, hook, job_id)
        if self.deferrable:
            self.defer(
                trigger=RayJobTrigger(
                    job_id=job_id,
                    ray_conn_id=self.ray_conn_id,
                    poll_interval_seconds=self.poll_interval_seconds,
                    timeout_seconds=self.execution_timeout.total_seconds()
                    if self.execution_timeout
                    else None,
                    progress_interval_seconds=self.progress_interval_seconds,
                    deadline=deadline,
                    fire_not_before=settle_deadline(),
                ),
                method_name="execute_complete",
                kwargs={"deadline": deadline, "attached_at": attached_at},
                timeout=None
                if deadline is None
                else timedelta(seconds=max(deadline - time.time(), 0) + DEFERRAL_GRACE_SECONDS),
            )
        return self.execute_complete(context, self._wait_in_worker(hook, job_id), deadline, attached_at)

    @staticmethod
    def _push_job_link(context: Context, hook: RayHook, job_id: str) -> None:
        """Push the XComs the "Ray job" link reads, on every path that settles on a job: XComs belong
        to one try, so a try that takes an earlier try's result must push them again."""
        ti = context["ti"]
        ti.xcom_push(key=JOB_ID_XCOM_KEY, value=job_id)
        ti.xcom_push(key=DASHBOARD_URL_XCOM_KEY, value=hook.dashboard_url)

    def _previous_job(
        self, hook: RayHook, task_try: TaskTry, secret: bytes, context: Context
    ) -> JobInfo | None:
        """The newest Ray job of this logical run (any earlier try, or this one), if there is one.

        Airflow's task state store (where the installed Airflow has it) names it directly; otherwise,
        or if the worker died before recording it, listing the cluster's jobs finds it. Either way a
        job counts only when its submission id proves it this deployment's job of this run
        (:meth:`TaskTry.owns`): another deployment's, a re-created run's or a forged one is never
        adopted, and never stopped.
        """
        ours = {
            job.job_id: job for job in hook.list_jobs() if task_try.owns(job.job_id, job.metadata, secret)
        }
        store = context.get("task_state_store")
        recorded = store.get(JOB_ID_STATE_KEY) if store is not None else None
        if recorded and str(recorded) not in ours:
            try:
                info = hook.get_job_info(str(recorded))
            except RayJobNotFoundError:
                self.log.warning("Recorded Ray job %s is unknown to the cluster.", recorded)
            else:
                if task_try.owns(info.job_id, info.metadata, secret):
                    ours[info.job_id] = info
                else:
                    self.log.warning("Recorded Ray job %s is not this run's job; leaving it alone.", recorded)
        return max(ours.values(), key=submission_order, default=None)

    def _submit(self, hook: RayHook, spec: BatchInferenceSpec, task_try: TaskTry, secret: bytes) -> str:
        """Check the layout, ship the code and spec, and submit under this try's first free submission
        id (:func:`job_shipping.submit`)."""
        job_shipping.check_layout(hook, spec, self.check_layout, self.log)
        runtime_env = self._runtime_env(hook, spec)
        command = self.entrypoint(spec)
        resources = self.entrypoint_resources
        reuse = rendered_flag("reuse_earlier_result", self.reuse_earlier_result, default=True)
        return job_shipping.submit(
            hook, spec, task_try, secret, command, runtime_env, resources, self.log, reuse_committed=reuse
        )

    def _wait_in_worker(self, hook: RayHook, job_id: str) -> dict[str, str]:
        progress = ProgressRelay(job_id, self.progress_interval_seconds, self.log)
        status_line = StatusLine(job_id, self.log)
        try:
            with poll_pace.waiting(self.poll_interval_seconds):
                while True:
                    info = hook.get_job_info(job_id)
                    if info.status.is_terminal:
                        progress.relay(hook, info.status)  # the final count
                        return event_for_job(info)
                    if not progress.relay(hook, info.status):
                        status_line.show(info.status)
                    time.sleep(poll_pace.next_poll_in(self.poll_interval_seconds))
        except BaseException:
            # Timeout, kill signal or interrupt while waiting: do not leave the batch running unowned.
            self._stop_job(hook, job_id)
            raise

    def execute_complete(
        self,
        context: Context,
        event: dict[str, str] | None = None,
        deadline: float | None = None,
        attached_at: float | None = None,
    ) -> str:
        """Finish as the job ended: its committed result, or a failure that leaves no job running.

        :param deadline: the try's deadline, kept if a new job must be submitted (see :meth:`_wait`).
        :param attached_at: when this try attached to an earlier try's job, if it did.
        """
        event = validate_event(event)
        hook = self.hook
        job_id = self.job_id = event["job_id"]  # also for a failed task's lineage
        if event["status"] == "cancelled" and self._stopped_by_earlier_tries_cleanup(
            hook, job_id, context, attached_at
        ):
            # This try attached to a job whose own try was cleared or marked failed just before: that
            # try's cleanup stopped the job under us. Run again; the new job resumes from staging.
            self.log.warning(
                "Ray job %s of an earlier try was stopped by that try's cleanup while this try "
                "waited on it; submitting a new job, which resumes from the rows it staged.",
                job_id,
            )
            task_try = task_try_of(context)
            spec = self.build_spec(run_key=task_try.run_key())
            self.job_id = self._submit_and_record(hook, spec, task_try, deployment_key(), context)
            return self._wait(context, hook, self.job_id, deadline)
        spec = self.build_spec(run_key=task_try_of(context).run_key())
        conn_id = job_results.storage_conn_id(self.aws_conn_id)
        manifest = None
        if event["status"] != "success":
            manifest = job_results.committed_result_of(job_id, spec, conn_id)
            if manifest is None:
                # An error event (the deadline, the Jobs API unreachable, a crashed trigger) can leave
                # the job running: stop it, as the worker path does whatever ends its wait.
                cleanup = self._cleanup_hook()
                self._stop_job(cleanup, job_id)
                if event["termination_reason"] == "failed":  # held for its failed rows? Say so, alone.
                    held = job_results.held_result_of(cleanup, job_id, spec)
                    if held is not None:
                        context["ti"].xcom_push(key="manifest", value=held)
                        job_results.check_failed_rows(held, spec, job_id)
                if event["status"] == "cancelled":
                    event = {**event, "message": event["message"] + self._who_stopped(job_id)}
                raise job_failed_error(event, cleanup.get_job_log_tail(job_id))
            self.log.warning(
                "Ray job %s ended %s after it committed its result; taking that result.",
                job_id,
                event["termination_reason"],
            )
        if manifest is None:  # the committed manifest, else the driver log's
            manifest = job_results.job_result(hook, job_id, spec, conn_id, self.log)
        self.manifest = manifest
        ti = context["ti"]
        ti.xcom_push(key="job_id", value=job_id)
        ti.xcom_push(key="manifest", value=manifest)
        if spec.dry_run:
            return self._dry_run_complete(manifest, spec, job_id)
        run = RunManifest.of(manifest)
        ti.xcom_push(key="output_uri", value=run.output_uri)
        duplicates = run.rows_duplicate or 0
        self.log.info(
            "Ray job %s done: %d rows in, %d out, %d failed%s; output at %s.",
            job_id,
            run.rows_in,
            run.rows_out,
            run.rows_failed,
            f" ({duplicates} of them repeated ids)" if duplicates else "",
            run.output_uri,
        )
        self._log_where_it_went(run, spec, job_id)
        job_results.check_failed_rows(run, spec, job_id)
        if self.output_asset is not None:
            context["outlet_events"][self.output_asset].extra = job_results.asset_extra(run, job_id)
        return str(run.output_uri)

    def _log_where_it_went(self, run: RunManifest, spec: BatchInferenceSpec, job_id: str) -> None:
        """The task log's lines on the version replaced, the job's time and engines, and a held try's."""
        if run.replaced_version:
            self.log.info(
                "Ray job %s's version %s replaced version %s at %s (%s).",
                job_id,
                run.version,
                run.replaced_version,
                run.output_uri,
                "kept: keep_versions" if spec.keep_versions else "deleted",
            )
        if (timings := describe_timings(run.timings)) is not None:
            self.log.info("Ray job %s took: %s.", job_id, timings)
        if (pool := describe_engine_pool(run.engine_pool)) is not None:
            self.log.info("Ray job %s ran on %s.", job_id, pool)
        if (held := run.held_try) is not None:  # its rows were generated by the held try
            spent = describe_timings(held.timings)
            self.log.info(
                "Ray job %s generated no rows: it committed the rows %s generated and held%s.",
                job_id,
                f"Ray job {held.job_id}" if held.job_id else "an earlier try",
                f", which took: {spent}" if spent else "",
            )

    def _dry_run_complete(self, manifest: JsonObject, spec: BatchInferenceSpec, job_id: str) -> str:
        """Log what the dry run found and return its folder; fail when the real run would fail its
        thresholds."""
        dry = DryRunManifest.of(manifest)
        estimate = dry.estimated_gpu_seconds
        # An older job's manifest has no engine seconds: its estimated_gpu_seconds was the engine's time.
        newer = "estimated_engine_seconds" in dry.model_fields_set
        engine_seconds = dry.estimated_engine_seconds if newer else estimate
        gpu_seconds = f" ({estimate:,} GPU-seconds)" if estimate is not None and newer else ""
        self.log.info(
            "Dry run (Ray job %s): %d rows in; %d would reach the engine with %d prompt tokens (longest %d); "
            "%d would fail (%s); %s. Report: %s",
            job_id,
            dry.rows_in,
            dry.rows_out,
            dry.prompt_tokens,
            dry.prompt_tokens_longest,
            dry.rows_failed,
            dry.errors_by_reason or "none",
            f"~{engine_seconds:,} s of engine time{gpu_seconds} at {dry.rows_per_second:.4g} rows/s "
            f"({dry.rows_per_second_from})"
            if estimate is not None
            else "no GPU time estimate (set dry_run_rows_per_second, or run once for real)",
            dry.dry_run_uri,
        )
        job_results.check_failed_rows(dry, spec, job_id)
        return str(dry.dry_run_uri)

    def _stopped_by_earlier_tries_cleanup(
        self, hook: RayHook, job_id: str, context: Context, attached_at: float | None
    ) -> bool:
        """Whether a stopped job was an earlier try's, stopped by that try's own cleanup (then run again).

        A clear or mark-failed of a deferred try makes Airflow start the next try while the
        triggerer is still stopping the job; the next try may attach to it first. Such a stop
        lands within :data:`CLEANUP_RACE_SECONDS` of the attach. A job stopped later, or one this
        try submitted, was stopped on purpose (``ray job stop``, the dashboard): the task fails
        rather than paying for the rows again.
        """
        try:
            info = hook.get_job_info(job_id)
        except RayJobNotFoundError:
            return False
        if attached_at is None or try_number_of(info) >= context["ti"].try_number:
            return False
        ended_at = (info.end_time_ms or 0) / 1000
        if ended_at <= attached_at + CLEANUP_RACE_SECONDS:
            return True
        self.log.warning(
            "Ray job %s was stopped %.0f s after this try attached to it: not by Airflow's "
            "cleanup of an earlier try, so the task fails instead of running again.",
            job_id,
            ended_at - attached_at,
        )
        return False

    def _who_stopped(self, job_id: str) -> str:
        """Said of a stopped job: this task stopped it (its own kill or timeout), or someone else did."""
        if job_id == self._stop_requested_for or job_id in _STOPS_ASKED_HERE:
            return _STOPPED_BY_THIS_TASK
        return _STOPPED_FROM_OUTSIDE

    def _cleanup_hook(self) -> RayHook:
        """A hook for cleaning up after a failure: a short retry window, the task is failing anyway."""
        return RayHook(ray_conn_id=self.ray_conn_id, retry_window_seconds=CLEANUP_RETRY_WINDOW_SECONDS)

    def resume_execution(
        self,
        next_method: str,
        next_kwargs: dict[str, Any] | None,
        context: Context,  # Any: Airflow's.
    ) -> Any:  # Any: what the resumed method returns.
        """Stop this try's job when Airflow resumes the task only to fail it, then fail as Airflow does.

        Airflow resumes a deferred task with ``__fail__`` when its own deferral timeout passed
        before the trigger acted (a triggerer down or overloaded) or the trigger crashed; no event
        reaches ``execute_complete`` then, and the job would keep running past the task.
        """
        if next_method == _TRIGGER_FAIL:
            job_id = self._this_tries_job(context)
            if job_id is not None:
                self.log.warning("The wait for Ray job %s ended without an event; stopping the job.", job_id)
                self.job_id = job_id
                self._stop_job(self._cleanup_hook(), job_id)
        return super().resume_execution(next_method, next_kwargs, context)

    def _this_tries_job(self, context: Context) -> str | None:
        """The job this try waited on (its XCom, else the task state store), if this deployment owns it."""
        ti = context["ti"]
        job_id = ti.xcom_pull(task_ids=ti.task_id, key=JOB_ID_XCOM_KEY, map_indexes=ti.map_index)
        if not job_id:
            store = context.get("task_state_store")
            job_id = store.get(JOB_ID_STATE_KEY) if store is not None else None
        if not job_id:
            return None
        try:
            info = self._cleanup_hook().get_job_info(str(job_id))
        except RayHookError as err:
            self.log.warning("Could not look up Ray job %s to stop it: %s", job_id, err)
            return None
        owned = task_try_of(context).owns(info.job_id, info.metadata, deployment_key())
        return info.job_id if owned else None

    def _stop_job(self, hook: RayHook, job_id: str, wait_seconds: float = 0) -> None:
        """Stop a job if it still runs; with ``wait_seconds``, also wait (bounded) until it has ended.

        Waiting matters before a new job takes over the same staging folder.
        """
        if job_id == self._stop_requested_for and not wait_seconds:
            return  # asked already (a worker timeout: the wait's own cleanup, then on_kill)
        try:
            if hook.get_job_status(job_id).is_terminal:
                return
            hook.stop_job(job_id)
            self._stop_requested_for = job_id
            _STOPS_ASKED_HERE.add(job_id)
            self.log.info("Stopping Ray job %s.", job_id)
            deadline = time.monotonic() + wait_seconds
            while time.monotonic() < deadline and not hook.get_job_status(job_id).is_terminal:
                time.sleep(1)
        except Exception as err:  # noqa: BLE001 - best effort while the task is already failing.
            self.log.warning("Could not stop Ray job %s: %s", job_id, err)

    def on_kill(self) -> None:
        if self.job_id:
            self._stop_job(self.hook, self.job_id)

    # -- OpenLineage (called by the OpenLineage provider, when it is installed) ---------------------

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        """The datasets this task reads and writes, and what the batch does."""
        return self._lineage()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:  # Any: the TI.
        """The datasets with this run's row counts and committed version, and the Ray job.

        The provider calls it for a failed task too: the same datasets, without counts.
        """
        return self._lineage()

    def _lineage(self) -> OperatorLineage:
        # Imported here: the OpenLineage provider calls these methods only where it is installed.
        from airflow_provider_raybatch.lineage import operator_lineage

        try:
            spec = self.build_spec()
        except BatchSpecError:
            spec = None  # the task fails on it anyway; the datasets can still be named
        return operator_lineage(str(self.input_uri), str(self.output_uri), spec, self.manifest, self.job_id)
