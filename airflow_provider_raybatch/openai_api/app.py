"""The OpenAI-compatible Batch API: ``/v1/files`` and ``/v1/batches`` on the Airflow API server.

Served as an Airflow 3 FastAPI plugin (:mod:`.plugin`) under ``/openai``, so an OpenAI client works
unchanged with ``base_url="<airflow>/openai/v1"`` and an Airflow API token (``POST /auth/token``)
as its API key. Every route checks that token with Airflow's own auth manager: reading needs read
access to the batch DAG's runs; uploading, deleting, creating and cancelling need permission to create
them (never to edit or delete them: see docs/security.md for the roles to give Batch API users).
Each batch is a run of the batch DAG (:mod:`.dag`) whose run id is the batch id.

Who sees what (docs/security.md): each file and batch records its owner, and a user sees and acts on
their own only; an *admin* (a user who may edit Airflow connections, and so could reach the job's
data anyway) sees and acts on all. Another user's object answers 404, as a missing one does. The
token must come in the ``Authorization`` header: the API server's session cookie is not taken here,
so a page on another site cannot make a signed-in browser upload, create or cancel (CSRF).
Request bodies are bounded (``[raybatch] openai_max_upload_bytes``, ``openai_max_body_bytes``) before
they are parsed, and ``metadata`` by OpenAI's limits. Each user's files and open batches are limited
too, and the limits hold when requests come at once, from any number of API server processes
(:mod:`.quota`).

The dependencies are imported at module level: FastAPI resolves the routes' (string) annotations in
this module's globals.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_provider_raybatch.openai_api import settings as openai_settings
from airflow_provider_raybatch.openai_api.body_limit import BodySizeLimit
from airflow_provider_raybatch.openai_api.dag import BATCH_TASK_ID
from airflow_provider_raybatch.openai_api.quota import RESERVATION_TTL_SECONDS, Usage, has_room, stays_within
from airflow_provider_raybatch.openai_api.status import TERMINAL_STATUSES, RunState, batch_status
from airflow_provider_raybatch.openai_api.store import (
    BATCH_ID,
    NotFoundError,
    OpenAIStore,
    TooLargeError,
    new_id,
    public,
)
from airflow_provider_raybatch.shared.json_types import JsonObject
from airflow_provider_raybatch.shared.jsonl import count_requests
from airflow_provider_raybatch.shared.openai_endpoints import CHAT, COMPLETIONS, EMBEDDINGS

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS)
#: OpenAI's only completion window is "24h"; a private deployment may want another, so a duration in
#: seconds, minutes, hours or days ("90m", "2h", "45s") is taken too.
_WINDOW = re.compile(r"([1-9][0-9]{0,6})([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: The longest window taken: past it a deadline is no deadline (and timers overflow).
MAX_WINDOW_SECONDS = 30 * 86400
_CHUNK = 1 << 20


class CreateBatchRequest(BaseModel):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None


def completion_window_seconds(window: str) -> int | None:
    """``"24h"`` -> 86400; None for what is not a duration of at most 30 days."""
    match = _WINDOW.fullmatch(window)
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)] if match else None
    return seconds if seconds is not None and seconds <= MAX_WINDOW_SECONDS else None


def _openai_error(
    status_code: int, message: str, param: str | None = None, code: str | None = None
) -> HTTPException:
    """An HTTPException whose body the OpenAI clients read as their error (see the handler below)."""
    return HTTPException(status_code, {"message": message, "param": param, "code": code})


def _error_body(exc: StarletteHTTPException) -> JsonObject:
    detail = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail)}
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}.get(
        exc.status_code, "invalid_request_error"
    )
    return {
        "error": {
            "message": detail.get("message"),
            "type": kind,
            "param": detail.get("param"),
            "code": detail.get("code"),
        }
    }


def _run_state(session: Session, dag_id: str, run_id: str) -> RunState:
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if run is None:
        return RunState(run_state=None)
    task = session.scalar(
        select(TaskInstance).where(
            TaskInstance.dag_id == dag_id,
            TaskInstance.run_id == run_id,
            TaskInstance.task_id == BATCH_TASK_ID,
        )
    )
    return RunState(
        run_state=_value(run.state),
        run_start=run.start_date,
        run_end=run.end_date,
        task_state=_value(task.state) if task is not None else None,
        task_start=task.start_date if task is not None else None,
        task_end=task.end_date if task is not None else None,
    )


def _value(state: Any) -> str | None:  # Any: an Airflow state enum, text or None.
    return getattr(state, "value", state)


def _stop_run(session: Session, dag_id: str, run_id: str) -> None:
    """Mark the run failed, as the UI's "mark failed" does: the task's job is then stopped (a
    deferred task's trigger stops it on cleanup, a running task's ``on_kill`` does)."""
    from airflow.api.common.mark_tasks import set_dag_run_state_to_failed
    from airflow.models.dagbag import DBDagBag

    dag = DBDagBag().get_latest_version_of_dag(dag_id, session=session)
    if dag is not None:
        set_dag_run_state_to_failed(dag=dag, run_id=run_id, commit=True, session=session)


def _chunks(file: UploadFile) -> Iterator[bytes]:
    while chunk := file.file.read(_CHUNK):
        yield chunk


def _holds_a_slot(record: JsonObject, run: RunState, now: float) -> bool:
    """Whether a batch counts against its owner's open batches: it is open, or its run is not in sight.

    A run another request starts is seen once that request's transaction commits, after it has
    answered (and where a transaction reads one snapshot, MySQL's or SQLite's, only by a later one);
    until then the batch's status reads "failed". So a batch without a run counts for as long as a
    reservation would; past that it is one whose request died before starting its run: failed.
    """
    if run.run_state is None:
        return now - record["created_at"] < RESERVATION_TTL_SECONDS
    return record["expires_at"] > now and batch_status(record, run, now)[0] not in TERMINAL_STATUSES


def _require_bearer_token(request: Request) -> None:
    """The API token must come in the Authorization header: a browser's session cookie is refused.

    A cross-site form (multipart upload, a body-less POST) is a "simple" request that carries the
    cookie; it can never set this header without a CORS preflight, which the server does not grant.
    """
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _openai_error(
            401,
            "Send your Airflow API token as 'Authorization: Bearer <token>' (cookies are not accepted here).",
        )


def _check_metadata(metadata: dict[str, str] | None, config: openai_settings.OpenAISettings) -> None:
    """OpenAI's metadata limits (configurable): a 400 naming the limit, never a stored oversize record."""
    if metadata is None:
        return
    if len(metadata) > config.max_metadata_pairs:
        raise _openai_error(
            400,
            f"metadata has {len(metadata)} keys; at most {config.max_metadata_pairs} are allowed.",
            "metadata",
        )
    for key, value in metadata.items():
        if len(key) > config.max_metadata_key_chars:
            raise _openai_error(
                400,
                f"metadata key {key[:20]!r}... is over {config.max_metadata_key_chars} characters.",
                "metadata",
            )
        if len(value) > config.max_metadata_value_chars:
            raise _openai_error(
                400, f"metadata[{key!r}] is over {config.max_metadata_value_chars} characters.", "metadata"
            )


def _is_admin(user: BaseUser) -> bool:
    """Whether ``user`` sees everyone's files and batches: one who may edit Airflow connections.

    Such a user can already change the credentials the batch job uses, so the store's data is no
    secret from them; every other user sees their own objects only.
    """
    from airflow.api_fastapi.app import get_auth_manager

    return bool(get_auth_manager().is_authorized_connection(method="PUT", user=user))


class _BatchService:
    """What the routes share: the settings, the store, and the batch DAG's runs.

    :param config: the ``[raybatch] openai_*`` settings.
    """

    def __init__(self, config: openai_settings.OpenAISettings) -> None:
        self.config = config
        self.store = OpenAIStore(config.files_uri, config.files_conn_id)
        self.dag_id = config.dag_id

    def owned(
        self, lookup: Callable[[str], JsonObject], what: str, object_id: str, user: BaseUser
    ) -> JsonObject:
        """The file or batch, if it exists and ``user`` owns it (or is an admin); else a 404 for both."""
        try:
            record = lookup(object_id)
        except NotFoundError as err:
            raise _openai_error(404, f"No {what} with id {object_id[:80]!r}.", code="not_found") from err
        if record.get("owner") != user.get_id() and not _is_admin(user):
            raise _openai_error(404, f"No {what} with id {object_id[:80]!r}.", code="not_found")
        return record

    @staticmethod
    def listed(lister: Callable[[str | None], list[JsonObject]], user: BaseUser) -> list[JsonObject]:
        """Everyone's records for an admin; else the user's own, read from their owner index only."""
        return lister(None) if _is_admin(user) else lister(user.get_id())

    # -- files ----------------------------------------------------------------------------------

    def too_many_files(self) -> HTTPException:
        return _openai_error(
            429,
            f"You have {self.config.max_files_per_user} files, the most one user may keep: "
            "delete some first.",
            "file",
            "too_many_files",
        )

    def store_upload(self, file: UploadFile, owner: str, owner_name: str) -> JsonObject:
        """The upload, kept only within its owner's quota (quota.py): a refused one leaves nothing."""
        store, limit = self.store, self.config.max_files_per_user
        file_id = new_id("file")
        with store.reserved(owner, file_id) as mine:
            if not has_room(store.file_usage(owner), mine, limit):
                raise self.too_many_files()
            record = store.add_file(
                _chunks(file),
                (file.filename or "upload.jsonl")[:255],
                "batch",
                owner=owner,
                owner_name=owner_name,
                max_bytes=self.config.max_upload_bytes,
                file_id=file_id,
            )
            if not stays_within(lambda: store.file_usage(owner), mine, limit):
                store.delete_file(file_id)
                raise self.too_many_files()
        return record

    # -- batches --------------------------------------------------------------------------------

    def batch_object(self, record: JsonObject, session: Session) -> JsonObject:
        """The OpenAI batch object, read only: a GET never writes to the store or changes the run (an
        expired batch is stopped by its own task, whose deadline is the completion window)."""
        store = self.store
        run = _run_state(session, self.dag_id, record["id"])
        status, times = batch_status(record, run, now=time.time())
        manifest = store.read_json(f"{record['output_uri']}/manifest.json") if status == "completed" else None
        counts = self._staged_counts(record)
        if manifest is not None:
            counts = {key: int(manifest["request_counts"][key]) for key in ("completed", "failed")}
        output_file_id = error_file_id = None
        if manifest is not None:
            output_file_id = store.output_file_id(record["id"], "output") if counts["completed"] else None
            error_file_id = store.output_file_id(record["id"], "errors") if counts["failed"] else None
        return {
            "id": record["id"],
            "object": "batch",
            "endpoint": record["endpoint"],
            "errors": None,
            "input_file_id": record["input_file_id"],
            "completion_window": record["completion_window"],
            "status": status,
            "output_file_id": output_file_id,
            "error_file_id": error_file_id,
            "created_at": record["created_at"],
            "expires_at": record["expires_at"],
            **times,
            "request_counts": {"total": record["request_total"], **counts},
            "metadata": record.get("metadata"),
        }

    def _staged_counts(self, record: JsonObject) -> dict[str, int]:
        """Requests done so far: the staged parts' sidecars (pipeline/stage/parts.py) of the running job."""
        done = {"completed": 0, "failed": 0}
        for sidecar in self.store.staged_sidecars(record["id"]):
            done["completed"] += int(sidecar.get("rows_out", 0))
            done["failed"] += int(sidecar.get("rows_failed", 0))
        return done

    @staticmethod
    def too_many_batches(count: int) -> HTTPException:
        return _openai_error(
            429,
            f"You have {count} batches open, the most one user may: wait for some to finish.",
            code="too_many_open_batches",
        )

    def batch_usage(self, owner: str, session: Session, creating: str) -> Usage:
        """``owner``'s batches for their open-batch quota (quota.py). ``creating`` is the request's own
        batch: it has no run yet, so its run is not looked up (nor is it counted: it is the one asking)."""
        reservations = self.store.reservations(owner, BATCH_ID)  # first: see OpenAIStore.reservations
        records = self.store.batches(owner)
        now = time.time()
        counted = [
            record["id"]
            for record in records
            if record["id"] != creating
            and _holds_a_slot(record, _run_state(session, self.dag_id, record["id"]), now)
        ]
        existing = frozenset(record["id"] for record in records)
        return Usage(counted=frozenset(counted), existing=existing, reservations=reservations)

    def start_run(self, record: JsonObject, session: Session, user: BaseUser) -> None:
        """The batch's DAG run (its run id is the batch id); a 503 if it cannot start, keeping nothing."""
        from airflow.api.common.trigger_dag import trigger_dag
        from airflow.utils.types import DagRunTriggeredByType

        try:
            # No conf: the run's task reads this record (its id is the run id) for its paths.
            trigger_dag(
                self.dag_id,
                run_id=record["id"],
                conf={},
                triggered_by=DagRunTriggeredByType.REST_API,
                triggering_user_name=user.get_name(),
                session=session,
            )
        except Exception as err:  # DagNotFound, a DAG that refuses manual runs: log it, keep nothing
            self.store.delete_batch(record["id"])
            log.exception("Could not start a run of the batch DAG %r for %s.", self.dag_id, record["id"])
            raise _openai_error(
                503,
                f"Could not start the batch DAG {self.dag_id!r} ({type(err).__name__}); "
                "see the API server's log.",
            ) from err

    def create_batch(self, body: CreateBatchRequest, session: Session, user: BaseUser) -> JsonObject:
        """The new batch's object, its record saved and its run started within its owner's quota."""
        window = _checked_window(body, self.config)
        input_file = self.owned(self.store.file, "file", body.input_file_id, user)
        owner, limit = user.get_id(), self.config.max_open_batches_per_user
        batch_id = new_id("batch")
        with self.store.reserved(owner, batch_id) as mine:
            usage = self.batch_usage(owner, session, batch_id)
            if not has_room(usage, mine, limit):
                raise self.too_many_batches(usage.in_use(mine))
            if input_file["purpose"] != "batch":
                raise _openai_error(
                    400,
                    f"file {body.input_file_id!r} has purpose {input_file['purpose']!r}, not 'batch'.",
                    "input_file_id",
                )
            total = count_requests(self.store.file_content(body.input_file_id))
            created_at = int(time.time())
            record = {
                "id": batch_id,
                "endpoint": body.endpoint,
                "input_file_id": body.input_file_id,
                "completion_window": body.completion_window,
                "created_at": created_at,
                "expires_at": created_at + window,
                "metadata": body.metadata,
                "request_total": total,
                "output_uri": self.store.output_uri(batch_id),
                "owner": owner,
                "owner_name": user.get_name(),
            }
            self.store.save_batch(record)
            if not stays_within(lambda: self.batch_usage(owner, session, batch_id), mine, limit):
                self.store.delete_batch(batch_id)  # before its run starts: a refused batch runs nothing
                raise self.too_many_batches(limit)
            self.start_run(record, session, user)
        return self.batch_object(record, session)


def _checked_window(body: CreateBatchRequest, config: openai_settings.OpenAISettings) -> int:
    """The batch's completion window in seconds, once its endpoint, window and metadata are taken."""
    if body.endpoint not in ENDPOINTS:
        raise _openai_error(
            400, f"endpoint {body.endpoint[:60]!r}: supported are {list(ENDPOINTS)}.", "endpoint"
        )
    window = completion_window_seconds(body.completion_window)
    if window is None:
        raise _openai_error(
            400,
            f"completion_window {body.completion_window[:20]!r}: use '24h' (or a duration such as '90m').",
            "completion_window",
        )
    _check_metadata(body.metadata, config)
    return window


def create_app(config: openai_settings.OpenAISettings) -> FastAPI:
    app = FastAPI(
        title="Ray Batch: OpenAI-compatible Batch API",
        description="OpenAI's /v1/files and /v1/batches, run as Airflow DAG runs on a Ray cluster.",
        # No unauthenticated /docs, /redoc or /openapi.json: the routes are OpenAI's, documented there.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(_require_bearer_token)],
    )
    app.add_middleware(
        BodySizeLimit,
        upload_path_suffix="/v1/files",
        max_upload_bytes=config.max_upload_bytes,
        max_body_bytes=config.max_body_bytes,
    )
    _add_error_handlers(app)
    service = _BatchService(config)
    can_read = [Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=config.dag_id))]
    can_write = [Depends(requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=config.dag_id))]
    _add_file_routes(app, service, can_read, can_write)
    _add_batch_routes(app, service, can_read, can_write)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, which the OpenAI clients read."""

    @app.exception_handler(StarletteHTTPException)  # ours, FastAPI's and the router's (404, 405)
    async def openai_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(_error_body(exc), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """A 400 in OpenAI's shape naming the first bad field, without echoing the body back."""
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or None
        message = (
            f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "Invalid request."))
        )
        return JSONResponse(_error_body(_openai_error(400, message[:300], where)), status_code=400)


def _add_file_routes(app: FastAPI, service: _BatchService, can_read: list[Any], can_write: list[Any]) -> None:
    """``/v1/files``: upload, list, retrieve, content, delete. ``can_read``/``can_write``: the routes'
    Airflow permission dependencies (Any: FastAPI's ``Depends`` objects)."""
    store = service.store

    @app.post("/v1/files", dependencies=can_write)
    async def upload_file(request: Request, user: GetUserDep) -> dict[str, Any]:
        """The multipart body is read here, after the token and permission checks (a declared File()
        parameter would be spooled to disk before any check)."""
        form = await request.form(max_files=1, max_fields=1)
        try:
            file, purpose = form.get("file"), form.get("purpose")
            if not isinstance(file, UploadFile):
                raise _openai_error(400, "Send the file as the multipart field 'file'.", "file")
            if purpose != "batch":
                raise _openai_error(
                    400, f"purpose {str(purpose)[:40]!r}: this API takes 'batch' files only.", "purpose"
                )
            try:
                record = await run_in_threadpool(service.store_upload, file, user.get_id(), user.get_name())
            except TooLargeError as err:
                raise _openai_error(
                    413, f"{err} Split it into smaller files.", "file", "file_too_large"
                ) from err
        finally:
            await form.close()
        return public(record)

    @app.get("/v1/files", dependencies=can_read)
    def list_files(user: GetUserDep, purpose: str | None = None) -> dict[str, Any]:
        records = [
            public(r) for r in service.listed(store.files, user) if purpose is None or r["purpose"] == purpose
        ]
        records.sort(key=lambda record: (record["created_at"], record["id"]), reverse=True)
        return {"object": "list", "data": records, "has_more": False}

    @app.get("/v1/files/{file_id}", dependencies=can_read)
    def retrieve_file(file_id: str, user: GetUserDep) -> dict[str, Any]:
        return public(service.owned(store.file, "file", file_id, user))

    @app.get("/v1/files/{file_id}/content", dependencies=can_read)
    def file_content(file_id: str, user: GetUserDep) -> StreamingResponse:
        service.owned(store.file, "file", file_id, user)
        return StreamingResponse(store.file_content(file_id), media_type="application/jsonl")

    @app.delete("/v1/files/{file_id}", dependencies=can_write)
    def delete_file(file_id: str, user: GetUserDep) -> dict[str, Any]:
        service.owned(store.file, "file", file_id, user)
        try:
            store.delete_file(file_id)
        except NotFoundError as err:
            raise _openai_error(404, f"No file with id {file_id!r}.", code="not_found") from err
        return {"id": file_id, "object": "file", "deleted": True}


def _add_batch_routes(
    app: FastAPI, service: _BatchService, can_read: list[Any], can_write: list[Any]
) -> None:
    """``/v1/batches``: create, retrieve, list, cancel (Any: FastAPI's ``Depends`` objects)."""
    store, dag_id = service.store, service.dag_id

    @app.post("/v1/batches", dependencies=can_write)
    def create_batch(body: CreateBatchRequest, session: SessionDep, user: GetUserDep) -> dict[str, Any]:
        return service.create_batch(body, session, user)

    @app.get("/v1/batches/{batch_id}", dependencies=can_read)
    def retrieve_batch(batch_id: str, session: SessionDep, user: GetUserDep) -> dict[str, Any]:
        return service.batch_object(service.owned(store.batch, "batch", batch_id, user), session)

    @app.get("/v1/batches", dependencies=can_read)
    def list_batches(
        session: SessionDep,
        user: GetUserDep,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
    ) -> dict[str, Any]:
        records = service.listed(store.batches, user)
        if after is not None:
            ids = [record["id"] for record in records]
            records = records[ids.index(after) + 1 :] if after in ids else []
        page = [service.batch_object(record, session) for record in records[:limit]]
        return {
            "object": "list",
            "data": page,
            "has_more": len(records) > limit,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    @app.post("/v1/batches/{batch_id}/cancel", dependencies=can_write)
    def cancel_batch(batch_id: str, session: SessionDep, user: GetUserDep) -> dict[str, Any]:
        record = service.owned(store.batch, "batch", batch_id, user)
        status, _ = batch_status(record, _run_state(session, dag_id, batch_id), now=time.time())
        if status in TERMINAL_STATUSES:
            raise _openai_error(409, f"Batch {batch_id!r} is already {status}.", code="batch_not_cancellable")
        if record.get("cancelling_at") is None:
            record = {**record, "cancelling_at": int(time.time())}
            store.save_batch(record)
            _stop_run(session, dag_id, batch_id)
        return service.batch_object(record, session)
