"""Per-user quotas of the Batch API hold under concurrent requests (issue 45, point 6).

The quotas were checked, then written: requests that arrived together all passed the check before
any of them wrote, so a user kept 11 files under a limit of 2, and 5 open batches under 2. Here the
real app is driven in-process (no auth: the user is given; no Airflow database: DAG runs are faked
as Airflow makes them, seen by other requests once the request that started them has ended), with
every record write of the store slowed down: the window of a slow S3 PUT, which makes the race
certain instead of lucky. The same app on a real API server is in test_openai_api.py; the
ranking and the verification on their own are in tests/unit/openai_api/test_quota.py.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from airflow.api_fastapi.common.db.common import _get_session
from airflow.api_fastapi.core_api.security import get_user
from airflow.sdk import ObjectStoragePath
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_provider_raybatch.openai_api import app as openai_app
from airflow_provider_raybatch.openai_api import quota
from airflow_provider_raybatch.openai_api.quota import RESERVATION_TTL_SECONDS, Reservation
from airflow_provider_raybatch.openai_api.settings import OpenAISettings
from airflow_provider_raybatch.openai_api.status import RunState
from airflow_provider_raybatch.openai_api.store import OpenAIStore, new_id, owner_key

if TYPE_CHECKING:
    from httpx2 import Response  # what Starlette's TestClient answers with

LIMIT = 2
REQUESTS = 11
OWNER = "alice"
#: How long each record write waits before it writes.
WRITE_DELAY_SECONDS = 0.3
HEADERS = {"Authorization": "Bearer token"}


class _User:
    def get_id(self) -> str:
        return OWNER

    def get_name(self) -> str:
        return OWNER


@dataclass
class _Session:
    """A request's database session: the runs it started, not yet committed."""

    started: list[str] = field(default_factory=list)


@dataclass
class _Runs:
    """The batch DAG's runs, as Airflow keeps them: ``trigger_dag`` adds one to the request's session,
    and other requests see it once that request has ended (its session committed)."""

    started: list[str] = field(default_factory=list)
    committed: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def session(self) -> Iterator[_Session]:
        session = _Session()
        yield session
        with self.lock:
            self.committed.update(session.started)

    def trigger(self, dag_id: str, *, run_id: str, session: _Session, **kwargs: object) -> None:
        session.started.append(run_id)
        with self.lock:
            self.started.append(run_id)

    def state(self, session: _Session, dag_id: str, run_id: str) -> RunState:
        seen = run_id in self.committed or run_id in session.started
        return RunState("queued") if seen else RunState(None)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> _Runs:
    import airflow.api.common.trigger_dag as trigger_module

    runs = _Runs()
    monkeypatch.setattr(trigger_module, "trigger_dag", runs.trigger)
    monkeypatch.setattr(openai_app, "_run_state", runs.state)
    return runs


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file object and batch record waits before it is written (and so before it is counted)."""
    write_json = OpenAIStore._write_json

    def slow_write_json(self: OpenAIStore, path: object, record: dict) -> None:
        time.sleep(WRITE_DELAY_SECONDS)
        write_json(self, path, record)

    monkeypatch.setattr(OpenAIStore, "_write_json", slow_write_json)
    # The wait for others to withdraw is bounded; on a loaded test machine it gets more room.
    monkeypatch.setattr(quota, "SETTLE_SECONDS", 20.0)


@pytest.fixture
def late_reservations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reservation lands up to 0.2 s after its time was read (a slow PUT): they land in another
    order than they rank, which is the ranking's gap that the verification closes (quota.py)."""
    write_bytes = ObjectStoragePath.write_bytes

    def late_write_bytes(self: ObjectStoragePath, data: bytes) -> int:
        if self.parent.name == "reserved":
            time.sleep(random.uniform(0, 0.2))
        return write_bytes(self, data)

    monkeypatch.setattr(ObjectStoragePath, "write_bytes", late_write_bytes)


def _app(root: Path, runs: _Runs, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    """One API server process's app on the store at ``root``, with the user and permissions given."""
    monkeypatch.setattr(openai_app, "requires_access_dag", lambda *args, **kwargs: lambda: None)
    settings = OpenAISettings(
        files_uri=str(root),
        files_conn_id=None,
        dag_id="raybatch_openai_batch",
        max_files_per_user=LIMIT,
        max_open_batches_per_user=LIMIT,
    )
    app = openai_app.create_app(settings)
    app.dependency_overrides[get_user] = _User
    app.dependency_overrides[_get_session] = runs.session
    return app


def _together(apps: list[FastAPI], send: Callable[[TestClient], Response]) -> list[Response]:
    """``REQUESTS`` requests sent at once, spread over ``apps`` (several API server processes)."""
    barrier = threading.Barrier(REQUESTS)
    responses: list[Response | None] = [None] * REQUESTS

    def one(index: int) -> None:
        client = TestClient(apps[index % len(apps)], headers=HEADERS)
        barrier.wait()
        responses[index] = send(client)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(REQUESTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [response for response in responses if response is not None]


def _upload(client: TestClient) -> Response:
    return client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"})


def _owned(root: Path) -> set[str]:
    """The owner's markers: the objects counted against their quota."""
    folder = root / "owners" / owner_key(OWNER)
    return {path.name for path in folder.iterdir() if path.is_file()} if folder.exists() else set()


def _leftover_reservations(root: Path) -> list[Path]:
    folder = root / "owners" / owner_key(OWNER)
    return [path for path in folder.rglob("*") if path.is_file() and path.parent != folder]


def _statuses(responses: list[Response]) -> list[int]:
    return sorted(response.status_code for response in responses)


@pytest.fixture(
    params=[(1, False), (2, False), (2, True)],
    ids=["one server", "two servers on one store", "reservations landing late"],
)
def apps(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    runs: _Runs,
    slow_writes: None,
    monkeypatch: pytest.MonkeyPatch,
) -> list[FastAPI]:
    """One API server process; two on one store (whose memory shares nothing); two, with reservations
    landing out of the order they rank in."""
    servers, late = request.param
    if late:
        request.getfixturevalue("late_reservations")
    return [_app(tmp_path, runs, monkeypatch) for _ in range(servers)]


def test_concurrent_uploads_keep_at_most_the_limit(tmp_path: Path, apps: list[FastAPI]) -> None:
    responses = _together(apps, _upload)

    kept = {path.stem for path in (tmp_path / "files").glob("*.json")}
    assert len(kept) <= LIMIT, f"{len(kept)} files under a limit of {LIMIT}"
    assert _statuses(responses) == [200] * LIMIT + [429] * (REQUESTS - LIMIT)
    assert {r.json()["id"] for r in responses if r.status_code == 200} == kept == _owned(tmp_path)
    assert {path.stem for path in (tmp_path / "files").glob("*.jsonl")} == kept  # no refused bytes
    refused = [r.json()["error"] for r in responses if r.status_code == 429]
    assert {(error["code"], error["param"]) for error in refused} == {("too_many_files", "file")}
    assert _leftover_reservations(tmp_path) == []


def test_concurrent_batches_open_at_most_the_limit(tmp_path: Path, runs: _Runs, apps: list[FastAPI]) -> None:
    input_file_id = _upload(TestClient(apps[0], headers=HEADERS)).json()["id"]
    body = {"input_file_id": input_file_id, "endpoint": "/v1/chat/completions"}
    responses = _together(apps, lambda client: client.post("/v1/batches", json=body))

    kept = {path.stem for path in (tmp_path / "batches").glob("*.json")}
    assert len(kept) <= LIMIT, f"{len(kept)} open batches under a limit of {LIMIT}"
    assert len(runs.started) <= LIMIT, f"{len(runs.started)} batch runs started under a limit of {LIMIT}"
    assert _statuses(responses) == [200] * LIMIT + [429] * (REQUESTS - LIMIT)
    assert {r.json()["id"] for r in responses if r.status_code == 200} == kept == set(runs.started)
    assert _owned(tmp_path) == kept | {input_file_id}
    refused = [r.json()["error"] for r in responses if r.status_code == 429]
    assert {error["code"] for error in refused} == {"too_many_open_batches"}
    assert _leftover_reservations(tmp_path) == []


def _reservation_left_behind(root: Path, object_id: str, age_seconds: float) -> Path:
    """The reservation of a request that died ``age_seconds`` ago, before it wrote its object."""
    reservation = Reservation(time.time_ns() - int(age_seconds * 1e9), object_id)
    path = root / "owners" / owner_key(OWNER) / "reserved" / reservation.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize("kind", ["file", "batch"])
def test_a_reservation_left_by_a_dead_request_holds_a_slot_until_it_expires(
    tmp_path: Path, runs: _Runs, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    client = TestClient(_app(tmp_path, runs, monkeypatch), headers=HEADERS)
    input_file_id = _upload(client).json()["id"] if kind == "batch" else None
    body = {"input_file_id": input_file_id, "endpoint": "/v1/chat/completions"}

    def create() -> Response:
        return client.post("/v1/batches", json=body) if kind == "batch" else _upload(client)

    dead = new_id(kind)
    left = _reservation_left_behind(tmp_path, dead, age_seconds=60)
    assert [create().status_code for _ in range(LIMIT)] == [200] * (LIMIT - 1) + [429]

    left.unlink()
    stale = _reservation_left_behind(tmp_path, dead, age_seconds=RESERVATION_TTL_SECONDS + 1)
    assert create().status_code == 200  # the slot it held is free
    assert not stale.exists()  # the request that saw it expired removed it


def test_a_batch_whose_request_died_before_its_run_started_stops_counting(
    tmp_path: Path, runs: _Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its record is there, its run never started: it counts while its run might yet be seen, then
    reads "failed" and counts no more (it never blocks its owner for good)."""
    client = TestClient(_app(tmp_path, runs, monkeypatch), headers=HEADERS)
    input_file_id = _upload(client).json()["id"]
    body = {"input_file_id": input_file_id, "endpoint": "/v1/chat/completions"}
    store = OpenAIStore(str(tmp_path))
    orphans = []
    for age in (60, 60):
        created_at = int(time.time()) - age
        orphan = {
            "id": new_id("batch"),
            "created_at": created_at,
            "expires_at": created_at + 86400,
            "owner": OWNER,
            "endpoint": body["endpoint"],
            "input_file_id": input_file_id,
            "completion_window": "24h",
            "request_total": 1,
        }
        store.save_batch(orphan)
        orphans.append(orphan)
    assert client.post("/v1/batches", json=body).status_code == 429

    for orphan in orphans:
        store.save_batch({**orphan, "created_at": orphan["created_at"] - RESERVATION_TTL_SECONDS})
    assert [client.post("/v1/batches", json=body).status_code for _ in range(3)] == [200, 200, 429]
    statuses = [client.get(f"/v1/batches/{orphan['id']}").json()["status"] for orphan in orphans]
    assert statuses == ["failed", "failed"]
