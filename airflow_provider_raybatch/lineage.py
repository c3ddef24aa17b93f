"""OpenLineage for RayLLMBatchOperator: the input and output datasets, their row counts and the Ray job.

Only the operator's ``get_openlineage_facets_on_*`` methods import this module, and only the
OpenLineage provider calls them, so importing the provider never loads openlineage.

The output dataset is ``output_uri``, the location readers open (its ``manifest.json`` names the
current version), not the version folder: each rerun of a date then updates one dataset with a new
``version`` facet instead of creating another, and a symlink names the version's outputs folder.
Nothing here carries engine arguments, the runtime_env or credentials.
"""

from __future__ import annotations

from typing import ClassVar

from airflow.providers.openlineage.extractors import OperatorLineage
from attrs import Factory, define
from openlineage.client.generated.base import (
    BaseFacet,
    DatasetFacet,
    InputDataset,
    InputDatasetFacet,
    JobFacet,
    OutputDataset,
    OutputDatasetFacet,
    RunFacet,
)
from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
from openlineage.client.generated.external_query_run import ExternalQueryRunFacet
from openlineage.client.generated.input_statistics_input_dataset import InputStatisticsInputDatasetFacet
from openlineage.client.generated.output_statistics_output_dataset import OutputStatisticsOutputDatasetFacet
from openlineage.client.generated.symlinks_dataset import Identifier, SymlinksDatasetFacet

from airflow_provider_raybatch.shared.json_types import Kwargs
from airflow_provider_raybatch.shared.run_manifest import ManifestJson, RunManifest
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: ExternalQueryRunFacet's ``source`` for a Ray job.
RAY_SOURCE = "ray"
#: Keys of the custom facets (prefixed, as OpenLineage asks of custom facets).
JOB_FACET_KEY = "raybatch_job"
RUN_FACET_KEY = "raybatch_run"


def dataset_name(uri: str) -> tuple[str, str]:
    """The OpenLineage (namespace, name) of a local path or ``s3://`` URI, per its naming conventions.

    ``s3://bucket/key/`` -> (``s3://bucket``, ``key``); a local path -> (``file``, the path);
    ``file://host/path`` -> (``file://host``, ``/path``). A folder's trailing slash is dropped so that
    ``out/`` and ``out`` are one dataset.
    """
    if uri.startswith("s3://"):
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return f"s3://{bucket}", key.rstrip("/") or "/"
    if uri.startswith("file://"):
        host, slash, path = uri.removeprefix("file://").partition("/")
        return (f"file://{host}" if host else "file"), (slash + path).rstrip("/") or "/"
    return "file", uri.rstrip("/") or "/"


@define
class RayBatchJobFacet(JobFacet):
    """What the batch does: the model, the prompt and the sampling (no engine arguments or credentials)."""

    model: str
    inputFormat: str | None = None  # noqa: N815 - OpenLineage facets use camelCase
    outputFormat: str | None = None  # noqa: N815
    systemPrompt: str | None = None  # noqa: N815
    userTemplate: str | None = None  # noqa: N815
    messagesColumn: str | None = None  # noqa: N815
    imageColumn: str | None = None  # noqa: N815
    preprocess: str | None = None
    postprocess: str | None = None
    samplingParams: Kwargs = Factory(dict)  # noqa: N815

    # Airflow's redactor hides values under key names such as "max_tokens" (it contains "token").
    _additional_skip_redact: ClassVar[list[str]] = ["model", "samplingParams"]


@define
class RayBatchRunFacet(RunFacet):
    """This run of the batch as its manifest records it: the Ray job, the version and the counts."""

    jobId: str | None = None  # noqa: N815
    specFingerprint: str | None = None  # noqa: N815
    version: str | None = None
    rowsIn: int | None = None  # noqa: N815
    rowsOut: int | None = None  # noqa: N815
    rowsFailed: int | None = None  # noqa: N815
    rowsDuplicate: int | None = None  # noqa: N815
    rowsResumed: int | None = None  # noqa: N815
    tokensIn: int | None = None  # noqa: N815
    tokensOut: int | None = None  # noqa: N815
    wallSeconds: float | None = None  # noqa: N815
    errorsByReason: dict[str, int] = Factory(dict)  # noqa: N815
    versions: dict[str, str] = Factory(dict)

    _additional_skip_redact: ClassVar[list[str]] = [
        "jobId",
        "specFingerprint",
        "version",
        "tokensIn",
        "tokensOut",
        "versions",
    ]


def job_facet(spec: BatchInferenceSpec) -> RayBatchJobFacet:
    return RayBatchJobFacet(
        model=spec.model,
        inputFormat=spec.input_format,
        outputFormat=spec.output_format,
        systemPrompt=spec.system_prompt,
        userTemplate=spec.user_template,
        messagesColumn=spec.messages_column,
        imageColumn=spec.image_column,
        preprocess=spec.preprocess,
        postprocess=spec.postprocess,
        samplingParams=dict(spec.sampling_params),
    )


def _count(run: RunManifest, field: str) -> int | None:
    """A count the manifest names, or None: a manifest without it does not say, which is not 0 rows."""
    return getattr(run, field) if field in run.model_fields_set else None


def _version(run: RunManifest) -> str | None:
    """The version the manifest names, as text: a value of another type (``3``) is still the version."""
    written = run.to_json().get("version")
    return None if written is None else str(written)


def run_facet(manifest: ManifestJson, job_id: str | None) -> RayBatchRunFacet:
    run = RunManifest.of(manifest, lenient=True)
    return RayBatchRunFacet(
        jobId=job_id,
        specFingerprint=run.spec_fingerprint,
        version=_version(run),
        rowsIn=_count(run, "rows_in"),
        rowsOut=_count(run, "rows_out"),
        rowsFailed=_count(run, "rows_failed"),
        rowsDuplicate=run.rows_duplicate,
        rowsResumed=run.rows_resumed,
        tokensIn=run.tokens_in,
        tokensOut=run.tokens_out,
        wallSeconds=run.wall_seconds,
        errorsByReason=dict(run.errors_by_reason),
        versions=dict(run.versions or {}),
    )


def operator_lineage(
    input_uri: str,
    output_uri: str,
    spec: BatchInferenceSpec | None = None,
    manifest: ManifestJson | None = None,
    job_id: str | None = None,
) -> OperatorLineage:
    """The task's lineage: before the run (no manifest) the datasets it reads and writes; after a
    committed run also their row counts, the committed version and the Ray job.

    :param spec: the validated spec, for the job facet; None leaves the facet out.
    :param manifest: the run manifest the job printed; None before or without a committed run.
    :param job_id: the Ray job's submission id, as ``externalQuery``.
    """
    run = RunManifest.of(manifest, lenient=True) if manifest else None
    input_namespace, input_name = dataset_name(input_uri)
    output_namespace, output_name = dataset_name(output_uri)
    input_facets: dict[str, InputDatasetFacet] = {}
    output_facets: dict[str, OutputDatasetFacet] = {}
    output_dataset_facets: dict[str, DatasetFacet] = {}
    if run is not None and (rows_in := _count(run, "rows_in")) is not None:
        input_facets["inputStatistics"] = InputStatisticsInputDatasetFacet(rowCount=rows_in)
    if run is not None and (rows_out := _count(run, "rows_out")) is not None:
        output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(rowCount=rows_out)
    if run is not None and (version := _version(run)):
        output_dataset_facets["version"] = DatasetVersionDatasetFacet(datasetVersion=version)
    if run is not None and run.outputs_uri:
        namespace, name = dataset_name(run.outputs_uri)
        output_dataset_facets["symlinks"] = SymlinksDatasetFacet(
            identifiers=[Identifier(namespace=namespace, name=name, type="LOCATION")]
        )
    run_facets: dict[str, BaseFacet] = {}
    if job_id:
        run_facets["externalQuery"] = ExternalQueryRunFacet(externalQueryId=job_id, source=RAY_SOURCE)
    if run is not None:
        run_facets[RUN_FACET_KEY] = run_facet(run, job_id)
    return OperatorLineage(
        inputs=[InputDataset(namespace=input_namespace, name=input_name, inputFacets=input_facets)],
        outputs=[
            OutputDataset(
                namespace=output_namespace,
                name=output_name,
                facets=output_dataset_facets,
                outputFacets=output_facets,
            )
        ],
        run_facets=run_facets,
        job_facets={JOB_FACET_KEY: job_facet(spec)} if spec is not None else {},
    )
