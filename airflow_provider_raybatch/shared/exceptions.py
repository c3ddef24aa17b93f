"""Exception types of the provider.

Plain Python on purpose: the spec and its errors are also imported on the Ray cluster, where
Airflow is not installed. Airflow fails a task on any exception, so nothing here needs
``AirflowException``.
"""

from __future__ import annotations


class RayBatchError(Exception):
    """Base class of every error this provider raises."""


class BatchSpecError(RayBatchError, ValueError):
    """A parameter of the batch job is invalid; the message names the parameter and the fix."""


class RayBatchConfigError(RayBatchError):
    """The Airflow deployment lacks a setting the provider needs; the message names it."""


class RayHookError(RayBatchError):
    """The Ray Jobs API answered with an error, or could not be reached."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class RayUnavailableError(RayHookError):
    """The Ray Jobs API could not be reached or answered 5xx: worth retrying (a head restart, a proxy)."""

    def __init__(self, message: str, *, status_code: int | None = None, request_sent: bool = True) -> None:
        super().__init__(message, status_code=status_code)
        #: False when the connection failed before the request left: safe to resend even a submit.
        self.request_sent = request_sent


class RayAuthError(RayHookError):
    """The Ray cluster rejected the request's credentials (HTTP 401 or 403)."""


class RayJobNotFoundError(RayHookError):
    """No job with the given submission id exists on the cluster."""


class RayJobAlreadyExistsError(RayHookError):
    """A job with the given submission id was submitted before."""


class RayUnexpectedResponseError(RayHookError):
    """The dashboard address answered, but not as the Ray Jobs API does: a redirect or a non-JSON page.

    Almost always a proxy in front of the dashboard (an SSO or OAuth gateway whose session cookie
    expired, an ingress that wants https or another path), or a host that is not a Ray dashboard.
    Not retried: it does not pass with time. :attr:`url` is the address called (never with
    credentials), :attr:`location` a redirect's target without its query, :attr:`content_type`
    what the answer said it was.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        url: str,
        location: str | None = None,
        content_type: str | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.url = url
        self.location = location
        self.content_type = content_type


class RayJobFailedError(RayBatchError):
    """The Ray job ended FAILED or STOPPED."""

    def __init__(self, message: str, *, job_id: str, status: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status


class RayBatchRowsFailedError(RayBatchError):
    """More of the run's rows failed than the task allows (``max_failed_fraction``, ``max_failed_rows``).

    The job held the run rather than commit it (its version stays out of ``manifest.json``), or, for
    a result committed earlier, the thresholds are stricter now. The message (also :attr:`message`)
    gives the counts, the most common reasons, what is current and where the run's rows are;
    ``rows_failed`` counts them as the thresholds do, without duplicate ids.
    """

    def __init__(self, message: str, *, rows_in: int, rows_failed: int, job_id: str) -> None:
        super().__init__(message)
        self.message = message
        self.rows_in = rows_in
        self.rows_failed = rows_failed
        self.job_id = job_id


class RayJobTimeoutError(RayBatchError):
    """Waiting for the Ray job took longer than allowed."""

    def __init__(self, message: str, *, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class RayTriggerEventError(RayBatchError):
    """A trigger event arrived that the operator cannot understand."""


class ClusterLayoutError(RayBatchError):
    """The job's engine replicas do not fit the Ray cluster; names the parameter and what the cluster has."""

    def __init__(self, message: str, *, parameter: str) -> None:
        super().__init__(message)
        self.parameter = parameter


#: Where DAGs import these from (a thin module naming them), and so the path that tracebacks, task logs and
#: Airflow's import errors give them: ``airflow_provider_raybatch.exceptions.BatchSpecError: ...``.
_PUBLIC_MODULE = "airflow_provider_raybatch.exceptions"
for _type in list(globals().values()):
    if isinstance(_type, type) and issubclass(_type, RayBatchError):
        _type.__module__ = _PUBLIC_MODULE
del _type
