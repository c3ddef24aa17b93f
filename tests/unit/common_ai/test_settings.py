"""The job settings of a common.ai batch: where they come from, which win, and what is refused."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.common_ai import settings as job
from airflow_provider_raybatch.shared.exceptions import BatchSpecError


def test_request_params_split_into_body_and_job_settings() -> None:
    body, settings = job.split_request_params({"temperature": 0.2, "raybatch": {"batch_size": 8}})
    assert body == {"temperature": 0.2}
    assert settings == {"batch_size": 8}
    assert job.split_request_params(None) == ({}, {})


def test_request_params_raybatch_must_be_a_dict_or_its_json_text() -> None:
    with pytest.raises(
        BatchSpecError, match=r"request_params\['raybatch'\]='fast' is text but not valid JSON"
    ):
        job.split_request_params({"raybatch": "fast"})
    with pytest.raises(BatchSpecError, match=r"request_params\['raybatch'\]=\[1\] must be a dict"):
        job.split_request_params({"raybatch": "[1]"})
    # A whole templated "{{ params.raybatch | tojson }}" (a new user's first try).
    body, settings = job.split_request_params(
        {"seed": 1, "raybatch": '{"concurrency": 1, "keep_warm_seconds": null}'}
    )
    assert (body, settings) == ({"seed": 1}, {"concurrency": 1, "keep_warm_seconds": None})


def test_operator_settings_win_over_the_connection_key_by_key() -> None:
    extra = {"llm_batch": {"engine_kwargs": {"max_model_len": 512}, "batch_size": 16}, "timeout_seconds": 5}
    merged = job.job_settings(extra, {"engine_kwargs": {"max_model_len": 4096}, "check_layout": False})
    assert merged.spec_fields == {
        "max_failed_fraction": 1.0,
        "engine_kwargs": {"max_model_len": 4096},
        "batch_size": 16,
    }
    assert merged.check_layout is False and merged.work_uri is None


def test_engine_and_sampling_settings_merge_key_by_key_and_others_are_replaced() -> None:
    """A batch that adds a structured-outputs backend keeps the connection's CPU engine settings (a new
    user's batch lost them, and vLLM then asked for 92% of the machine's memory)."""
    extra = {
        "llm_batch": {
            "engine_kwargs": {"max_model_len": 512, "gpu_memory_utilization": 0.3},
            "sampling_params": {"temperature": 0.0},
            "replica_resources": {"CPU": 1},
        }
    }
    merged = job.job_settings(
        extra,
        {
            "engine_kwargs": '{"structured_outputs_config": {"backend": "xgrammar"}, "max_model_len": 1024}',
            "sampling_params": {"max_tokens": 8},
            "replica_resources": {"GPU": 1},
        },
    )
    assert merged.spec_fields["engine_kwargs"] == {
        "max_model_len": 1024,
        "gpu_memory_utilization": 0.3,
        "structured_outputs_config": {"backend": "xgrammar"},
    }
    assert merged.spec_fields["sampling_params"] == {"temperature": 0.0, "max_tokens": 8}
    assert merged.spec_fields["replica_resources"] == {"GPU": 1}


def test_templated_json_text_and_unset_params_are_read_back() -> None:
    merged = job.job_settings({}, {"engine_kwargs": '{"max_model_len": 512}', "replica_resources": "null"})
    assert merged.spec_fields == {"max_failed_fraction": 1.0, "engine_kwargs": {"max_model_len": 512}}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"model": "x"}, r"request_params\['raybatch'\]\['model'\] is set by the adapter"),
        ({"output_uri": "/x"}, r"\['output_uri'\] is set by the adapter"),
        ({"user_template": "{x}"}, r"\['user_template'\] does not apply to @task.llm_batch"),
        ({"dry_run": True}, r"\['dry_run'\] is not supported .* RayLLMBatchOperator\(dry_run=True\)"),
        ({"engine_kwarg": {}}, r"\['engine_kwarg'\] is not a job setting"),
        ({"engine_kwargs": "{not json"}, r"\['engine_kwargs'\]='\{not json' is text but not valid JSON"),
        ({"engine_kwargs": "not json{"}, r"\['engine_kwargs'\]='not json\{' is text but not valid JSON"),
        ({"replica_resources": "CPU=1"}, r"\['replica_resources'\]='CPU=1' is text but not valid JSON"),
        ({"check_layout": "yes"}, r"check_layout='yes' must be true or false"),
        ({"work_uri": 3}, r"work_uri=3 must be a local path or an s3:// URI"),
    ],
)
def test_bad_settings_fail_naming_the_field(settings: dict, message: str) -> None:
    with pytest.raises(BatchSpecError, match=message):
        job.job_settings({}, settings)


def test_connection_settings_are_named_as_the_connections() -> None:
    with pytest.raises(
        BatchSpecError, match=r"connection extra 'llm_batch'\['batchsize'\] is not a job setting"
    ):
        job.job_settings({"llm_batch": {"batchsize": 3}}, {})
    with pytest.raises(BatchSpecError, match=r"extra 'llm_batch'=\[1\] must be a JSON object"):
        job.job_settings({"llm_batch": [1]}, {})


def test_a_bad_spec_value_fails_naming_the_spec_field() -> None:
    settings = job.job_settings({}, {"concurrency": 0})
    with pytest.raises(BatchSpecError, match="concurrency"):
        job.build_spec(settings, model="m", input_uri="/i.jsonl", output_uri="/o", run_key="k")


@pytest.mark.parametrize(
    ("result_path", "folder"),
    [
        ("file:///data/results/", "/data/results/_raybatch/abcd"),
        ("/data/results", "/data/results/_raybatch/abcd"),
        ("s3://bucket/prefix/", "s3://bucket/prefix/_raybatch/abcd"),
    ],
)
def test_the_batch_folder_is_under_result_path(result_path: str, folder: str) -> None:
    assert job.batch_folder(job.job_settings({}, {}), result_path, "abcd") == folder


def test_work_uri_replaces_result_path_and_other_schemes_are_refused() -> None:
    settings = job.job_settings({}, {"work_uri": "s3://shared/work"})
    assert job.batch_folder(settings, "gs://bucket/x", "k") == "s3://shared/work/_raybatch/k"
    with pytest.raises(
        BatchSpecError, match=r"result_path='gs://bucket/x': the Ray job reads and writes local"
    ):
        job.batch_folder(job.job_settings({}, {}), "gs://bucket/x", "k")


def test_the_spec_reads_openai_lines_and_commits_whatever_rows_failed() -> None:
    spec = job.build_spec(
        job.job_settings({}, {}),
        model="m",
        input_uri="/w/input-1.jsonl",
        output_uri="/w/output",
        run_key="common-ai-k",
    )
    assert spec.openai_endpoint == "/v1/chat/completions"
    assert (spec.input_format, spec.output_format) == ("jsonl", "jsonl")
    assert spec.max_failed_fraction == 1.0
