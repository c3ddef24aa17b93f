"""Tests of airflow_provider_raybatch/operators/llm_batch.py: spec, shipping and the job's lifecycle."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
import structlog
from airflow.sdk.exceptions import TaskDeferred

import airflow_provider_raybatch
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.jobs.deployment_secret import engine_pool_scope, signing_key
from airflow_provider_raybatch.jobs.job_shipping import FINGERPRINT_KEY
from airflow_provider_raybatch.operators import llm_batch as operator_module
from airflow_provider_raybatch.operators.llm_batch import (
    CLEANUP_RACE_SECONDS,
    JOB_ID_STATE_KEY,
    PIPELINE_MODULE,
    RayLLMBatchOperator,
)
from airflow_provider_raybatch.shared.exceptions import (
    BatchSpecError,
    RayJobFailedError,
    RayTriggerEventError,
)
from airflow_provider_raybatch.shared.job_ids import REUSE_COMMITTED_KEY, TaskTry
from airflow_provider_raybatch.shared.job_settings import POOL_SCOPE_ENV
from airflow_provider_raybatch.shared.manifest import REUSED_RESULT_KEY, manifest_log_line
from airflow_provider_raybatch.shared.packaging import (
    JOB_MODULE,
    SPEC_FILE,
    build_job_package,
    build_provider_package,
    build_py_module_package,
)
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from airflow_provider_raybatch.triggers.ray import DEFER_SETTLE_SECONDS, RayJobTrigger
from airflow_provider_raybatch.utils.events import job_event
from tests.unit.conftest import RAY_URL, TEST_DEPLOYMENT_SECRET

PROVIDER_DIR = Path(airflow_provider_raybatch.__file__).parent
#: The key the operator signs job ids with in these tests (the conftest's deployment secret).
KEY = signing_key(TEST_DEPLOYMENT_SECRET)
REQUIRED = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "input_uri": "s3://b/in/data.jsonl",
    "output_uri": "s3://b/out/",
}


def make_operator(**kwargs: Any) -> RayLLMBatchOperator:  # Any: operator arguments.
    """The operator as the example DAGs build it: ``deferrable=True``, whatever the setting. A test of the
    wait in the worker passes ``deferrable=False``; the default itself: test_deferrable_default.py."""
    arguments = {
        "task_id": "classify",
        "progress_interval_seconds": 0,
        "deferrable": True,
        **REQUIRED,
        **kwargs,
    }
    if "messages_column" not in kwargs:
        arguments.setdefault("user_template", "Industry of {Company}?")
    return RayLLMBatchOperator(**arguments)


class FakeTI:
    """The few task-instance attributes the operator reads, and the XComs it pushes."""

    def __init__(self) -> None:
        self.dag_id = "daily_company_industry"
        self.run_id = "manual__2026-11-21T00:00:00+00:00"
        self.task_id = "classify"
        self.map_index = -1
        self.try_number = 1
        self.xcoms: dict[str, Any] = {}  # Any: XCom values.

    def xcom_push(self, key: str, value: Any) -> None:  # Any: XCom values.
        self.xcoms[key] = value


# -- build_spec ---------------------------------------------------------------------------------


def test_build_spec_from_plain_values() -> None:
    op = make_operator(sampling_params={"max_tokens": 8}, concurrency=(1, 2), keep_columns=["Company"])

    spec = op.build_spec()

    assert spec == BatchInferenceSpec.build(
        **REQUIRED,
        user_template="Industry of {Company}?",
        sampling_params={"max_tokens": 8},
        concurrency=(1, 2),
        keep_columns=["Company"],
    )


def test_build_spec_run_key_and_keep_versions() -> None:
    assert make_operator().build_spec().run_key == "manual"
    assert make_operator().build_spec().keep_versions is False
    task_try = TaskTry("d", "manual__2026-11-21T00:00:00+00:00", "classify", -1, 1)

    spec = make_operator(keep_versions=True).build_spec(run_key=task_try.run_key())

    assert spec.run_key == task_try.run_key()
    assert spec.keep_versions is True
    # Neither says what the output is: a retry or a kept version must not look like another spec.
    assert spec.fingerprint() == make_operator().build_spec().fingerprint()


def test_compile_cache_dir_reaches_the_spec_and_not_its_fingerprint() -> None:
    """Where the kernels are kept is not what the output is: moving the cache must not stop a resume."""
    spec = make_operator(compile_cache_dir="/mnt/vllm-cache").build_spec()
    assert spec.compile_cache_dir == "/mnt/vllm-cache"
    assert make_operator().build_spec().compile_cache_dir is None
    assert spec.fingerprint() == make_operator().build_spec().fingerprint()


@pytest.mark.parametrize("run_key", ["", "a b", "a/b", "x" * 129])
def test_build_spec_invalid_run_key_names_it(run_key: str) -> None:
    with pytest.raises(BatchSpecError, match="run_key"):
        make_operator().build_spec(run_key=run_key)


def test_run_key_is_not_an_operator_parameter() -> None:
    """The operator derives it per run; an attribute of that name must not leak into the spec."""
    op = make_operator()
    op.run_key = "from-attribute"  # type: ignore[attr-defined]

    assert op.build_spec(run_key="given").run_key == "given"


def test_build_spec_from_json_text() -> None:
    """What ``"{{ params.x | tojson }}"`` renders to."""
    op = make_operator(
        sampling_params='{"max_tokens": 8, "temperature": 0, "structured_outputs": {"choice": ["a", "b"]}}',
        engine_kwargs=' {"max_model_len": 512, "enforce_eager": true}',
        replica_resources='{"CPU": 1}',
        keep_columns='["Company", "Country"]',
        concurrency="[1, 4]",
    )

    spec = op.build_spec()

    assert spec.sampling_params == {
        "max_tokens": 8,
        "temperature": 0,
        "structured_outputs": {"choice": ["a", "b"]},
    }
    assert spec.engine_kwargs == {"max_model_len": 512, "enforce_eager": True}
    assert spec.replica_resources == {"CPU": 1.0}
    assert spec.keep_columns == ["Company", "Country"]
    assert spec.concurrency == (1, 4)


@pytest.mark.parametrize(("text", "expected"), [("(2, 3)", (2, 3)), ("[2, 3]", (2, 3)), ("3", 3), (" 5 ", 5)])
def test_build_spec_concurrency_text(text: str, expected: int | tuple[int, int]) -> None:
    assert make_operator(concurrency=text).build_spec().concurrency == expected


def test_build_spec_passes_image_fields() -> None:
    op = make_operator(user_template="Describe it.", image_column="image", image_size=[448, 448])

    spec = op.build_spec()

    assert (spec.image_column, spec.image_size, spec.image_max_side) == ("image", (448, 448), None)
    assert {"image_column", "image_size", "image_max_side"} <= set(RayLLMBatchOperator.template_fields)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("image_size", "[448, 336]", (448, 336)),
        ("image_size", "(448, 336)", (448, 336)),
        ("image_size", "None", None),
        ("image_max_side", "512", 512),
        ("image_max_side", " 512 ", 512),
        ("image_max_side", "null", None),
    ],
)
def test_build_spec_image_fields_from_rendered_text(
    name: str, text: str, expected: Any
) -> None:  # Any: value.
    op = make_operator(user_template="Describe it.", image_column="image")
    setattr(op, name, text)  # as rendering a templated field would

    assert getattr(op.build_spec(), name) == expected


def test_build_spec_image_field_error_names_it() -> None:
    with pytest.raises(BatchSpecError, match="image_max_side.*needs image_column"):
        make_operator(image_max_side=448).build_spec()


def test_json_text_keeps_parentheses_inside_strings() -> None:
    """Only a tuple's brackets may be rewritten; parentheses inside JSON strings are the user's data."""
    op = make_operator(
        sampling_params='{"structured_outputs": {"regex": "(yes|no)"}, "stop": ["(end)"]}',
        engine_kwargs='{"chat_template": "{{ messages[0](x) }}"}',
    )

    spec = op.build_spec()

    assert spec.sampling_params == {"structured_outputs": {"regex": "(yes|no)"}, "stop": ["(end)"]}
    assert spec.engine_kwargs == {"chat_template": "{{ messages[0](x) }}"}


DEFAULTS = BatchInferenceSpec.model_fields


@pytest.mark.parametrize(
    "name",
    [
        "sampling_params",
        "engine_kwargs",
        "replica_resources",
        "keep_columns",
        "concurrency",
        "keep_warm_seconds",
    ],
)
def test_null_text_means_the_default(name: str) -> None:
    """An unset Param rendered through a template ('null', 'None', '') means the spec's default."""
    expected = DEFAULTS[name].get_default(call_default_factory=True)
    for text in ("null", "None", "", "  "):
        op = make_operator()
        setattr(op, name, text)  # as rendering a templated field would

        try:
            spec = op.build_spec()
        except BatchSpecError as err:
            pytest.fail(f"{name}={text!r} should mean the default {expected!r}, but build_spec raised: {err}")
        assert getattr(spec, name) == expected, text


@pytest.mark.parametrize("name", ["sampling_params", "engine_kwargs", "keep_columns", "replica_resources"])
def test_none_values_mean_the_default(name: str) -> None:
    spec = make_operator(**{name: None}).build_spec()

    assert getattr(spec, name) == DEFAULTS[name].get_default(call_default_factory=True)


@pytest.mark.parametrize(
    ("name", "text"),
    [("sampling_params", '{"max_tokens": 8,}'), ("keep_columns", "[Company]")],
)
def test_invalid_json_text_names_the_parameter(name: str, text: str) -> None:
    with pytest.raises(BatchSpecError) as info:
        make_operator(**{name: text}).build_spec()

    # Refused as the operator is built (a literal value), naming the task in the DAG file.
    assert str(info.value).startswith("RayLLMBatchOperator (task_id: ")
    assert f"): {name}={text!r} is text but not valid JSON" in str(info.value)


def test_a_dict_param_rendered_without_tojson_gets_the_tojson_hint() -> None:
    operator = make_operator(engine_kwargs="{{ params.engine_kwargs }}")
    operator.engine_kwargs = str({"max_model_len": 512, "enforce_eager": True})  # as Jinja renders a dict

    with pytest.raises(BatchSpecError) as info:
        operator.build_spec()

    assert "is text but not valid JSON" in str(info.value)
    assert "render it as JSON with '| tojson', e.g. '{{ params.engine_kwargs | tojson }}'" in str(info.value)


def test_malformed_concurrency_text_names_the_parameter() -> None:
    with pytest.raises(BatchSpecError, match=r"concurrency='\(1, 2' must be an int or a \(min, max\) pair"):
        make_operator(concurrency="(1, 2").build_spec()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"sampling_params": '{"max_tokens": 0}'}, "max_tokens"),
        ({"concurrency": "(3, 1)"}, "concurrency"),
        ({"batch_size": 0}, "batch_size"),
        ({"keep_columns": "Company"}, "keep_columns"),
        ({"engine_kwargs": '{"model": "x"}'}, "engine_kwargs['model']"),
        ({"input_uri": "gs://b/in.jsonl"}, "input_uri"),
        ({"messages_column": "messages", "user_template": "{a}"}, "messages_column"),
    ],
)
def test_build_spec_errors_name_the_parameter(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(BatchSpecError) as info:
        make_operator(**kwargs).build_spec()

    assert fragment in str(info.value)


def test_operator_constructor_does_not_validate() -> None:
    """Templated values are only known at run time; construction (DAG parsing) must not fail on them."""
    op = make_operator(input_uri="{{ params.input_uri }}", sampling_params="{{ params.sp | tojson }}")

    assert op.input_uri == "{{ params.input_uri }}"


def test_batch_parameters_are_templated_and_match_the_spec() -> None:
    spec_fields = set(BatchInferenceSpec.model_fields)

    # Every templated field is a spec field, but for the connection ids (templated, as in the Amazon
    # provider).
    assert set(RayLLMBatchOperator.template_fields) - {"aws_conn_id", "reuse_earlier_result"} <= spec_fields
    assert {"model", "input_uri", "output_uri", "user_template", "sampling_params"} <= set(
        RayLLMBatchOperator.template_fields
    )


# -- entrypoint ---------------------------------------------------------------------------------


def spec_in_package(data: bytes) -> BatchInferenceSpec | None:
    """The spec inside an uploaded zip, or None when it is not a job package."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        name = f"{JOB_MODULE}/{SPEC_FILE}"
        if name not in archive.namelist():
            return None
        return BatchInferenceSpec.from_json(archive.read(name).decode())


def test_entrypoint_names_the_fingerprint_and_the_job_package_holds_the_spec() -> None:
    spec = make_operator(
        system_prompt="Say 'yes' or \"no\"; don't `echo $HOME` \\ nor $(rm -rf /).\nThanks — merci.",
        user_template="Is {Company} ok?",
        sampling_params={"stop": ["\n", "'"], "max_tokens": 3},
        concurrency=(1, 2),
    ).build_spec()
    op = make_operator()

    argv = shlex.split(op.entrypoint(spec))

    assert argv == ["python", "-m", PIPELINE_MODULE, "--spec-fingerprint", spec.fingerprint()]
    assert spec_in_package(build_job_package(spec.model_dump_json()).data) == spec


# -- shipped modules ----------------------------------------------------------------------------


@pytest.fixture
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A DAG author's single-file module and package, importable for the test's duration."""
    (tmp_path / "raybatch_unit_fns.py").write_text("def pre(row):\n    return row\n\nNOT_CALLABLE = 1\n")
    package = tmp_path / "raybatch_unit_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "post.py").write_text("def tidy(row):\n    return row\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith(("raybatch_unit_fns", "raybatch_unit_pkg"))]:
        del sys.modules[name]


def test_local_modules_is_the_provider_without_user_functions() -> None:
    op = make_operator()

    assert op._local_modules(op.build_spec()) == [PROVIDER_DIR]


@pytest.mark.parametrize("preprocess", ["raybatch_unit_fns.pre", "raybatch_unit_fns:pre"])
def test_local_modules_ships_a_single_file_module(user_code: Path, preprocess: str) -> None:
    op = make_operator(preprocess=preprocess)

    assert op._local_modules(op.build_spec()) == [PROVIDER_DIR, user_code / "raybatch_unit_fns.py"]


@pytest.mark.parametrize(
    "postprocess", ["raybatch_unit_pkg.sub.post.tidy", "raybatch_unit_pkg.sub.post:tidy"]
)
def test_local_modules_ships_the_top_level_package(user_code: Path, postprocess: str) -> None:
    op = make_operator(postprocess=postprocess)

    assert op._local_modules(op.build_spec()) == [PROVIDER_DIR, user_code / "raybatch_unit_pkg"]


def test_local_modules_ships_each_module_once(user_code: Path) -> None:
    op = make_operator(
        preprocess="raybatch_unit_pkg.sub.post:tidy", postprocess="raybatch_unit_pkg.sub.post.tidy"
    )

    assert op._local_modules(op.build_spec()) == [PROVIDER_DIR, user_code / "raybatch_unit_pkg"]


def test_local_modules_both_functions(user_code: Path) -> None:
    op = make_operator(preprocess="raybatch_unit_fns:pre", postprocess="raybatch_unit_pkg.sub.post:tidy")

    assert op._local_modules(op.build_spec()) == [
        PROVIDER_DIR,
        user_code / "raybatch_unit_fns.py",
        user_code / "raybatch_unit_pkg",
    ]


@pytest.mark.parametrize("field", ["preprocess", "postprocess"])
def test_local_modules_unimportable_module_names_the_parameter(user_code: Path, field: str) -> None:
    op = make_operator(**{field: "raybatch_unit_missing.fn"})

    with pytest.raises(BatchSpecError) as info:
        op._local_modules(op.build_spec())

    assert str(info.value).startswith(f"{field}='raybatch_unit_missing.fn': module 'raybatch_unit_missing'")


def test_runtime_env_uploads_modules_and_keeps_the_users(
    user_code: Path, hook: RayHook, ray_api: respx.MockRouter
) -> None:
    probes = ray_api.get(url__regex=r"/api/packages/gcs/_ray_pkg_[0-9a-f]+\.zip$").respond(404)
    uploads = ray_api.put(url__regex=r"/api/packages/gcs/_ray_pkg_[0-9a-f]+\.zip$").respond(200)
    # The DAG's own scope is replaced: a job cannot put itself into another deployment's warm pools.
    user_env = {
        "env_vars": {"HF_HOME": "/models", POOL_SCOPE_ENV: "prod"},
        "py_modules": ["s3://b/extra.zip"],
    }
    op = make_operator(preprocess="raybatch_unit_fns.pre", runtime_env=user_env)
    spec = op.build_spec()

    runtime_env = op._runtime_env(hook, spec)

    provider_uri = build_provider_package(PROVIDER_DIR).uri
    user_uri = build_py_module_package(user_code / "raybatch_unit_fns.py").uri
    job_uri = build_job_package(spec.model_dump_json()).uri
    assert runtime_env == {
        "env_vars": {"HF_HOME": "/models", POOL_SCOPE_ENV: engine_pool_scope()},
        "py_modules": [provider_uri, user_uri, job_uri, "s3://b/extra.zip"],
    }
    assert engine_pool_scope() != "prod"
    assert op.runtime_env == user_env  # the operator's own field is not modified
    assert probes.call_count == 3
    assert uploads.call_count == 3
    assert spec_in_package(uploads.calls.last.request.content) == spec


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RAYBATCH_WARM_WORKERS", "lots"),
        ("RAYBATCH_WARM_WORKERS", "65"),
        ("RAYBATCH_ENGINE_MAX_RESTARTS", "-1"),
        ("RAYBATCH_KEEP_PREPARED_MIN_ROWS", 5),
    ],
)
def test_a_job_setting_the_job_would_refuse_fails_before_anything_is_uploaded(
    hook: RayHook, ray_api: respx.MockRouter, name: str, value: Any
) -> None:
    uploads = ray_api.put(url__regex=r"/api/packages/gcs/").respond(200)
    op = make_operator(runtime_env={"env_vars": {"HF_HOME": "/models", name: value}})

    with pytest.raises(BatchSpecError, match=f"runtime_env env_vars: {name}="):
        op._runtime_env(hook, op.build_spec())

    assert uploads.call_count == 0


# -- submit, wait, complete ---------------------------------------------------------------------


def test_submit_sends_the_spec_metadata_and_resources(hook: RayHook, ray_api: respx.MockRouter) -> None:
    task_try = TaskTry("d", "r", "t", 2, 3)
    submission_id = task_try.submission_id(KEY)
    ray_api.get(url__regex=r"/api/packages/gcs/").respond(200)
    submit = ray_api.post("/api/jobs/").respond(json={"submission_id": submission_id})
    op = make_operator(entrypoint_resources={"head": 1})
    spec = op.build_spec(run_key=task_try.run_key())

    assert op._submit(hook, spec, task_try, KEY) == submission_id

    body = json.loads(submit.calls.last.request.content)
    assert body["submission_id"] == submission_id
    assert body["entrypoint"] == op.entrypoint(spec)
    assert body["metadata"] == {
        **task_try.metadata(),
        FINGERPRINT_KEY: spec.fingerprint(),
        REUSE_COMMITTED_KEY: "true",
    }
    assert body["entrypoint_resources"] == {"head": 1}
    assert body["runtime_env"]["py_modules"] == [
        build_provider_package(PROVIDER_DIR).uri,
        build_job_package(spec.model_dump_json()).uri,
    ]


# -- execute: submit, attach, take over or resubmit ---------------------------------------------


class FakeStateStore:
    """Airflow's task state store as the operator uses it: get and set by key, kept across tries."""

    def __init__(self, **values: str) -> None:
        self.values: dict[str, str] = dict(values)
        self.sets: list[tuple[str, str]] = []

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value
        self.sets.append((key, value))


def task_try_of(ti: FakeTI, try_number: int | None = None) -> TaskTry:
    number = ti.try_number if try_number is None else try_number
    return TaskTry(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, number)


FINGERPRINT = make_operator().build_spec().fingerprint()


class FakeCluster:
    """The Ray Jobs API of a cluster holding some jobs: get, list, stop, logs, and submit."""

    def __init__(self, router: respx.MockRouter, job_payload: Any) -> None:  # Any: the conftest factory.
        self.router = router
        self.job_payload = job_payload
        self.jobs: list[dict[str, Any]] = []  # Any: JSON job details.
        self.listing = router.get("/api/jobs/").mock(
            side_effect=lambda _: httpx.Response(200, json=self.jobs)
        )
        router.get(url__regex=r"/api/packages/gcs/").respond(404)  # a cluster without the packages yet
        self.uploads = router.put(url__regex=r"/api/packages/gcs/").respond(200)
        self.submit = router.post("/api/jobs/").mock(side_effect=self._submitted)
        self.stops: dict[str, respx.Route] = {}
        self.gets: dict[str, respx.Route] = {}

    def _submitted(self, request: httpx.Request) -> httpx.Response:
        submission_id = json.loads(request.content)["submission_id"]
        if any(job["submission_id"] == submission_id for job in self.jobs):  # as Ray answers a taken id
            return httpx.Response(500, text=f"Job with submission_id {submission_id} already exists.")
        return httpx.Response(200, json={"submission_id": submission_id})

    def add_job(
        self, job_id: str, status: str, metadata: dict[str, str], logs: str = "", end_time: int | None = None
    ) -> dict[str, Any]:  # Any: JSON job details.
        payload = self.job_payload(job_id, status, metadata=metadata, end_time=end_time)
        self.jobs.append(payload)
        self.gets[job_id] = self.router.get(f"/api/jobs/{job_id}").respond(json=payload)
        self.stops[job_id] = self.router.post(f"/api/jobs/{job_id}/stop").respond(json={"stopped": True})
        self.router.get(f"/api/jobs/{job_id}/logs").respond(json={"logs": logs})
        return payload

    def add_try(
        self,
        ti: FakeTI,
        try_number: int,
        status: str,
        fingerprint: str | None = FINGERPRINT,
        logs: str = "",
        end_time: int | None = None,
        manifest: dict[str, Any] | None = None,  # Any: JSON values
    ) -> str:
        """A job an earlier (or this) try of ``ti`` submitted; returns its id. ``manifest``: the driver
        log ends with it, as that job printed it (its ``job_id`` the job's)."""
        task_try = task_try_of(ti, try_number)
        job_id = task_try.submission_id(KEY)
        metadata = task_try.metadata()
        if fingerprint is not None:
            metadata[FINGERPRINT_KEY] = fingerprint
        if manifest is not None:
            logs += "x\n" + manifest_log_line({**manifest, "job_id": job_id}) + "\n"
        self.add_job(job_id, status, metadata, logs=logs, end_time=end_time)
        return job_id

    def add_unknown(self, job_id: str) -> None:
        self.gets[job_id] = self.router.get(f"/api/jobs/{job_id}").respond(404, text="Job does not exist")

    def submitted(self) -> list[dict[str, Any]]:  # Any: JSON bodies.
        return [json.loads(call.request.content) for call in self.submit.calls]

    def shipped_specs(self) -> list[BatchInferenceSpec]:
        """The specs of the job packages uploaded so far."""
        return [spec for call in self.uploads.calls if (spec := spec_in_package(call.request.content))]


def retry_ti(try_number: int) -> FakeTI:
    ti = FakeTI()
    ti.try_number = try_number
    return ti


def test_execute_submits_when_there_is_no_previous_job(ray_conn: str, cluster: FakeCluster) -> None:
    ti = FakeTI()
    task_try = task_try_of(ti)
    other_run = replace(task_try, run_id="scheduled__2026-11-20T00:00:00+00:00")
    cluster.add_job("someone-elses", "RUNNING", {"team": "x"})
    other_metadata = {**other_run.metadata(), FINGERPRINT_KEY: FINGERPRINT}
    cluster.add_job(other_run.submission_id(KEY), "RUNNING", other_metadata)
    store = FakeStateStore()
    op = make_operator(ray_conn_id=ray_conn)

    with pytest.raises(TaskDeferred) as info:
        op.execute({"ti": ti, "task_state_store": store})

    [body] = cluster.submitted()
    assert body["submission_id"] == task_try.submission_id(KEY)
    # No earlier job found (a Ray cluster restarted since, say): the job may still take a version this
    # run committed, when made from the same input, code and model (pipeline/stage/reuse.py).
    assert body["metadata"] == {
        **task_try.metadata(),
        FINGERPRINT_KEY: FINGERPRINT,
        REUSE_COMMITTED_KEY: "true",
    }
    [spec] = cluster.shipped_specs()
    assert body["entrypoint"].endswith(f"--spec-fingerprint {FINGERPRINT}")
    assert spec.run_key == task_try.run_key()
    assert spec.fingerprint() == FINGERPRINT
    assert store.sets == [(JOB_ID_STATE_KEY, task_try.submission_id(KEY))]
    assert ti.xcoms == {"job_id": task_try.submission_id(KEY), "ray_dashboard_url": RAY_URL}
    assert info.value.trigger.serialize()[1]["job_id"] == task_try.submission_id(KEY)
    assert not any(route.called for route in cluster.stops.values())


def test_execute_without_a_state_store_lists_jobs_and_submits(ray_conn: str, cluster: FakeCluster) -> None:
    """Airflow versions without a task state store: the listing alone finds earlier jobs."""
    ti = FakeTI()

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti})

    assert cluster.listing.call_count == 1
    assert [body["submission_id"] for body in cluster.submitted()] == [task_try_of(ti).submission_id(KEY)]


@pytest.mark.parametrize("status", ["RUNNING", "PENDING"])
def test_execute_attaches_to_an_unfinished_job_of_an_earlier_try(
    ray_conn: str, cluster: FakeCluster, status: str
) -> None:
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, status)
    store = FakeStateStore(**{JOB_ID_STATE_KEY: previous})
    op = make_operator(ray_conn_id=ray_conn)

    with pytest.raises(TaskDeferred) as info:
        op.execute({"ti": ti, "task_state_store": store})

    assert not cluster.submit.called
    assert not cluster.stops[previous].called
    assert cluster.listing.call_count == 1  # listed always: the store may lag a newer try's job
    assert info.value.trigger.serialize()[1]["job_id"] == previous
    assert op.job_id == previous
    assert ti.xcoms == {"job_id": previous, "ray_dashboard_url": RAY_URL}
    assert store.sets == []


def test_a_job_stopped_under_a_later_try_is_run_again(ray_conn: str, cluster: FakeCluster) -> None:
    """Cleared while deferred: the new try may attach before the old try's cleanup has stopped the
    job. When that stop lands, the new try submits a job of its own (which resumes), not fail."""
    ti = retry_ti(2)
    attached_at = time.time() - 8
    # as the trigger saw it
    previous = cluster.add_try(ti, 1, "STOPPED", end_time=int((attached_at + 5) * 1000))
    store = FakeStateStore()
    op = make_operator(ray_conn_id=ray_conn)
    stopped = job_event("cancelled", previous, f"Ray job {previous} finished: STOPPED.", "stopped")

    with pytest.raises(TaskDeferred) as info:
        op.execute_complete({"ti": ti, "task_state_store": store}, stopped, attached_at=attached_at)

    [body] = cluster.submitted()
    assert body["submission_id"] == task_try_of(ti).submission_id(KEY)
    assert info.value.trigger.serialize()[1]["job_id"] == op.job_id == body["submission_id"]
    assert store.sets == [(JOB_ID_STATE_KEY, body["submission_id"])]
    assert ti.xcoms["job_id"] == body["submission_id"]


@pytest.mark.parametrize("stopped_after_attach", [CLEANUP_RACE_SECONDS + 1, 3600])
def test_a_deliberate_stop_of_an_earlier_tries_job_fails_the_task(
    ray_conn: str, cluster: FakeCluster, stopped_after_attach: float
) -> None:
    """`ray job stop` of the job a later try attached to, well after the attach, is a
    person's decision: the task fails instead of submitting (and paying for) the rows again."""
    ti = retry_ti(2)
    attached_at = time.time() - stopped_after_attach - 1
    previous = cluster.add_try(ti, 1, "STOPPED", end_time=int((attached_at + stopped_after_attach) * 1000))
    stopped = job_event("cancelled", previous, f"Ray job {previous} finished: STOPPED.", "stopped")

    with pytest.raises(RayJobFailedError, match="STOPPED"):
        make_operator(ray_conn_id=ray_conn).execute_complete({"ti": ti}, stopped, attached_at=attached_at)

    assert not cluster.submit.called


def test_attaching_to_an_earlier_tries_job_remembers_when(ray_conn: str, cluster: FakeCluster) -> None:
    """The attach time travels through the deferral to execute_complete, which tells by it whether that try's
    cleanup stopped the job."""
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, "RUNNING")
    before = time.time()

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": FakeStateStore()})

    assert info.value.trigger.job_id == previous
    assert before <= info.value.kwargs["attached_at"] <= time.time()
    assert not cluster.submit.called


def test_this_tries_own_stopped_job_fails_the_task(ray_conn: str, cluster: FakeCluster) -> None:
    ti = retry_ti(2)
    own = cluster.add_try(ti, 2, "STOPPED")
    stopped = job_event("cancelled", own, f"Ray job {own} finished: STOPPED.", "stopped")

    with pytest.raises(RayJobFailedError) as info:
        make_operator(ray_conn_id=ray_conn).execute_complete({"ti": ti}, stopped)

    assert not cluster.submit.called
    # A deployment whose job another deployment (sharing its secret) stopped was
    # never told why. The error names who can stop a job from outside.
    assert "ray job stop" in str(info.value) and "job_identity_secret" in str(info.value)


def test_a_job_this_task_stopped_says_so(ray_conn: str, cluster: FakeCluster) -> None:
    """A task killed by Airflow (SIGTERM) stops its job in on_kill, and Airflow's
    task runner then lets the wait go on; the job's STOPPED read "stopped from outside this task"."""
    ti = retry_ti(1)
    own = cluster.add_try(ti, 1, "RUNNING")
    op = make_operator(ray_conn_id=ray_conn)
    op.job_id = own
    op.on_kill()
    assert cluster.stops[own].called
    cluster.gets[own].respond(json=cluster.job_payload(own, "STOPPED", metadata=cluster.jobs[0]["metadata"]))
    stopped = job_event("cancelled", own, f"Ray job {own} finished: STOPPED.", "stopped")

    with pytest.raises(RayJobFailedError) as info:
        op.execute_complete({"ti": ti}, stopped)

    assert "This task stopped it: Airflow ended the task" in str(info.value)
    assert "from outside" not in str(info.value)


def test_a_job_this_task_stopped_says_so_when_another_copy_of_the_operator_resumes(
    ray_conn: str, cluster: FakeCluster
) -> None:
    """``airflow dags test`` resumes a deferred task after its inline trigger on another copy of the
    operator than the one on_kill ran on (SIGTERM while the trigger waited)."""
    ti = retry_ti(1)
    own = cluster.add_try(ti, 1, "RUNNING")
    killed = make_operator(ray_conn_id=ray_conn)
    killed.job_id = own
    killed.on_kill()
    cluster.gets[own].respond(json=cluster.job_payload(own, "STOPPED", metadata=cluster.jobs[0]["metadata"]))
    stopped = job_event("cancelled", own, f"Ray job {own} finished: STOPPED.", "stopped")

    with pytest.raises(RayJobFailedError) as info:
        make_operator(ray_conn_id=ray_conn).execute_complete({"ti": ti}, stopped)

    assert "This task stopped it: Airflow ended the task" in str(info.value)


def taken_manifest(
    manifest: dict[str, Any], by: str, committed_by: str
) -> dict[str, Any]:  # Any: JSON values
    """The manifest a job prints when it took the version ``committed_by`` committed (stage/reuse.py)."""
    reused = {
        "job_id": committed_by,
        "version": "v1",
        "finished_at": None,
        "timings": None,
        "engine_pool": None,
    }
    return {
        **manifest,
        "version": "v1",
        "job_id": by,
        "timings": None,
        "engine_pool": None,
        REUSED_RESULT_KEY: reused,
    }


@contextlib.contextmanager
def logged_lines() -> Iterator[list[str]]:
    """The operator's log lines while the block runs (Airflow's task logger is structlog's)."""
    lines: list[str] = []
    with structlog.testing.capture_logs() as events:
        yield lines
    lines += [str(e["event"]) % tuple(e.get("positional_args", ())) for e in events]


def test_a_retry_after_a_succeeded_job_takes_its_version_through_a_job_that_checks_its_binding(
    ray_conn: str, cluster: FakeCluster
) -> None:
    """Airflow cannot see the input files or the model as the cluster reads them: a job of this try
    decides on the cluster whether the committed version was made from what it would make its rows from,
    takes it (generating nothing) or generates again."""
    ti = retry_ti(2)
    manifest = {**MANIFEST, "output_uri": "s3://b/out/"}
    previous = cluster.add_try(ti, 1, "SUCCEEDED", manifest=manifest)
    store = FakeStateStore(**{JOB_ID_STATE_KEY: previous})
    op = make_operator(ray_conn_id=ray_conn)

    with logged_lines() as log, pytest.raises(TaskDeferred) as info:
        op.execute({"ti": ti, "task_state_store": store})

    [body] = cluster.submitted()
    new = task_try_of(ti).submission_id(KEY)
    assert body["submission_id"] == new != previous
    assert body["metadata"][REUSE_COMMITTED_KEY] == "true"
    assert info.value.trigger.serialize()[1]["job_id"] == new
    assert any(
        "the new job takes the version this run committed if nothing it was made from" in line for line in log
    )

    taken = taken_manifest(manifest, new, previous)
    cluster.add_job(new, "SUCCEEDED", body["metadata"], logs="x\n" + manifest_log_line(taken) + "\n")
    with logged_lines() as log:
        result = op.execute_complete({"ti": ti}, job_event("success", new, "ok", "succeeded"))

    assert result == "s3://b/out/"
    assert ti.xcoms["job_id"] == new and ti.xcoms["manifest"] == taken
    assert f"Ray job {new} took version v1, which Ray job {previous} committed" in " ".join(log)


@pytest.mark.parametrize("rendered", ["False", "false", " 0 "])
def test_a_rendered_false_reuse_earlier_result_runs_again(
    ray_conn: str, cluster: FakeCluster, rendered: str
) -> None:
    """``reuse_earlier_result="{{ params.reuse }}"`` with the run's conf saying False (a backfill that
    picks up late data): the succeeded job's result is not taken, a new job runs."""
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, "SUCCEEDED", manifest=MANIFEST)
    op = make_operator(ray_conn_id=ray_conn, reuse_earlier_result=rendered)

    with pytest.raises(TaskDeferred):
        op.execute({"ti": ti, "task_state_store": FakeStateStore(**{JOB_ID_STATE_KEY: previous})})

    [body] = cluster.submitted()
    assert body["submission_id"] != previous
    assert body["metadata"][REUSE_COMMITTED_KEY] == "false"  # the job generates, whatever was committed


@pytest.mark.parametrize("rendered", ["", "None", None])
def test_an_unset_reuse_earlier_result_lets_the_job_take_the_earlier_result(
    ray_conn: str, cluster: FakeCluster, rendered: str | None
) -> None:
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, "SUCCEEDED", manifest=MANIFEST)
    op = make_operator(ray_conn_id=ray_conn, reuse_earlier_result=rendered)

    with pytest.raises(TaskDeferred):
        op.execute({"ti": ti, "task_state_store": FakeStateStore(**{JOB_ID_STATE_KEY: previous})})

    [body] = cluster.submitted()
    assert body["metadata"][REUSE_COMMITTED_KEY] == "true"


def test_a_rendered_reuse_earlier_result_that_is_not_a_flag_names_it(
    ray_conn: str, cluster: FakeCluster
) -> None:
    op = make_operator(ray_conn_id=ray_conn, reuse_earlier_result="{{ params.reuse }}")
    op.reuse_earlier_result = "sometimes"  # as rendered (written so, it fails as the DAG is parsed)

    with pytest.raises(BatchSpecError, match=r"reuse_earlier_result='sometimes' is neither true nor false"):
        op.execute({"ti": retry_ti(2), "task_state_store": FakeStateStore()})
    assert not cluster.submit.called


def test_a_succeeded_job_found_by_listing_is_the_one_whose_version_the_new_job_may_take(
    ray_conn: str, cluster: FakeCluster
) -> None:
    ti = retry_ti(3)
    cluster.add_try(ti, 1, "FAILED")
    previous = cluster.add_try(ti, 2, "SUCCEEDED", manifest=MANIFEST)

    with logged_lines() as log, pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti})

    [body] = cluster.submitted()
    assert body["metadata"][REUSE_COMMITTED_KEY] == "true"
    assert f"Ray job {previous} of an earlier try ended SUCCEEDED" in " ".join(log)


@pytest.mark.parametrize("status", ["FAILED", "STOPPED"])
def test_execute_resubmits_after_a_failed_or_stopped_job(
    ray_conn: str, cluster: FakeCluster, status: str
) -> None:
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, status)
    store = FakeStateStore(**{JOB_ID_STATE_KEY: previous})

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    new_id = task_try_of(ti).submission_id(KEY)
    [body] = cluster.submitted()
    assert body["submission_id"] == new_id != previous
    assert "-t2-" in new_id
    assert body["metadata"]["airflow_try_number"] == "2"
    # Same logical run: the new job resumes the earlier one's staging.
    [spec] = cluster.shipped_specs()
    assert spec.run_key == task_try_of(ti, 1).run_key()
    assert store.values[JOB_ID_STATE_KEY] == new_id
    assert info.value.trigger.serialize()[1]["job_id"] == new_id
    assert not cluster.stops[previous].called


def test_after_a_failed_job_the_task_log_says_its_rows_are_resumed_not_a_version_taken(
    ray_conn: str, cluster: FakeCluster
) -> None:
    """A failed try committed nothing: the log must not say the next job takes its version."""
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, "FAILED")

    with logged_lines() as log, pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": FakeStateStore()})

    [said] = [line for line in log if f"Ray job {previous} of an earlier try ended FAILED" in line]
    assert "resumes the rows it staged" in said and "takes the version" not in said, said


class FakeClock:
    """Stands in for the operator module's ``time``: sleeping advances the clock at once."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(operator_module, "time", fake)
    return fake


def job_statuses(cluster: FakeCluster, job_id: str, *statuses: str) -> None:
    """The job reports these statuses to successive gets, then the last one for ever."""
    metadata = next(job["metadata"] for job in cluster.jobs if job["submission_id"] == job_id)
    answers = iter(statuses)

    def answer(_: httpx.Request) -> httpx.Response:
        status = next(answers, statuses[-1])
        return httpx.Response(200, json=cluster.job_payload(job_id, status, metadata=metadata))

    cluster.gets[job_id].mock(side_effect=answer)


@pytest.mark.parametrize("fingerprint", ["0123456789abcdef", None], ids=["other-spec", "no-fingerprint"])
def test_execute_stops_a_running_job_of_another_spec_and_submits(
    ray_conn: str, cluster: FakeCluster, fingerprint: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operator_module, "STOP_WAIT_SECONDS", 0.01)  # the job never ends: do not wait
    monkeypatch.setattr(operator_module.time, "sleep", lambda _: None)
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, "RUNNING", fingerprint=fingerprint)
    store = FakeStateStore(**{JOB_ID_STATE_KEY: previous})

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    assert cluster.stops[previous].call_count == 1
    new_id = task_try_of(ti).submission_id(KEY)
    assert [body["submission_id"] for body in cluster.submitted()] == [new_id]
    assert info.value.trigger.serialize()[1]["job_id"] == new_id
    assert store.values[JOB_ID_STATE_KEY] == new_id


def test_a_superseded_job_has_ended_before_the_new_one_is_submitted(
    ray_conn: str, cluster: FakeCluster, clock: FakeClock
) -> None:
    """Both jobs would write the same staging folder: the new one starts once the old one stopped."""
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, "RUNNING", fingerprint="0123456789abcdef")
    job_statuses(cluster, previous, "RUNNING", "RUNNING", "RUNNING", "STOPPED")

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": FakeStateStore()})

    calls = [(call.request.method, call.request.url.path) for call in cluster.router.calls]
    stopped_at = calls.index(("POST", f"/api/jobs/{previous}/stop"))
    submitted_at = calls.index(("POST", "/api/jobs/"))
    status_checks = [i for i, call in enumerate(calls) if call == ("GET", f"/api/jobs/{previous}")]
    assert stopped_at < submitted_at
    assert len(status_checks) == 4 and status_checks[-1] < submitted_at  # saw STOPPED, then submitted
    assert clock.sleeps and sum(clock.sleeps) < operator_module.STOP_WAIT_SECONDS


def test_the_wait_for_a_superseded_job_is_bounded(
    ray_conn: str, cluster: FakeCluster, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ignores the stop does not hold the task for ever: after STOP_WAIT_SECONDS it goes on."""
    monkeypatch.setattr(operator_module, "STOP_WAIT_SECONDS", 7.0)
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, "RUNNING", fingerprint="0123456789abcdef")
    job_statuses(cluster, previous, "RUNNING")

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": FakeStateStore()})

    assert 7.0 <= sum(clock.sleeps) <= 8.0
    assert cluster.stops[previous].call_count == 1
    assert [body["submission_id"] for body in cluster.submitted()] == [task_try_of(ti).submission_id(KEY)]


@pytest.mark.parametrize("status", ["SUCCEEDED", "FAILED", "STOPPED"])
def test_an_ended_job_of_another_spec_is_neither_stopped_nor_waited_for(
    ray_conn: str, cluster: FakeCluster, clock: FakeClock, status: str
) -> None:
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, status, fingerprint="0123456789abcdef")

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": FakeStateStore()})

    assert not cluster.stops[previous].called
    assert clock.sleeps == []
    assert len(cluster.submitted()) == 1


def test_on_kill_stops_without_waiting(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, clock: FakeClock
) -> None:
    """on_kill runs while Airflow kills the task: it asks Ray to stop and returns at once."""
    ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "RUNNING"))
    stop = ray_api.post("/api/jobs/j1/stop").respond(json={"stopped": True})
    op = make_operator(ray_conn_id=ray_conn)
    op.job_id = "j1"

    op.on_kill()

    assert stop.call_count == 1
    assert clock.sleeps == []


def test_execute_ignores_the_result_of_another_spec(ray_conn: str, cluster: FakeCluster) -> None:
    """A clear after editing the prompt must run the new prompt, not hand back the old output."""
    ti = retry_ti(2)
    previous = cluster.add_try(
        ti, 1, "SUCCEEDED", fingerprint="0123456789abcdef", logs=manifest_log_line(MANIFEST)
    )
    store = FakeStateStore(**{JOB_ID_STATE_KEY: previous})

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    assert not cluster.stops[previous].called
    assert [body["submission_id"] for body in cluster.submitted()] == [task_try_of(ti).submission_id(KEY)]
    assert "manifest" not in ti.xcoms


def test_execute_falls_back_to_listing_when_the_recorded_job_is_unknown(
    ray_conn: str, cluster: FakeCluster
) -> None:
    """The store names a job the cluster no longer knows (a restarted head): listing finds ours."""
    ti = retry_ti(3)
    cluster.add_unknown("raybatch-gone")
    running = cluster.add_try(ti, 2, "RUNNING")
    store = FakeStateStore(**{JOB_ID_STATE_KEY: "raybatch-gone"})

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    assert cluster.gets["raybatch-gone"].call_count == 1
    assert cluster.listing.call_count == 1
    assert not cluster.submit.called
    assert info.value.trigger.serialize()[1]["job_id"] == running


def test_execute_submits_when_the_recorded_job_is_unknown_and_none_is_listed(
    ray_conn: str, cluster: FakeCluster
) -> None:
    ti = retry_ti(2)
    cluster.add_unknown("raybatch-gone")
    store = FakeStateStore(**{JOB_ID_STATE_KEY: "raybatch-gone"})

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    assert cluster.listing.call_count == 1
    assert [body["submission_id"] for body in cluster.submitted()] == [task_try_of(ti).submission_id(KEY)]
    assert store.values[JOB_ID_STATE_KEY] == task_try_of(ti).submission_id(KEY)


def test_a_recorded_job_missing_from_the_listing_is_fetched(ray_conn: str, cluster: FakeCluster) -> None:
    """The store names try 2's job, which the listing does not show (yet): it is looked up and,
    being newer than the listed try 1, attached to."""
    ti = retry_ti(3)
    cluster.add_try(ti, 1, "FAILED")
    recorded = cluster.add_try(ti, 2, "RUNNING")
    cluster.jobs.pop()  # not listed
    store = FakeStateStore(**{JOB_ID_STATE_KEY: recorded})

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    assert cluster.listing.call_count == 1
    assert cluster.gets[recorded].call_count == 1
    assert not cluster.submit.called
    assert info.value.trigger.serialize()[1]["job_id"] == recorded


def test_a_newer_listed_job_wins_over_an_older_recorded_one_missing_from_the_listing(
    ray_conn: str, cluster: FakeCluster
) -> None:
    ti = retry_ti(3)
    recorded = cluster.add_try(ti, 1, "RUNNING")
    cluster.jobs.pop()
    listed = cluster.add_try(ti, 2, "SUCCEEDED", manifest=MANIFEST)
    store = FakeStateStore(**{JOB_ID_STATE_KEY: recorded})

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    # Not attached to the recorded try-1 job: try 2's succeeded, and this try's job may take its version.
    [body] = cluster.submitted()
    assert info.value.trigger.serialize()[1]["job_id"] == body["submission_id"] not in (recorded, listed)
    assert body["metadata"][REUSE_COMMITTED_KEY] == "true"


def test_listing_takes_the_newest_try_by_number(ray_conn: str, cluster: FakeCluster) -> None:
    """Try 10 is newer than try 2, though "10" < "2" as text."""
    ti = retry_ti(11)
    cluster.add_try(ti, 2, "FAILED")
    newest = cluster.add_try(ti, 10, "RUNNING")
    cluster.add_try(ti, 9, "FAILED")

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": FakeStateStore()})

    assert not cluster.submit.called
    assert info.value.trigger.serialize()[1]["job_id"] == newest


@pytest.mark.parametrize(
    "change",
    [
        {"map_index": 3},
        {"run_id": "manual__2026-11-22T00:00:00+00:00"},
        {"task_id": "other"},
        {"dag_id": "other"},
    ],
)
def test_listing_ignores_jobs_of_other_runs(
    ray_conn: str, cluster: FakeCluster, change: dict[str, Any]
) -> None:
    ti = retry_ti(2)
    other = replace(task_try_of(ti, 1), **change)
    cluster.add_job(other.submission_id(KEY), "RUNNING", {**other.metadata(), FINGERPRINT_KEY: FINGERPRINT})

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti})

    assert [body["submission_id"] for body in cluster.submitted()] == [task_try_of(ti).submission_id(KEY)]
    assert not cluster.stops[other.submission_id(KEY)].called


def test_execute_in_the_worker_waits_for_the_attached_job(
    ray_conn: str, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    ti = retry_ti(2)
    previous = cluster.add_try(ti, 1, "RUNNING", manifest=MANIFEST)
    metadata = cluster.jobs[0]["metadata"]
    statuses = ("RUNNING", "RUNNING", "SUCCEEDED")
    payloads = [cluster.job_payload(previous, status, metadata=metadata) for status in statuses]
    cluster.gets[previous].mock(side_effect=[httpx.Response(200, json=p) for p in payloads])
    monkeypatch.setattr(operator_module.time, "sleep", lambda _: None)
    store = FakeStateStore(**{JOB_ID_STATE_KEY: previous})

    op = make_operator(ray_conn_id=ray_conn, deferrable=False)

    result = op.execute({"ti": ti, "task_state_store": store})

    assert result == MANIFEST["output_uri"]
    assert not cluster.submit.called
    assert ti.xcoms["job_id"] == previous


def test_a_newer_unrecorded_job_wins_over_the_recorded_one(ray_conn: str, cluster: FakeCluster) -> None:
    """The store may lag the cluster: try 2 submitted its job but died (or its POST timed out
    client-side after Ray accepted it) before ``store.set``. Try 3 must find try 2's running job,
    as ``_previous_job``'s docstring promises ("the newest Ray job of this logical run"), rather than
    submit a third job that runs beside it on the same staging folder.
    """
    ti = retry_ti(3)
    recorded = cluster.add_try(ti, 1, "FAILED")
    unrecorded = cluster.add_try(ti, 2, "RUNNING")
    store = FakeStateStore(**{JOB_ID_STATE_KEY: recorded})

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    assert cluster.submitted() == [], "submitted a second job while try 2's job is still running"
    assert info.value.trigger.serialize()[1]["job_id"] == unrecorded


def test_a_recreated_scheduled_runs_live_attempt_wins_over_the_old_runs_later_try(
    ray_conn: str, cluster: FakeCluster
) -> None:
    """A scheduled run deleted and created again keeps its ``run_after``, so the old run's jobs are
    this run's too. The old run got to try 2; the new run's try 1 found that id taken and submitted
    attempt 2, which is running. The new run's try 2 must attach to that job (the newest), not take
    the old try 2's failure for the newest and submit a second live job beside it.
    """
    ti = retry_ti(2)
    old_first = cluster.add_try(ti, 1, "FAILED")
    old_second = cluster.add_try(ti, 2, "FAILED")
    new_first = replace(task_try_of(ti, 1), attempt=2)
    metadata = {**new_first.metadata(), FINGERPRINT_KEY: FINGERPRINT}
    cluster.add_job(new_first.submission_id(KEY), "RUNNING", metadata)
    for job, started_ms in zip(cluster.jobs, (1_000, 2_000, 3_000), strict=True):
        job["start_time"] = started_ms

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti})

    assert cluster.submitted() == [], f"submitted beside the live job (old jobs {old_first}, {old_second})"
    assert info.value.trigger.serialize()[1]["job_id"] == new_first.submission_id(KEY)


def test_execute_defers_with_the_execution_timeout(ray_conn: str, cluster: FakeCluster) -> None:
    ti = FakeTI()
    submission_id = task_try_of(ti).submission_id(KEY)
    op = make_operator(ray_conn_id=ray_conn, poll_interval_seconds=3, execution_timeout=timedelta(minutes=10))
    started = time.time()

    with pytest.raises(TaskDeferred) as info:
        op.execute({"ti": ti})

    assert ti.xcoms == {"job_id": submission_id, "ray_dashboard_url": RAY_URL}
    assert op.job_id == submission_id
    trigger = info.value.trigger
    assert isinstance(trigger, RayJobTrigger)
    kwargs = trigger.serialize()[1]
    deadline = kwargs.pop("deadline")
    # The event waits for the deferral to settle (triggers/ray.py DEFER_SETTLE_SECONDS).
    assert started < kwargs.pop("fire_not_before") <= time.time() + DEFER_SETTLE_SECONDS
    assert kwargs == {
        "job_id": submission_id,
        "ray_conn_id": ray_conn,
        "poll_interval_seconds": 3.0,
        "timeout_seconds": 600.0,
        "retry_window_seconds": None,
        "progress_interval_seconds": 0.0,
        "owns_job": True,  # the operator's trigger stops its job when the task is killed
    }
    # One absolute deadline, from the try's start; Airflow's own deferral timeout only a minute later.
    assert started + 600 <= deadline <= time.time() + 600
    assert info.value.method_name == "execute_complete"
    assert info.value.kwargs == {"deadline": deadline, "attached_at": None}
    assert timedelta(seconds=655) <= info.value.timeout <= timedelta(seconds=660)


def test_execute_invalid_spec_submits_nothing(ray_conn: str, ray_api: respx.MockRouter) -> None:
    submit = ray_api.post("/api/jobs/").respond(json={"submission_id": "x"})
    op = make_operator(ray_conn_id=ray_conn, sampling_params="{{ params.sampling_params }}")
    op.sampling_params = '{"max_tokens": 0}'  # as the template renders it, after the task was built

    with pytest.raises(BatchSpecError, match="max_tokens"):
        op.execute({"ti": FakeTI()})

    assert not submit.called


def test_wait_in_worker_stops_the_job_when_interrupted(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "RUNNING"))
    stop = ray_api.post("/api/jobs/j1/stop").respond(json={"stopped": True})

    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(operator_module.time, "sleep", interrupted)
    op = make_operator()

    with pytest.raises(KeyboardInterrupt):
        op._wait_in_worker(hook, "j1")

    assert stop.call_count == 1


def test_wait_in_worker_returns_the_terminal_event(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_api.get("/api/jobs/j1").mock(
        side_effect=[httpx.Response(200, json=job_payload("j1", s)) for s in ("RUNNING", "FAILED")]
    )
    stop = ray_api.post("/api/jobs/j1/stop").respond(json={"stopped": True})
    monkeypatch.setattr(operator_module.time, "sleep", lambda _: None)

    event = make_operator()._wait_in_worker(hook, "j1")

    assert (event["status"], event["termination_reason"]) == ("error", "failed")
    assert not stop.called


# One failed row in 30: within the default max_failed_fraction (0.1).
MANIFEST = {
    "status": "complete",
    "job_id": "j1",
    "output_uri": "s3://b/out/",
    "rows_in": 30,
    "rows_out": 29,
    "rows_failed": 1,
}


def test_execute_complete_success_pushes_the_manifest(ray_conn: str, ray_api: respx.MockRouter) -> None:
    log = "starting\n" + manifest_log_line(MANIFEST) + "\nbye\n"
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": log})
    ti = FakeTI()

    result = make_operator(ray_conn_id=ray_conn).execute_complete(
        {"ti": ti}, job_event("success", "j1", "ok", "succeeded")
    )

    assert result == "s3://b/out/"
    assert ti.xcoms == {"job_id": "j1", "manifest": MANIFEST, "output_uri": "s3://b/out/"}


def test_execute_complete_success_without_manifest_fails(ray_conn: str, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": "no manifest here\n"})

    with pytest.raises(RayJobFailedError) as info:
        make_operator(ray_conn_id=ray_conn).execute_complete(
            {"ti": FakeTI()}, job_event("success", "j1", "ok", "succeeded")
        )

    assert "driver log holds no run manifest" in str(info.value)
    assert "s3://b/out/" in str(info.value)  # where the committed manifest was looked for
    assert "no manifest here" in str(info.value)


def test_execute_complete_error_raises_with_the_log_tail(ray_conn: str, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": "loading\nRuntimeError: CUDA out of memory\n"})
    ti = FakeTI()

    with pytest.raises(RayJobFailedError) as info:
        make_operator(ray_conn_id=ray_conn).execute_complete(
            {"ti": ti}, job_event("error", "j1", "Ray job j1 finished: FAILED.", "failed")
        )

    assert str(info.value).startswith("Ray job j1 finished: FAILED.")
    assert str(info.value).endswith("RuntimeError: CUDA out of memory")
    assert info.value.status == "failed"
    assert ti.xcoms == {}


def test_execute_complete_rejects_a_malformed_event() -> None:
    with pytest.raises(RayTriggerEventError):
        make_operator().execute_complete({"ti": FakeTI()}, None)


@pytest.mark.parametrize(("status", "stops"), [("RUNNING", True), ("PENDING", True), ("SUCCEEDED", False)])
def test_on_kill_stops_an_unfinished_job(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, status: str, stops: bool
) -> None:
    ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", status))
    stop = ray_api.post("/api/jobs/j1/stop").respond(json={"stopped": True})
    op = make_operator(ray_conn_id=ray_conn)
    op.job_id = "j1"

    op.on_kill()

    assert stop.called is stops


def test_on_kill_survives_an_unreachable_cluster(ray_conn: str, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/jobs/j1").mock(side_effect=httpx.ConnectError("refused"))
    op = make_operator(ray_conn_id=ray_conn)
    op.job_id = "j1"

    op.on_kill()  # must not raise while the task is already failing


def test_on_kill_without_a_job_does_nothing(ray_api: respx.MockRouter) -> None:
    make_operator().on_kill()

    assert not ray_api.calls
