"""Tests of airflow_provider_raybatch/operators/llm_batch.py: spec, shipping and the job's lifecycle."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from airflow.sdk.exceptions import TaskDeferred

import airflow_provider_raybatch
from airflow_provider_raybatch.exceptions import BatchSpecError, RayJobFailedError, RayTriggerEventError
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.manifest import manifest_log_line
from airflow_provider_raybatch.operators import llm_batch as operator_module
from airflow_provider_raybatch.operators.llm_batch import PIPELINE_MODULE, RayLLMBatchOperator
from airflow_provider_raybatch.specs import BatchInferenceSpec
from airflow_provider_raybatch.triggers.ray import RayJobTrigger
from airflow_provider_raybatch.utils.events import job_event
from airflow_provider_raybatch.utils.job_ids import TaskTry
from airflow_provider_raybatch.utils.packaging import build_py_module_package

PROVIDER_DIR = Path(airflow_provider_raybatch.__file__).parent
REQUIRED = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "input_uri": "s3://b/in/data.jsonl",
    "output_uri": "s3://b/out/",
}


def make_operator(**kwargs: Any) -> RayLLMBatchOperator:  # Any: operator arguments.
    arguments = {"task_id": "classify", **REQUIRED, **kwargs}
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
    "name", ["sampling_params", "engine_kwargs", "replica_resources", "keep_columns", "concurrency"]
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

    assert str(info.value).startswith(f"{name}={text!r} is text but not valid JSON")


def test_malformed_concurrency_text_names_the_parameter() -> None:
    with pytest.raises(BatchSpecError, match=r"concurrency.*\(got '\(1, 2'\)"):
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

    assert set(RayLLMBatchOperator.template_fields) <= spec_fields
    assert {"model", "input_uri", "output_uri", "user_template", "sampling_params"} <= set(
        RayLLMBatchOperator.template_fields
    )


# -- entrypoint ---------------------------------------------------------------------------------


def test_entrypoint_round_trip() -> None:
    spec = make_operator(
        system_prompt="Say 'yes' or \"no\"; don't `echo $HOME` \\ nor $(rm -rf /).\nThanks — merci.",
        user_template="Is {Company} ok?",
        sampling_params={"stop": ["\n", "'"], "max_tokens": 3},
        concurrency=(1, 2),
    ).build_spec()
    op = make_operator()

    entrypoint = op.entrypoint(spec)
    argv = shlex.split(entrypoint)

    assert argv[:4] == ["python", "-m", PIPELINE_MODULE, "--spec"]
    assert len(argv) == 5
    assert BatchInferenceSpec.from_json(argv[4]) == spec


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
    user_env = {"env_vars": {"HF_HOME": "/models"}, "py_modules": ["s3://b/extra.zip"]}
    op = make_operator(preprocess="raybatch_unit_fns.pre", runtime_env=user_env)

    runtime_env = op._runtime_env(hook, op.build_spec())

    provider_uri = build_py_module_package(PROVIDER_DIR).uri
    user_uri = build_py_module_package(user_code / "raybatch_unit_fns.py").uri
    assert runtime_env == {
        "env_vars": {"HF_HOME": "/models"},
        "py_modules": [provider_uri, user_uri, "s3://b/extra.zip"],
    }
    assert op.runtime_env == {"env_vars": {"HF_HOME": "/models"}, "py_modules": ["s3://b/extra.zip"]}
    assert probes.call_count == 2
    assert uploads.call_count == 2


# -- submit, wait, complete ---------------------------------------------------------------------


def test_submit_when_no_job_exists(hook: RayHook, ray_api: respx.MockRouter) -> None:
    task_try = TaskTry("d", "r", "t", 2, 3)
    submission_id = task_try.submission_id()
    ray_api.get(f"/api/jobs/{submission_id}").respond(404, text="no such job")
    ray_api.get(url__regex=r"/api/packages/gcs/").respond(200)
    submit = ray_api.post("/api/jobs/").respond(json={"submission_id": submission_id})
    op = make_operator(entrypoint_resources={"head": 1})
    spec = op.build_spec()

    assert op._submit_or_attach(hook, spec, task_try) == submission_id

    body = json.loads(submit.calls.last.request.content)
    assert body["submission_id"] == submission_id
    assert body["entrypoint"] == op.entrypoint(spec)
    assert body["metadata"] == {**task_try.metadata(), "raybatch_spec_fingerprint": spec.fingerprint()}
    assert body["entrypoint_resources"] == {"head": 1}
    assert body["runtime_env"]["py_modules"] == [build_py_module_package(PROVIDER_DIR).uri]


def test_attach_when_the_job_exists(hook: RayHook, ray_api: respx.MockRouter, job_payload: Any) -> None:
    task_try = TaskTry("d", "r", "t", -1, 1)
    submission_id = task_try.submission_id()
    ray_api.get(f"/api/jobs/{submission_id}").respond(json=job_payload(submission_id, "RUNNING"))
    submit = ray_api.post("/api/jobs/").respond(json={"submission_id": "other"})
    op = make_operator()

    assert op._submit_or_attach(hook, op.build_spec(), task_try) == submission_id
    assert not submit.called


def test_execute_defers_with_the_execution_timeout(
    ray_conn: str, ray_api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    ti = FakeTI()
    submission_id = TaskTry(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number).submission_id()
    ray_api.get(f"/api/jobs/{submission_id}").respond(404)
    ray_api.get(url__regex=r"/api/packages/gcs/").respond(200)
    ray_api.post("/api/jobs/").respond(json={"submission_id": submission_id})
    op = make_operator(ray_conn_id=ray_conn, poll_interval_seconds=3, execution_timeout=timedelta(minutes=10))

    with pytest.raises(TaskDeferred) as info:
        op.execute({"ti": ti})

    assert ti.xcoms == {"job_id": submission_id}
    assert op.job_id == submission_id
    trigger = info.value.trigger
    assert isinstance(trigger, RayJobTrigger)
    assert trigger.serialize()[1] == {
        "job_id": submission_id,
        "ray_conn_id": ray_conn,
        "poll_interval_seconds": 3.0,
        "timeout_seconds": 600.0,
    }
    assert info.value.method_name == "execute_complete"
    assert info.value.timeout == timedelta(seconds=660)


def test_execute_invalid_spec_submits_nothing(ray_conn: str, ray_api: respx.MockRouter) -> None:
    submit = ray_api.post("/api/jobs/").respond(json={"submission_id": "x"})
    op = make_operator(ray_conn_id=ray_conn, sampling_params='{"max_tokens": 0}')

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


MANIFEST = {"output_uri": "s3://b/out/", "rows_in": 3, "rows_out": 2, "rows_failed": 1}


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

    assert "printed no run manifest" in str(info.value)
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
