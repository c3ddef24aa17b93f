"""Attacks on the Batch API, on a real `airflow standalone`: forged ids that reach any object, batch
paths from the run conf, no per-user isolation (and a read that writes), no size limits, and
CSRF-able requests under the session cookie, unauthenticated /docs, a NUL byte answered 500; each
as it worked against the API before it was closed.

The file store is on a real S3-compatible server on loopback (moto); Airflow's simple auth manager
has ordinary users (alice, bob, ...), an op (an admin of the store: may edit connections) and a
viewer. No Ray cluster: the batch DAG's Ray connection points at a closed port, so a batch that
gets as far as submitting fails at once; nothing here needs a job to run. (The session's second
deployment, tests/integration/deployments.py: test_two_deployments runs its dev there.)
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from urllib.parse import quote

import httpx
import pytest

from airflow_provider_raybatch.openai_api.body_limit import MULTIPART_ENVELOPE_BYTES
from airflow_provider_raybatch.openai_api.dag import BATCH_TASK_ID
from airflow_provider_raybatch.openai_api.settings import DEFAULT_DAG_ID
from tests.integration.deployments import (
    MAX_BODY_BYTES,
    MAX_FILES_PER_USER,
    MAX_OPEN_BATCHES_PER_USER,
    MAX_UPLOAD_BYTES,
    STORE_BUCKET,
    user_token,
)
from tests.integration.standalone import Airflow

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


class Client:
    """One user's raw HTTP calls to /openai/v1 (raw, to send what an OpenAI client never would)."""

    def __init__(self, airflow: Airflow, user: str) -> None:
        self.airflow = airflow
        self.headers = {"Authorization": f"Bearer {user_token(airflow, user)}"}

    def call(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.request(
            method, f"{self.airflow.url}/openai/v1{path}", headers=headers, timeout=60, **kwargs
        )

    def upload(self, data: bytes, name: str = "in.jsonl") -> str:
        response = self.call("POST", "/files", files={"file": (name, data)}, data={"purpose": "batch"})
        assert response.status_code == 200, response.text
        return response.json()["id"]

    def create_batch(self, file_id: str, **extra) -> httpx.Response:
        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            **extra,
        }
        return self.call("POST", "/batches", json=body)


@pytest.fixture(scope="module")
def store_s3(s3_server):
    client = s3_server.client()
    client.create_bucket(Bucket=STORE_BUCKET)
    client.create_bucket(Bucket="payroll")
    client.put_object(Bucket="payroll", Key="payroll.jsonl", Body=b"salary: 1\n")
    return client


@pytest.fixture
def airflow(store_s3, second_airflow: Airflow) -> Airflow:
    """The session's second deployment (tests/integration/deployments.py): its Batch API's store on the
    S3 server, small limits, its batch DAG's Ray connection a closed port."""
    return second_airflow


def _objects(store_s3) -> dict[str, tuple[str, object]]:
    """Every object in the store's bucket and in the victim's, with its ETag and time."""
    found = {}
    for bucket in (STORE_BUCKET, "payroll"):
        for item in store_s3.list_objects_v2(Bucket=bucket).get("Contents", []):
            found[f"{bucket}/{item['Key']}"] = (item["ETag"], item["LastModified"])
    return found


def _task_failed_saying(airflow: Airflow, run_id: str, text: str) -> None:
    def ended():
        ti = airflow.task_instance(DEFAULT_DAG_ID, run_id, BATCH_TASK_ID)
        return ti if ti["state"] in ("failed", "success", "upstream_failed") else None

    ti = airflow.wait(f"run {run_id}'s batch task to end", ended, timeout=300)
    assert ti["state"] == "failed"
    log = httpx.get(
        f"{airflow.url}/api/v2/dags/{DEFAULT_DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{BATCH_TASK_ID}"
        f"/logs/{ti['try_number']}",
        headers={**airflow.headers, "Accept": "application/json"},
        timeout=30,
    ).text
    assert text in log, log[-3000:]
    # The scheduler closes the run a few seconds after its only task failed; Airflow refuses to delete
    # a running run (409), so the tests that go on to act on the run wait for it.
    airflow.wait(
        f"run {run_id} to end",
        lambda: (
            airflow.api("GET", f"/dags/{DEFAULT_DAG_ID}/dagRuns/{quote(run_id)}").json()["state"]
            in ("failed", "success")
            or None
        ),
        timeout=120,
    )


# -- forged ids ---------------------------------------------------------------------------------


def test_a_forged_record_id_reads_deletes_or_runs_nothing_of_another_bucket(airflow, store_s3) -> None:
    alice = Client(airflow, "alice")
    forged = json.dumps(
        {"id": "x", "object": "file", "purpose": "batch", "uri": "s3://payroll/payroll.jsonl"}
    )
    file_id = alice.upload(forged.encode() + b"\n")
    for trick in (
        f"{file_id}.jsonl%3FversionId%3D",
        f"{file_id}.jsonl%3FversionId%3D1",
        f"{file_id}%2F..%2F",
    ):
        for method, path in (
            ("GET", f"/files/{trick}/content"),
            ("GET", f"/files/{trick}"),
            ("DELETE", f"/files/{trick}"),
        ):
            response = alice.call(method, path)
            assert response.status_code == 404, (method, path, response.text)
            assert b"salary" not in response.content
        assert alice.create_batch(f"{file_id}.jsonl?versionId=").status_code == 404
    assert store_s3.get_object(Bucket="payroll", Key="payroll.jsonl")["Body"].read() == b"salary: 1\n"
    assert alice.call("GET", f"/files/{file_id}/content").content == forged.encode() + b"\n"


def test_a_nul_byte_or_an_overlong_id_is_a_404_not_a_500(airflow) -> None:
    alice = Client(airflow, "alice")
    for path in ("/files/file-%00", "/files/file-%00/content", "/batches/batch_%00", "/files/" + "a" * 5000):
        response = alice.call("GET", path)
        assert response.status_code == 404, (path, response.status_code, response.text[:200])


# -- paths from the run conf -----------------------------------------------------------------------


def test_the_batch_dag_refuses_a_run_conf_that_names_paths(airflow, store_s3) -> None:
    """Anyone who may create batches may trigger the batch DAG: its conf once chose what to read and
    where to write (any bucket the job reaches, another batch's manifest)."""
    before = _objects(store_s3)
    conf = {
        "input_uri": "s3://payroll/payroll.jsonl",
        "output_uri": f"s3://{STORE_BUCKET}/root/files",
        "endpoint": "x",
    }
    run_id = airflow.api(
        "POST", f"/dags/{DEFAULT_DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf}
    ).json()["dag_run_id"]
    _task_failed_saying(airflow, run_id, "takes no run conf")
    assert _objects(store_s3) == before  # nothing read into, or written to, either bucket


def test_the_batch_dag_refuses_a_run_that_is_no_batch(airflow, store_s3) -> None:
    run_id = f"batch_{uuid.uuid4().hex}"
    airflow.api("POST", f"/dags/{DEFAULT_DAG_ID}/dagRuns", json={"dag_run_id": run_id, "logical_date": None})
    _task_failed_saying(airflow, run_id, "no batch record has that id")


# -- owners --------------------------------------------------------------------------------------


def test_users_see_and_act_on_their_own_files_and_batches_and_admins_on_all(airflow) -> None:
    alice, bob, ops, viewer = (Client(airflow, user) for user in ("alice", "bob", "ops", "viewer"))
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    file_id = alice.upload(json.dumps(line).encode() + b"\n")
    created = alice.create_batch(file_id)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]

    for other in (bob, viewer):
        assert file_id not in [f["id"] for f in other.call("GET", "/files").json()["data"]]
        assert batch_id not in [b["id"] for b in other.call("GET", "/batches").json()["data"]]
        for path in (f"/files/{file_id}", f"/files/{file_id}/content", f"/batches/{batch_id}"):
            assert other.call("GET", path).status_code == 404, path
    assert bob.call("DELETE", f"/files/{file_id}").status_code == 404
    assert bob.call("POST", f"/batches/{batch_id}/cancel").status_code == 404
    assert bob.create_batch(file_id).status_code == 404  # nor run a batch on her file
    assert viewer.call("POST", f"/batches/{batch_id}/cancel").status_code == 403  # Airflow's own check first

    assert file_id in [f["id"] for f in alice.call("GET", "/files").json()["data"]]
    assert ops.call("GET", f"/files/{file_id}/content").status_code == 200  # an admin sees all
    assert batch_id in [b["id"] for b in ops.call("GET", "/batches").json()["data"]]
    assert alice.call("GET", f"/batches/{batch_id}").json()["id"] == batch_id
    assert alice.call("DELETE", f"/files/{file_id}").json()["deleted"] is True


def test_reading_an_expired_batch_writes_nothing(airflow, store_s3) -> None:
    """A GET past the window once saved the record and failed the run, with read permission only.
    Now the batch's own task has the window as its deadline, and a read only reads."""
    alice = Client(airflow, "alice")
    file_id = alice.upload(
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    )
    batch = alice.create_batch(file_id, completion_window="1s").json()
    time.sleep(2)
    _task_failed_saying(airflow, batch["id"], "expired before it could finish")
    before = _objects(store_s3)
    for _ in range(2):
        current = alice.call("GET", f"/batches/{batch['id']}").json()
        assert current["status"] == "expired" and current["expired_at"] == batch["expires_at"]
    assert _objects(store_s3) == before


# -- limits --------------------------------------------------------------------------------------


def test_bodies_over_the_limits_are_refused_before_they_are_stored(airflow, store_s3) -> None:
    alice = Client(airflow, "alice")
    before = _objects(store_s3)
    big = b'{"x": "' + b"a" * (MAX_UPLOAD_BYTES + 2 * MULTIPART_ENVELOPE_BYTES) + b'"}\n'
    response = alice.call("POST", "/files", files={"file": ("big.jsonl", big)}, data={"purpose": "batch"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def chunked():  # a well-formed multipart upload without Content-Length: cut off past the limit
        yield (
            b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n"
        )
        for _ in range(64):
            yield b"a" * 65536

    response = alice.call(
        "POST", "/files", content=chunked(), headers={"Content-Type": "multipart/form-data; boundary=xyz"}
    )
    assert response.status_code == 413
    # Just under the envelope's room, the file itself is over: the store's own check says so.
    response = alice.call(
        "POST",
        "/files",
        files={"file": ("b.jsonl", b"a" * (MAX_UPLOAD_BYTES + 1))},
        data={"purpose": "batch"},
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"
    assert _objects(store_s3) == before

    response = alice.call(
        "POST",
        "/batches",
        content=b"{" + b" " * MAX_BODY_BYTES + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413
    file_id = alice.upload(b"{}\n")
    for metadata, fragment in (
        ({f"k{i}": "v" for i in range(17)}, "at most 16"),
        ({"k" * 65: "v"}, "over 64 characters"),
        ({"k": "v" * 513}, "over 512 characters"),
    ):
        response = alice.create_batch(file_id, metadata=metadata)
        assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text
        assert response.json()["error"]["param"] == "metadata"


# -- CSRF, docs, error text ------------------------------------------------------------------------


def test_the_session_cookie_alone_changes_nothing(airflow, store_s3) -> None:
    """A page on another site can make a signed-in browser send a multipart POST or a body-less POST
    with Airflow's session cookie (a "simple" request): the token must come in the header."""
    alice = Client(airflow, "alice")
    file_id = alice.upload(b"{}\n")
    cookie = {"_token": alice.headers["Authorization"].removeprefix("Bearer ")}
    before = _objects(store_s3)
    upload = httpx.post(
        f"{airflow.url}/openai/v1/files",
        files={"file": ("x.jsonl", b"{}\n")},
        data={"purpose": "batch"},
        cookies=cookie,
        timeout=30,
    )
    delete = httpx.delete(f"{airflow.url}/openai/v1/files/{file_id}", cookies=cookie, timeout=30)
    assert (upload.status_code, delete.status_code) == (401, 401)
    assert "Authorization" in upload.json()["error"]["message"]
    assert _objects(store_s3) == before


def test_no_unauthenticated_api_description(airflow) -> None:
    for path in ("/openai/docs", "/openai/redoc", "/openai/openapi.json"):
        assert httpx.get(f"{airflow.url}{path}", timeout=30).status_code in (401, 404), path


def test_the_request_count_agrees_with_the_pipeline_on_a_bare_carriage_return(airflow) -> None:
    """A bare \\r inside a line was one request to the API and two error rows to the pipeline."""
    alice = Client(airflow, "alice")
    line = b'{"custom_id": "a",\r"method": "POST", "url": "/v1/chat/completions", "body": {}}'
    file_id = alice.upload(line + b"\n" + line.replace(b'"a"', b'"b"') + b"\r\n\r\n \n")
    assert alice.create_batch(file_id).json()["request_counts"]["total"] == 2


# -- runs re-created by others, early refusals, races, quotas, error shapes ---------------------------


def test_a_run_re_created_under_a_batch_id_by_someone_else_runs_nothing(airflow) -> None:
    """bob deletes erin's batch run (the simple auth manager's "user" role may) and starts one with
    her batch id: the task refuses, as the run was not started by her through the API."""
    alice, bob = Client(airflow, "erin"), Client(airflow, "bob")
    file_id = alice.upload(
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    )
    created = alice.create_batch(file_id)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    _task_failed_saying(airflow, batch_id, "Connection refused")  # ran as hers, to the closed Ray port
    for method, json_body in (("DELETE", None), ("POST", {"dag_run_id": batch_id, "logical_date": None})):
        path = f"{airflow.url}/api/v2/dags/{DEFAULT_DAG_ID}/dagRuns" + (
            f"/{batch_id}" if method == "DELETE" else ""
        )
        assert httpx.request(method, path, json=json_body, headers=bob.headers, timeout=30).status_code < 300
    _task_failed_saying(airflow, batch_id, "not by the batch's owner")


def _first_bytes_answer(airflow: Airflow, headers: dict[str, str]) -> bytes:
    """Send an upload's headers and the first 1 KiB of a 90 KB body, then wait: what came back?"""
    host, port = airflow.url.removeprefix("http://").split(":")
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = (
        f"POST /openai/v1/files HTTP/1.1\r\nHost: {host}\r\n{head}Content-Length: 90000\r\n"
        "Content-Type: multipart/form-data; boundary=xyz\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(request + b"--xyz\r\n" + b"a" * 1024)
        try:
            return sock.recv(200)
        except TimeoutError:
            return b"(no answer while the body was still coming)"


def test_an_upload_is_refused_before_its_body_is_read_without_a_token_or_permission(airflow) -> None:
    """Uploads were parsed (spooled to the server's disk) before the token was checked."""
    assert _first_bytes_answer(airflow, {}).startswith(b"HTTP/1.1 401")
    viewer = Client(airflow, "viewer")
    assert _first_bytes_answer(airflow, viewer.headers).startswith(b"HTTP/1.1 403")


def test_listing_while_someone_else_uploads_and_deletes_never_fails(airflow) -> None:
    alice, bob = Client(airflow, "alice"), Client(airflow, "bob")
    stop = threading.Event()
    failures: list[int] = []

    def churn() -> None:
        while not stop.is_set():
            file_id = bob.upload(b"{}\n")
            bob.call("DELETE", f"/files/{file_id}")

    workers = [threading.Thread(target=churn) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        for _ in range(10):  # 20 listings, each while bob's three threads upload and delete (~2 s each)
            for client in (alice, Client(airflow, "ops")):
                response = client.call("GET", "/files")
                if response.status_code != 200:
                    failures.append(response.status_code)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert failures == []


def test_one_user_cannot_fill_the_store_or_the_queue(airflow) -> None:
    carol = Client(airflow, "carol")
    files = [carol.upload(b"{}\n") for _ in range(MAX_FILES_PER_USER)]
    over = carol.call("POST", "/files", files={"file": ("x.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert over.status_code == 429 and over.json()["error"]["code"] == "too_many_files"
    carol.call("DELETE", f"/files/{files.pop()}")
    files.append(carol.upload(b"{}\n"))  # room again

    airflow.api("PATCH", f"/dags/{DEFAULT_DAG_ID}", json={"is_paused": True})  # runs stay queued: open
    try:
        for _ in range(MAX_OPEN_BATCHES_PER_USER):
            assert carol.create_batch(files[0]).status_code == 200
        over = carol.create_batch(files[0])
        assert over.status_code == 429 and over.json()["error"]["code"] == "too_many_open_batches"
        dave = Client(airflow, "dave")  # another user's limit is their own
        assert dave.create_batch(dave.upload(b"{}\n")).status_code == 200
    finally:
        airflow.api("PATCH", f"/dags/{DEFAULT_DAG_ID}", json={"is_paused": False})


def test_every_error_is_in_openais_shape_and_echoes_no_body(airflow) -> None:
    alice = Client(airflow, "alice")
    secret = "x" * 500 + "ECHO-ME"
    for response in (
        alice.call("POST", "/batches", json={"input_file_id": 5, "endpoint": secret}),
        alice.call("POST", "/batches", content=b"{not json", headers={"Content-Type": "application/json"}),
        alice.call("GET", "/no-such-route"),
        alice.call(
            "POST",
            "/files",
            content=b"--xyz\r\nbroken",
            headers={"Content-Type": "multipart/form-data; boundary=xyz"},
        ),
    ):
        assert response.status_code in (400, 404), response.text[:300]
        assert set(response.json()) == {"error"} and "ECHO-ME" not in response.text, response.text[:300]


def test_a_completion_window_is_at_most_30_days(airflow) -> None:
    alice = Client(airflow, "alice")
    file_id = alice.upload(b"{}\n")
    for window in ("9999999d", "31d", "745h"):
        response = alice.create_batch(file_id, completion_window=window)
        assert response.status_code == 400 and response.json()["error"]["param"] == "completion_window"
