"""What a common.ai batch becomes on our side: the job's settings, its folders and its spec.

common.ai hands an adapter the prompts, the bare model and ``request_params`` (merged into every
request body), and builds the adapter from the connection's host and password only. The settings
of the Ray job (engine, replicas, where its files go) therefore come from two places, both read in
the worker: the ``ray`` connection's extra ``llm_batch`` (defaults for every batch on that cluster)
and the operator's ``request_params["raybatch"]`` (this batch), the operator's winning key by key, and
inside ``engine_kwargs`` and ``sampling_params`` key by key too (a batch that adds a structured-outputs
backend keeps the connection's ``max_model_len``).
Everything else in ``request_params`` stays in each request's body, as for OpenAI. Pure functions:
nothing here calls the network or reads a file (the deployment's key is given, not looked up).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.job_ids import signed
from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue, Kwargs
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: The key of ``request_params`` and of the connection's extras that holds the job's settings.
SETTINGS_KEY = "raybatch"
CONNECTION_EXTRA_KEY = "llm_batch"
#: The one endpoint common.ai's requests are written for (its OpenAI adapter's request lines).
ENDPOINT = "/v1/chat/completions"
#: Settings of the adapter itself, not fields of the job spec.
_ADAPTER_KEYS = frozenset({"work_uri", "check_layout"})
#: Spec fields the adapter sets itself: the batch's own model, files and request format.
_OWNED_FIELDS = frozenset(
    {"model", "input_uri", "output_uri", "input_format", "output_format", "openai_endpoint", "run_key"}
)
#: Row-shaping fields that do not apply to OpenAI request lines (the spec refuses them too).
_ROW_FIELDS = frozenset(
    {
        "messages_column",
        "user_template",
        "system_prompt",
        "image_column",
        "preprocess",
        "postprocess",
        "id_column",
        "keep_columns",
    }
)
#: Settings whose keys merge one by one (the connection's, then the operator's): the engine's and the
#: sampling defaults. Others (replica_resources, runtime_env, ...) are replaced whole.
_MERGED_FIELDS = frozenset({"engine_kwargs", "sampling_params"})
#: A dry run commits nothing for common.ai to land: run it with RayLLMBatchOperator instead.
_UNSUPPORTED_FIELDS = frozenset({"dry_run", "dry_run_rows_per_second"})
#: What the batch key's HMAC signs besides common.ai's key: it signs nothing else under the deployment's
#: key (submission ids sign a task try's values, joined with the same separator, shared/job_ids.py).
_BATCH_KEY_LABEL = "airflow-provider-raybatch common.ai batch key v1"
#: Spec defaults that differ for a common.ai batch: row failures are common.ai's to judge
#: (``fail_on_partial_error``), so the job commits whatever rows failed.
_DEFAULTS: Kwargs = {"max_failed_fraction": 1.0}


@dataclass(frozen=True)
class JobSettings:
    """The Ray job's settings for one common.ai batch.

    :param spec_fields: fields of :class:`BatchInferenceSpec` (engine_kwargs, concurrency, ...).
    :param work_uri: the folder of the batch's input and outputs; None: under ``result_path``.
    :param check_layout: refuse a layout the cluster's alive nodes cannot host (the operator's).
    """

    spec_fields: Kwargs
    work_uri: str | None = None
    check_layout: bool = True


def split_request_params(
    request_params: Mapping[str, JsonValue] | None,
) -> tuple[JsonObject, JsonObject]:
    """(the body parameters every request gets, the job settings under ``request_params["raybatch"]``)."""
    body = dict(request_params or {})
    settings = body.pop(SETTINGS_KEY, None)
    if settings is None:
        return body, {}
    if isinstance(settings, str):  # a templated "{{ params.raybatch | tojson }}"
        settings = _from_text(f"request_params[{SETTINGS_KEY!r}]", "", settings, json_only=True)
    if not isinstance(settings, Mapping):
        raise BatchSpecError(
            f"request_params[{SETTINGS_KEY!r}]={settings!r} must be a dict of job settings "
            "(e.g. {'engine_kwargs': {'max_model_len': 4096}}); see docs/common-ai-llm-batch.md."
        )
    return body, dict(settings)


def job_settings(
    connection_extra: Mapping[str, JsonValue], operator_settings: Mapping[str, JsonValue]
) -> JobSettings:
    """Merge the connection's defaults and the operator's settings (the operator's win), checking names."""
    defaults = connection_extra.get(CONNECTION_EXTRA_KEY) or {}
    if not isinstance(defaults, Mapping):
        raise BatchSpecError(
            f"the ray connection's extra {CONNECTION_EXTRA_KEY!r}={defaults!r} must be a JSON object of job "
            'settings (e.g. {"engine_kwargs": {"max_model_len": 4096}}).'
        )
    merged: JsonObject = {}
    for where, values in (
        (f"connection extra {CONNECTION_EXTRA_KEY!r}", defaults),
        (f"request_params[{SETTINGS_KEY!r}]", operator_settings),
    ):
        for name, value in values.items():
            _check_name(where, str(name))
            if isinstance(value, str) and value.strip() in ("", "null", "None"):
                merged.pop(str(name), None)  # an unset Param rendered through a template: the default
                continue
            value = _from_text(where, str(name), value, json_only=_takes_json(str(name)))
            earlier = merged.get(str(name))
            if str(name) in _MERGED_FIELDS and isinstance(value, Mapping) and isinstance(earlier, Mapping):
                value = {**earlier, **value}
            merged[str(name)] = value
    check_layout = merged.pop("check_layout", True)
    if not isinstance(check_layout, bool):
        raise BatchSpecError(f"check_layout={check_layout!r} must be true or false.")
    work_uri = merged.pop("work_uri", None)
    if work_uri is not None and (not isinstance(work_uri, str) or not work_uri.strip()):
        raise BatchSpecError(f"work_uri={work_uri!r} must be a local path or an s3:// URI.")
    return JobSettings({**_DEFAULTS, **merged}, work_uri, check_layout)


def _from_text(where: str, name: str, value: JsonValue, json_only: bool = False) -> JsonValue:
    """A dict or list written as JSON text, as common.ai's templated ``request_params`` renders them
    (``"{{ params.engine_kwargs | tojson }}"``); other values as they are.

    :param json_only: the setting takes a dict or list, so any text must be its JSON.
    """
    if not isinstance(value, str) or (not json_only and value.strip()[:1] not in ("{", "[")):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        label = f"{where}[{name!r}]" if name else where
        raise BatchSpecError(
            f"{label}={value!r} is text but not valid JSON ({err.msg}): give a dict, or its JSON text "
            "(a template's `| tojson`)."
        ) from err


def _takes_json(name: str) -> bool:
    """Whether the spec field ``name`` holds a dict or a list (so text given for it must be JSON)."""
    field = BatchInferenceSpec.model_fields.get(name)
    annotation = str(field.annotation) if field is not None else ""
    return "dict" in annotation or "list" in annotation


def _check_name(where: str, name: str) -> None:
    if name in _OWNED_FIELDS:
        raise BatchSpecError(
            f"{where}[{name!r}] is set by the adapter: the model comes from model_id ('raybatch:<model>'), "
            "the files from result_path (or work_uri). Remove it."
        )
    if name in _ROW_FIELDS:
        raise BatchSpecError(
            f"{where}[{name!r}] does not apply to @task.llm_batch: each request is its own prompt "
            "(system_prompt is the operator's parameter)."
        )
    if name in _UNSUPPORTED_FIELDS:
        raise BatchSpecError(
            f"{where}[{name!r}] is not supported through @task.llm_batch: a dry run commits no results to "
            "land. Run the dry run with RayLLMBatchOperator(dry_run=True)."
        )
    if name not in BatchInferenceSpec.model_fields and name not in _ADAPTER_KEYS:
        raise BatchSpecError(
            f"{where}[{name!r}] is not a job setting. Use a field of BatchInferenceSpec (engine_kwargs, "
            "sampling_params, concurrency, replica_resources, batch_size, ...) or work_uri / check_layout; "
            "request body parameters (temperature, ...) go in request_params itself."
        )


def cluster_uri(uri: str) -> str:
    """``uri`` as the cluster reads it: a local path or ``s3://``; other schemes cannot be read there."""
    text = uri.strip()
    if text.startswith("file://"):
        return text.removeprefix("file://")
    if "://" not in text or text.startswith("s3://"):
        return text.rstrip("/") or "/"
    raise BatchSpecError(
        f"result_path={uri!r}: the Ray job reads and writes local paths and s3:// only. Use one of those, "
        "or set request_params['raybatch']['work_uri'] to a folder both Airflow and the cluster can reach."
    )


def batch_key(idempotency_key: str, secret: bytes) -> str:
    """This deployment's name for one task instance's batches: an HMAC of common.ai's key under ``secret``.

    common.ai's key hashes dag, task, run id and map index with no secret, so dev and prod running one
    DAG against one result store have the same key. Named by it, their jobs would share a folder and a
    run key: one's commit would replace the other's, and each would wait on the other's staging.
    Signed as a submission id is (HMAC-SHA256 under the deployment's key, values joined by the unit
    separator, 16 hex digits), the name differs between deployments and stays the same for one
    deployment's retries, which resume the staging of the same folder.

    :param secret: the deployment's key (``jobs.deployment_secret.deployment_key()``).
    """
    return signed(secret, (_BATCH_KEY_LABEL, idempotency_key))


def batch_folder(settings: JobSettings, result_path: str, key: str) -> str:
    """The folder of one task instance's batches: ``<work_uri or result_path>/_raybatch/<batch key>``.

    :param key: the :func:`batch_key`, never common.ai's key itself (the same in every deployment).
    """
    base = cluster_uri(settings.work_uri or result_path)
    return f"{base.rstrip('/')}/_raybatch/{key}"


def run_key(key: str) -> str:
    """The job's ``run_key`` (its staging folder under the output) for the :func:`batch_key` ``key``."""
    return f"common-ai-{key}"


def input_uri(folder: str, input_fingerprint: str) -> str:
    """One file per input: a clear with other prompts writes a new file, never over a running job's."""
    return f"{folder}/input-{input_fingerprint[:16]}.jsonl"


def output_uri(folder: str) -> str:
    """One output per task instance: a retry's job resumes the rows an earlier job staged there."""
    return f"{folder}/output"


def build_spec(
    settings: JobSettings, *, model: str, input_uri: str, output_uri: str, run_key: str
) -> BatchInferenceSpec:
    """The job spec; a bad setting raises :class:`BatchSpecError` naming it."""
    return BatchInferenceSpec.build(
        **settings.spec_fields,
        model=model,
        input_uri=input_uri,
        output_uri=output_uri,
        openai_endpoint=ENDPOINT,
        run_key=run_key,
    )
