"""Extra links on the task: the Ray dashboard's page of the job, the output location, the run report.

Airflow 3 evaluates them in the worker when the task defers or ends and keeps each as an XCom, so
the links work in the UI while the task waits in the triggerer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

from airflow_provider_raybatch.shared.json_types import JsonValue

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: XCom keys the operator pushes at submit time.
JOB_ID_XCOM_KEY = "job_id"
DASHBOARD_URL_XCOM_KEY = "ray_dashboard_url"


def ray_job_url(dashboard_url: str, job_id: str) -> str:
    """The Ray dashboard's page of one job (its single-page app routes on the fragment)."""
    return f"{dashboard_url.rstrip('/')}/#/jobs/{quote(job_id, safe='')}"


def output_location_url(output_uri: str, folder: bool = True) -> str:
    """A browsable address for an output folder (or file): the S3 console for s3://, file:// for a path."""
    if output_uri.startswith("s3://"):
        bucket, _, key = output_uri.removeprefix("s3://").partition("/")
        if not folder:
            return f"https://s3.console.aws.amazon.com/s3/object/{bucket}?prefix={quote(key)}"
        prefix = key.rstrip("/") + "/" if key else ""
        return f"https://s3.console.aws.amazon.com/s3/buckets/{bucket}?prefix={quote(prefix)}"
    if "://" in output_uri:
        return output_uri
    return f"file://{quote(output_uri)}"


def _xcom(ti_key: TaskInstanceKey, key: str) -> JsonValue:
    from airflow.sdk.execution_time.xcom import XCom

    return XCom.get_value(ti_key=ti_key, key=key)


class RayJobLink(BaseOperatorLink):
    """The Ray dashboard's page of the task's job."""

    name = "Ray job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        # The job from the operator that ran (it sets job_id on every path that settles on a job, and
        # from the trigger's event after a deferral), not pulled: a task refused before any job was
        # submitted logged the SDK's "[error] XCom not found ... key='job_id'" after its own error.
        # The dashboard's address was pushed with the job's id, by this try.
        job_id = getattr(operator, "job_id", None)
        if not job_id:
            return ""
        dashboard_url = _xcom(ti_key, DASHBOARD_URL_XCOM_KEY)
        return ray_job_url(str(dashboard_url), str(job_id)) if dashboard_url else ""


class RunReportLink(BaseOperatorLink):
    """The HTML run report beside the committed outputs (once the run succeeded)."""

    name = "Run report"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        # Read from the operator that ran, not pulled: Airflow evaluates links in the worker when the task
        # defers too, before any manifest exists, and its client logs a missing XCom at ERROR level.
        manifest = getattr(operator, "manifest", None) or {}
        report_uri = manifest.get("report_uri") if isinstance(manifest, dict) else None
        return output_location_url(str(report_uri), folder=False) if report_uri else ""


class BatchOutputLink(BaseOperatorLink):
    """Where the batch writes (its rendered ``output_uri``)."""

    name = "Batch output"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        output_uri = getattr(operator, "output_uri", None)
        return output_location_url(str(output_uri)) if output_uri else ""
