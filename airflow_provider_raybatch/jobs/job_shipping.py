"""Ship a batch job to the Ray cluster: its code, its spec, its S3 settings and the submit request.

Everything that leaves Airflow for the cluster is decided here, apart from the operator's task
lifecycle: which local modules travel (the provider and the DAG author's pre/postprocess
packages), the job package holding the spec, the AWS settings resolved from ``aws_conn_id`` (in an
upload of their own, never in the entrypoint, environment or metadata: shared/s3_settings_upload.py,
pipeline/credentials.py), the short entrypoint, a check that the planned layout fits the cluster,
and the submission under this try's first free submission id. Plain functions that take what they
need, so the operator keeps only thin methods over them.
"""

from __future__ import annotations

import importlib
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import airflow_provider_raybatch
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.shared import job_settings
from airflow_provider_raybatch.shared.exceptions import BatchSpecError, RayJobAlreadyExistsError
from airflow_provider_raybatch.shared.job_ids import MAX_SUBMISSION_ATTEMPTS, REUSE_COMMITTED_KEY, TaskTry
from airflow_provider_raybatch.shared.json_types import RuntimeEnv, TaskLog
from airflow_provider_raybatch.shared.layout import plan_layout
from airflow_provider_raybatch.shared.packaging import (
    RayPackage,
    build_job_package,
    build_provider_package,
    build_py_module_package,
)
from airflow_provider_raybatch.shared.s3_settings_upload import settings_upload
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from airflow_provider_raybatch.shared.user_functions import likely_module, missing_function, split_dotted_path

PIPELINE_MODULE = "airflow_provider_raybatch.pipeline"
#: Ray job metadata key holding the spec fingerprint the job was submitted with.
FINGERPRINT_KEY = "raybatch_spec_fingerprint"


def entrypoint(spec: BatchInferenceSpec) -> str:
    """A few words whatever the spec's size: the spec travels in the job package (upload_runtime_env)."""
    return f"python -m {PIPELINE_MODULE} --spec-fingerprint {shlex.quote(spec.fingerprint())}"


def top_level_module_path(field: str, dotted_path: str) -> Path:
    """The folder of the top-level package (or the single file) holding a pre/postprocess function."""
    module_name = split_dotted_path(dotted_path)[0]
    try:
        importlib.import_module(module_name)
    except ImportError as err:
        likely = likely_module(module_name.split(".")[0])
        advice = (
            f"did you mean {likely!r}?"
            if likely is not None
            else "put it beside the DAG file or in the DAGs folder so it can be shipped with the job."
        )
        raise BatchSpecError(
            f"{field}={dotted_path!r}: module {module_name!r} cannot be imported here ({err}); {advice}"
        ) from err
    top = sys.modules[module_name.split(".")[0]]
    return Path(top.__path__[0]) if hasattr(top, "__path__") else Path(top.__file__ or "")


def check_user_functions(dag_file: str | None, **named: object) -> None:
    """Raise BatchSpecError for a pre/postprocess dotted path whose module, found here without
    importing it, plainly defines no such function (:func:`.user_functions.missing_function`).

    :param dag_file: the task's DAG file, if it has one: a module beside it is found too, where a
        DAG's own test has not put the DAGs folder on ``sys.path`` as Airflow does.
    :param named: the parameters' values by name; one that is not text is left to the spec's checks.
    """
    for field, dotted_path in named.items():
        problem = missing_function(dotted_path, dag_file) if isinstance(dotted_path, str) else None
        if problem is not None:
            raise BatchSpecError(f"{field}={dotted_path!r}: {problem}")


def user_functions(spec: BatchInferenceSpec) -> list[tuple[str, str]]:
    """(parameter, dotted path) of the pre/postprocess functions that are set."""
    pairs = (("preprocess", spec.preprocess), ("postprocess", spec.postprocess))
    return [(field, dotted_path) for field, dotted_path in pairs if dotted_path]


def local_modules(spec: BatchInferenceSpec) -> list[Path]:
    """The provider package plus the DAG author's modules named by preprocess / postprocess."""
    paths = [Path(airflow_provider_raybatch.__file__).parent]
    for field, dotted_path in user_functions(spec):
        path = top_level_module_path(field, dotted_path)
        if path not in paths:
            paths.append(path)
    return paths


def module_packages(spec: BatchInferenceSpec) -> list[RayPackage]:
    """The zipped :func:`local_modules`; a folder that cannot ship fails naming its parameter."""
    provider, *authors = local_modules(spec)
    packages = [build_provider_package(provider)]  # our own code, whatever its file names
    for path in authors:
        try:
            packages.append(build_py_module_package(path))
        except ValueError as err:
            named = [
                f"{field}={dotted_path!r}"
                for field, dotted_path in user_functions(spec)
                if top_level_module_path(field, dotted_path) == path
            ]
            who = " and ".join(named)
            raise BatchSpecError(f"{who}: cannot ship {err}") from err
    return packages


def s3_settings(aws_conn_id: str | None, spec: BatchInferenceSpec) -> dict[str, str | None] | None:
    """Credentials, region and endpoint from ``aws_conn_id``, resolved now (an assumed role's are
    short-lived); None to leave S3 access to the cluster's own credentials."""
    if not aws_conn_id or aws_conn_id == "None":  # unset, or rendered from an unset Param
        return None
    if not any(uri.startswith("s3://") for uri in (spec.input_uri, spec.output_uri, spec.model)):
        return None  # nothing on S3: no credentials leave Airflow
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError as err:
        raise BatchSpecError(
            f"aws_conn_id={aws_conn_id!r} needs the Amazon provider: "
            "pip install 'airflow-provider-raybatch[amazon]'."
        ) from err
    aws = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="s3")
    credentials = aws.get_credentials()
    return {
        "endpoint_url": aws.conn_config.get_service_endpoint_url("s3"),
        "region": aws.conn_region_name,
        "access_key": credentials.access_key,
        "secret_key": credentials.secret_key,
        "session_token": credentials.token,
    }


def upload_runtime_env(
    hook: RayHook,
    spec: BatchInferenceSpec,
    aws_conn_id: str | None,
    extra_runtime_env: RuntimeEnv,
    pool_scope: str,
) -> RuntimeEnv:
    """Upload the code and the job package (the spec) for ``py_modules``, and the S3 settings for none.

    The settings' upload is named only inside the job package: no node unpacks it, and the job's
    driver moves it into its own in-memory copy, deleted when it ends (pipeline/credentials.py).
    It goes last, so as little time as possible passes between its upload and the job's start.

    :param extra_runtime_env: the operator's own ``runtime_env``; not modified.
    :param pool_scope: the deployment's engine pool scope
        (:func:`~airflow_provider_raybatch.jobs.deployment_secret.engine_pool_scope`), set as the job's
        :data:`~airflow_provider_raybatch.shared.job_settings.POOL_SCOPE_ENV` over any value the DAG
        gave: a warm pool is shared only within its scope.
    :raises BatchSpecError: for a job setting in its ``env_vars`` that the job would refuse as it
        starts (:func:`.job_settings.check_env_vars`): nothing is uploaded or submitted.
    """
    try:
        job_settings.check_env_vars(extra_runtime_env.get("env_vars") or {})
    except ValueError as err:
        raise BatchSpecError(f"runtime_env env_vars: {err}") from err
    packages = module_packages(spec)
    settings_values = s3_settings(aws_conn_id, spec)
    settings = settings_upload(settings_values) if settings_values is not None else None
    packages.append(build_job_package(spec.model_dump_json(), settings.uri if settings else None))
    uploaded = [hook.upload_package(package) for package in packages]
    if settings is not None:
        hook.upload_package(settings)
    runtime_env = dict(extra_runtime_env)
    runtime_env["py_modules"] = [*uploaded, *runtime_env.get("py_modules", [])]
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), job_settings.POOL_SCOPE_ENV: pool_scope}
    return runtime_env


def check_layout(hook: RayHook, spec: BatchInferenceSpec, enforce: bool, log: TaskLog) -> None:
    """Log the planned layout; refuse one the cluster's alive nodes cannot host (ClusterLayoutError).

    :param enforce: the operator's ``check_layout``; off for a cluster that scales up from zero.
    """
    plan = plan_layout(spec)
    log.info("Planned layout: %s.", plan.describe())
    if spec.concurrency is None and spec.replica_resources is None:
        log.info(
            "concurrency is unset: the job chooses how many replicas share that GPU as it starts (up to "
            "3 for short generations; its manifest's layout says what it chose and why)."
        )
    if enforce:
        plan.check_fits(hook.get_cluster_resources())


def submit(
    hook: RayHook,
    spec: BatchInferenceSpec,
    task_try: TaskTry,
    secret: bytes,
    command: str,
    runtime_env: RuntimeEnv,
    entrypoint_resources: dict[str, float] | None,
    log: TaskLog,
    reuse_committed: bool = False,
) -> str:
    """Submit under this try's first free submission id (see :attr:`TaskTry.attempt`).

    An id is taken when a job of the same names ended earlier without being this try's to take:
    a scheduled run deleted and created again (same ``run_after``) whose try 1 ran before, or a
    job with other parameters. The next attempt's id is as much ours, and as verifiable.

    :param command: the job's entrypoint (:func:`entrypoint`).
    :param reuse_committed: the job may take the version an earlier try of its run committed, when made
        from what it would make its rows from (``reuse_earlier_result``; :data:`REUSE_COMMITTED_KEY`).
    """
    taken: list[str] = []
    for attempt in range(1, MAX_SUBMISSION_ATTEMPTS + 1):
        this = replace(task_try, attempt=attempt)
        try:
            job_id = hook.submit_job(
                command,
                submission_id=this.submission_id(secret),
                runtime_env=runtime_env,
                metadata={
                    **this.metadata(),
                    FINGERPRINT_KEY: spec.fingerprint(),
                    REUSE_COMMITTED_KEY: "true" if reuse_committed else "false",
                },
                entrypoint_resources=entrypoint_resources,
            )
        except RayJobAlreadyExistsError:
            taken.append(this.submission_id(secret))
            continue
        if taken:
            log.info("Submission ids %s are taken by earlier jobs of the same names.", ", ".join(taken))
        log.info("Submitted Ray job %s to %s.", job_id, hook.dashboard_url)
        return job_id
    raise RayJobAlreadyExistsError(
        f"Ray already has jobs under all {MAX_SUBMISSION_ATTEMPTS} submission ids of this try "
        f"({taken[0]} ... {taken[-1]}). Either this run was deleted and created again that many "
        "times, or another Airflow deployment uses the same [raybatch] job_identity_secret (or "
        "[core] fernet_key) on this Ray cluster: give each deployment a secret of its own."
    )
