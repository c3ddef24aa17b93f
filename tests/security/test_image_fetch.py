"""A row's image value must not reach any address, file or bucket (it once did).

Any ``http(s)://`` value of ``image_column`` (or of an image part in messages) was fetched, redirects
followed, with no block on loopback, private or link-local addresses: the cloud metadata service at
169.254.169.254, the Ray dashboard on 127.0.0.1:8265. Local paths anywhere on the node were read, and
the reasons told an open port from a closed one and an existing file from a missing one. ``s3://``
values were read from any bucket with the job's credentials.

Each hostile value here is refused with one fixed reason, ``image source not allowed: ...``, decided
before any connection is made or any file or object is looked at (the tests record connections and
S3 reads), and a refused image is its row's error, never the job's. The allowed cases still read:
a loopback server once allowed, a file under the input folder, an object under the input's S3 folder.
No Ray and no network: servers run on loopback, and names are resolved by a stand-in resolver.
"""

from __future__ import annotations

import http.server
import io
import ipaddress
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.read import images
from airflow_provider_raybatch.pipeline.read.image_sources import (
    NOT_ALLOWED_KIND,
    ImageSources,
    is_public_address,
)
from airflow_provider_raybatch.pipeline.read.images import ImageOptions, load_image, read_image_bytes
from airflow_provider_raybatch.pipeline.stage.commit import reason_kind
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = _png()
DEFAULT = ImageOptions(timeout_seconds=3)


def refusal(
    value: Any, options: ImageOptions = DEFAULT, relative_to: str | None = None
) -> str:  # Any: a cell.
    """The row's reason for ``value``; fails the test unless it is ``image source not allowed``."""
    with pytest.raises(ValueError) as caught:
        read_image_bytes(value, options, relative_to)
    reason = str(caught.value)
    assert reason_kind(reason) == NOT_ALLOWED_KIND, reason
    return reason


def host_refusal(origin: str) -> str:
    fix = "add the host to image_allowed_hosts to fetch it"
    return f"{NOT_ALLOWED_KIND}: {origin} is not a public address; {fix}"


# -- what the tests watch: connections, names, servers ------------------------------------------


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every address a socket connects to (the connections still go through)."""
    seen: list[Any] = []  # Any: socket addresses.
    real = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:  # Any: a socket address.
        seen.append(address)
        real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return seen


#: Names the stand-in resolver knows; any other name does not resolve.
NAMES = {
    "images.example.com": ["127.0.0.1"],  # a public-looking name that resolves to loopback
    "metadata.example.com": ["169.254.169.254"],
    "rebinding.example.com": ["93.184.216.34", "127.0.0.1"],  # one public address, one not
    "public.example.com": ["93.184.216.34"],
    "images.internal": ["127.0.0.1"],
    "localhost": ["127.0.0.1", "::1"],
}


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver that answers NAMES and numeric hosts, and never asks the network."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:  # Any: socket's.
        name = host.lower().removesuffix(".") if isinstance(host, str) else None
        if name in NAMES:
            return [
                (
                    socket.AF_INET6 if ":" in address else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    "",
                    (address, int(port or 80)) if ":" not in address else (address, int(port or 80), 0, 0),
                )
                for address in NAMES[name]
            ]
        kwargs["flags"] = kwargs.get("flags", 0) | socket.AI_NUMERICHOST  # 2130706433, 0x7f.1, ::1 ...
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


class _Handler(http.server.BaseHTTPRequestHandler):
    """/ok.png serves an image; /to?<url> redirects there."""

    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        type(self).requests.append(self.path)
        if self.path.startswith("/to?"):
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/to?"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = PNG if self.path == "/ok.png" else b"no"
        self.send_response(200 if self.path == "/ok.png" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:  # Any: the stdlib's signature; keep the test log quiet
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, list[str]]]:
    """A loopback image server: its port and the paths it was asked for."""
    handler = type("Handler", (_Handler,), {"requests": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], handler.requests
    httpd.shutdown()
    httpd.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- http(s) -------------------------------------------------------------------------------------


def test_an_open_and_a_closed_loopback_port_get_the_same_reason(server, connects) -> None:
    port, requests = server
    before = len(requests)

    open_reason = refusal(f"http://127.0.0.1:{port}/ok.png")
    closed_reason = refusal(f"http://127.0.0.1:{closed_port()}/ok.png")

    assert open_reason == closed_reason == host_refusal("http://127.0.0.1")
    assert connects == [] and len(requests) == before  # decided before connecting: no port oracle


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://169.254.169.254/latest/meta-data/iam/security-credentials/", "http://169.254.169.254"),
        ("http://127.0.0.1:8265/api/jobs/", "http://127.0.0.1"),
        ("http://[::1]/", "http://[::1]"),
        ("http://[::ffff:127.0.0.1]/", "http://[::ffff:127.0.0.1]"),
        ("http://[::ffff:169.254.169.254]/", "http://[::ffff:169.254.169.254]"),
        ("http://[64:ff9b::7f00:1]/", "http://[64:ff9b::7f00:1]"),
        ("http://2130706433/", "http://2130706433"),
        ("http://0x7f.1/", "http://0x7f.1"),
        ("http://0177.0.0.1/", "http://0177.0.0.1"),
        ("http://127.1/", "http://127.1"),
        ("http://0/", "http://0"),
        ("http://localhost/", "http://localhost"),
        ("http://LOCALHOST./", "http://LOCALHOST."),
        ("https://127.0.0.1/a.png", "https://127.0.0.1"),
        ("HTTP://10.0.0.1/a.png", "http://10.0.0.1"),
        ("http://192.168.1.1/a.png", "http://192.168.1.1"),
        ("http://172.16.0.1/a.png", "http://172.16.0.1"),
        ("http://100.64.0.1/a.png", "http://100.64.0.1"),
        ("http://224.0.0.1/a.png", "http://224.0.0.1"),
        ("http://[fe80::1]/a.png", "http://[fe80::1]"),
        ("http://[fd00::1]/a.png", "http://[fd00::1]"),
        ("http://images.example.com/a.png", "http://images.example.com"),
        ("http://metadata.example.com/latest/meta-data/", "http://metadata.example.com"),
        ("http://rebinding.example.com/a.png", "http://rebinding.example.com"),
    ],
)
def test_a_url_of_a_non_public_address_is_refused_before_any_connection(
    url: str, origin: str, resolver, connects
) -> None:
    assert refusal(url).lower() == host_refusal(origin).lower()
    assert refusal({"bytes": None, "path": url}).lower() == host_refusal(origin).lower()
    assert connects == []


def test_an_image_part_in_messages_is_held_to_the_same_policy(resolver, connects) -> None:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://[::1]/"}}]}]

    with pytest.raises(ValueError) as caught:
        images.normalize_message_images(messages, DEFAULT)

    assert str(caught.value) == (
        f"{NOT_ALLOWED_KIND}: message 0 part 0: http://[::1] is not a public address; "
        "add the host to image_allowed_hosts to fetch it"
    )
    assert connects == []


@pytest.mark.parametrize(
    ("target", "refused"),
    [
        ("http://127.0.0.1:{port}/ok.png", "http://127.0.0.1"),  # the same server, by an address not allowed
        ("http://169.254.169.254/latest/meta-data/", "http://169.254.169.254"),
        ("http://[::1]:{port}/ok.png", "http://[::1]"),
        ("http://metadata.example.com/", "http://metadata.example.com"),
    ],
)
def test_a_redirect_from_an_allowed_server_to_a_private_address_is_refused(
    server, resolver, connects, target: str, refused: str
) -> None:
    """images.internal is allowed by name (it resolves to loopback); where it redirects is judged again."""
    port, requests = server
    options = ImageOptions(timeout_seconds=3, sources=ImageSources(allowed_hosts=("images.internal",)))
    url = f"http://images.internal:{port}/to?{target.format(port=port)}"
    before = len(requests)

    reason = refusal(url, options)

    assert reason == (
        f"{NOT_ALLOWED_KIND}: {url} redirects to {refused} is not a public address; "
        "add the host to image_allowed_hosts to fetch it"
    )
    assert connects == [("127.0.0.1", port)]  # the first hop only
    assert requests[before:] == [f"/to?{target.format(port=port)}"]


def test_an_allowed_loopback_server_is_fetched(server, resolver, connects) -> None:
    port, _ = server
    for entry, host in [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.0/8", "127.0.0.1"),
        ("images.internal", "images.internal"),
    ]:
        options = ImageOptions(sources=ImageSources(allowed_hosts=(entry,)))

        assert load_image(f"http://{host}:{port}/ok.png", options).size == (40, 30)
    assert set(connects) == {("127.0.0.1", port)}


def test_a_host_allowed_with_its_port_reaches_that_port_only(server, resolver, connects) -> None:
    """Allowing 127.0.0.1 for an image server let rows reach the Ray
    dashboard's port on it too, and tell open ports from closed ones by the reason."""
    port, requests = server
    for entry, host in [
        (f"127.0.0.1:{port}", "127.0.0.1"),
        (f"127.0.0.0/8:{port}", "127.0.0.1"),
        (f"images.internal:{port}", "images.internal"),
    ]:
        if "/" in entry:  # a CIDR block takes no port: it is refused when the spec is built
            with pytest.raises(TypeError):
                ImageSources(allowed_hosts=(entry,))
            continue
        options = ImageOptions(timeout_seconds=3, sources=ImageSources(allowed_hosts=(entry,)))
        assert load_image(f"http://{host}:{port}/ok.png", options).size == (40, 30)
        before = len(requests)
        assert (
            refusal(f"http://{host}:{closed_port()}/ok.png", options)
            == refusal(f"http://{host}:8275/api/jobs/", options)
            == host_refusal(f"http://{host}")
        )
        assert len(requests) == before
    assert set(connects) == {("127.0.0.1", port)}


def test_an_allowed_server_may_redirect_to_an_allowed_address(server, connects) -> None:
    port, _ = server
    options = ImageOptions(sources=ImageSources(allowed_hosts=("127.0.0.1",)))

    assert load_image(f"http://127.0.0.1:{port}/to?http://127.0.0.1:{port}/ok.png", options).size == (40, 30)
    assert connects == [("127.0.0.1", port)] * 2


def test_proxies_from_the_environment_are_not_used(server, connects, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a proxy, the check would judge the proxy's address and the proxy would fetch anything."""
    port, _ = server
    proxy = closed_port()
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    options = ImageOptions(sources=ImageSources(allowed_hosts=("127.0.0.1",)))

    assert load_image(f"http://127.0.0.1:{port}/ok.png", options).size == (40, 30)
    assert connects == [("127.0.0.1", port)]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "224.0.0.251",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:10.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::1",
        "2001:db8::1",
        "::7f00:1",
    ],
)
def test_addresses_that_are_not_public(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]
)
def test_public_addresses(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


# -- local paths ---------------------------------------------------------------------------------


@pytest.fixture
def input_folder(tmp_path: Path) -> Path:
    """An input folder with an image, a symlink out of it, a symlink within it, and a subfolder."""
    folder = tmp_path / "data" / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.png").write_bytes(PNG)
    (folder / "escape.png").symlink_to("/etc/hostname")
    (folder / "up.png").symlink_to(tmp_path / "data")
    (folder / "inside.png").symlink_to(folder / "a.png")
    (tmp_path / "data" / "secret.png").write_bytes(PNG)  # beside the input folder: not in it
    return folder


def outside_reason(shown: str) -> str:
    return (
        f"{NOT_ALLOWED_KIND}: {shown} is outside the input folder; put the image there or set "
        "image_allowed_local_path to its folder"
    )


@pytest.mark.parametrize(
    "value",
    [
        "/etc/hostname",
        "/etc/no-such-file",
        "../../etc/passwd",
        "../secret.png",
        "escape.png",
        "up.png/secret.png",
        "file:///etc/hostname",
        "file:///etc/no-such-file",
        "file://localhost/etc/passwd",
        "sub/../../secret.png",
        "/proc/self/environ",
        "/dev/zero",
    ],
)
def test_a_path_outside_the_input_folder_is_refused_without_looking_at_it(
    input_folder: Path, value: str
) -> None:
    shown = value if value.startswith(("/", "file:")) else os.path.join(input_folder, value)

    assert refusal(value, relative_to=str(input_folder)) == outside_reason(shown)
    assert refusal({"bytes": None, "path": value}, relative_to=str(input_folder)) == outside_reason(shown)


def test_a_path_in_the_input_folder_is_read(input_folder: Path) -> None:
    folder = str(input_folder)

    for value in [
        "a.png",
        str(input_folder / "a.png"),
        f"file://{input_folder}/a.png",
        "sub/../a.png",
        "inside.png",
    ]:
        assert read_image_bytes(value, DEFAULT, folder) == PNG, value
    assert reason_kind(_reason_of("missing.png", folder)) == images.MISSING_KIND  # inside: said as it is


def _reason_of(value: Any, relative_to: str | None, options: ImageOptions = DEFAULT) -> str:  # Any: a cell.
    with pytest.raises(ValueError) as caught:
        read_image_bytes(value, options, relative_to)
    return str(caught.value)


def test_the_whole_input_folder_is_the_input_s_when_input_uri_is_a_folder(input_folder: Path) -> None:
    """A row of in/sub/rows.jsonl may name ../a.png when the input is the folder in/."""
    with_input = ImageOptions(sources=ImageSources(input_uri=str(input_folder)))
    one_file = ImageOptions(sources=ImageSources(input_uri=str(input_folder / "sub" / "rows.jsonl")))

    assert read_image_bytes("../a.png", with_input, str(input_folder / "sub")) == PNG
    refusal("../a.png", one_file, str(input_folder / "sub"))
    refusal("../secret.png", with_input, str(input_folder))


def test_image_allowed_local_path_adds_a_folder(input_folder: Path, tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "b.png").write_bytes(PNG)
    options = ImageOptions(sources=ImageSources(allowed_local_path=str(photos)))

    assert read_image_bytes(str(photos / "b.png"), options, str(input_folder)) == PNG
    assert read_image_bytes(str(photos / "b.png"), options, None) == PNG
    refusal(str(tmp_path / "data" / "secret.png"), options, str(input_folder))
    refusal(str(photos / "b.png"), DEFAULT, str(input_folder))


# -- s3 ------------------------------------------------------------------------------------------


@pytest.fixture
def s3_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """S3 as a local folder (bucket/key under tmp_path/s3); returns the URIs that reached the filesystem."""
    from pyarrow import fs

    root = tmp_path / "s3"
    for key in (
        "bucket/in/a.png",
        "bucket/in/sub/b.png",
        "bucket/inbox/c.png",
        "other-bucket/key",
        "media/photos/d.png",
    ):
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(PNG)
    seen: list[str] = []

    def filesystem(uri: str) -> tuple[Any, str]:  # Any: a pyarrow filesystem
        seen.append(uri)
        return fs.LocalFileSystem(), str(root / uri.removeprefix("s3://"))

    monkeypatch.setattr(storage, "filesystem", filesystem)
    return seen


@pytest.mark.parametrize(
    "value",
    [
        "s3://other-bucket/key",
        "s3://other-bucket/no-such-key",
        "s3://bucket/inbox/c.png",
        "s3://bucket/in/../secret",
        "s3://bucket/in/./a.png",
        "S3://other-bucket/key",
        "../../other-bucket/key",
    ],
)
def test_an_s3_object_outside_the_input_s_folder_is_refused_without_reading_it(
    s3_reads: list[str], value: str
) -> None:
    sources = ImageSources(input_uri="s3://bucket/in/rows.jsonl")

    reason = refusal(value, ImageOptions(sources=sources), relative_to="s3://bucket/in")

    assert reason.startswith(f"{NOT_ALLOWED_KIND}: s3://") and (
        "outside the input's S3 folder" in reason or "'..'" in reason
    )
    assert s3_reads == []


def test_an_s3_object_under_an_allowed_folder_is_read(s3_reads: list[str]) -> None:
    options = ImageOptions(
        sources=ImageSources(input_uri="s3://bucket/in/", allowed_s3_prefixes=("s3://media/photos",))
    )

    assert read_image_bytes("a.png", options, "s3://bucket/in") == PNG
    assert read_image_bytes("s3://bucket/in/sub/b.png", options, "s3://bucket/in") == PNG
    assert read_image_bytes("b.png", options, "s3://bucket/in/sub") == PNG
    assert read_image_bytes("s3://media/photos/d.png", options, "s3://bucket/in") == PNG
    assert s3_reads == [
        "s3://bucket/in/a.png",
        "s3://bucket/in/sub/b.png",
        "s3://bucket/in/sub/b.png",
        "s3://media/photos/d.png",
    ]
    refusal("s3://media/photos/d.png", ImageOptions(), "s3://bucket/in")  # not without the prefix
    refusal("s3://bucket/in/a.png", ImageOptions(), "/local/input")  # a local input reads no S3 by default


@pytest.mark.parametrize(
    "value", ["gs://bucket/a.png", "hdfs://namenode/a.png", "ftp://example.com/a.png", "abfs://c@a/b.png"]
)
def test_other_schemes_are_not_read(s3_reads: list[str], value: str) -> None:
    assert reason_kind(_reason_of(value, "/tmp")) == images.BAD_VALUE_KIND
    assert s3_reads == []


# -- the row and the spec ------------------------------------------------------------------------


def test_a_refused_image_is_the_rows_error_and_the_other_rows_go_on(
    tmp_path: Path, resolver, connects
) -> None:
    from tests.unit.pipeline.row_path import run_rows

    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "ok.png").write_bytes(PNG)
    rows = [
        {"name": "ok", "image": "ok.png"},
        {"name": "metadata", "image": "http://169.254.169.254/latest/meta-data/"},
        {"name": "dashboard", "image": "http://images.example.com:8265/api/jobs/"},
        {"name": "passwd", "image": "../../../../../../etc/passwd"},
        {"name": "bucket", "image": "s3://other-bucket/key"},
    ]
    spec = BatchInferenceSpec.build(
        model="m",
        input_uri=str(tmp_path / "input" / "rows.jsonl"),
        output_uri=str(tmp_path / "out"),
        user_template="Describe it.",
        image_column="image",
        id_column="name",
        max_failed_fraction=1.0,
    )

    result = run_rows(
        {"rows.jsonl": "".join(json.dumps(row) + "\n" for row in rows).encode()}, spec, tmp_path
    )

    assert [row["name"] for row in result.outputs] == ["ok"]
    reasons = {row["id"]: row["error"] for row in result.errors}
    assert set(reasons) == {"metadata", "dashboard", "passwd", "bucket"}
    assert {reason_kind(reason) for reason in reasons.values()} == {NOT_ALLOWED_KIND}
    assert result.manifest["errors_by_reason"] == {NOT_ALLOWED_KIND: 4}
    assert connects == []


def test_the_spec_s_allow_lists_reach_the_image_options(tmp_path: Path) -> None:
    spec = BatchInferenceSpec.build(
        model="m",
        input_uri="s3://bucket/in/rows.jsonl",
        output_uri="s3://bucket/out",
        user_template="Describe it.",
        image_column="image",
        image_allowed_hosts=["images.internal", "10.0.0.0/8"],
        image_allowed_local_path="/data/images",
        image_allowed_s3_prefixes=["s3://media/photos"],
    )

    sources = images.options_for(spec).sources

    assert sources == ImageSources(
        input_uri="s3://bucket/in/rows.jsonl",
        allowed_hosts=("images.internal", "10.0.0.0/8"),
        allowed_local_path="/data/images",
        allowed_s3_prefixes=("s3://media/photos",),
    )
    assert images.options_for(spec) is images.options_for(spec)  # built once per job and process


def test_a_loopback_server_allowed_in_the_spec_serves_the_row(tmp_path: Path, server) -> None:
    """The allowlist a DAG sets reaches the row path (row_steps.py builds the options from the spec)."""
    from tests.unit.pipeline.row_path import run_rows

    port, _ = server
    rows = [{"name": "ok", "image": f"http://127.0.0.1:{port}/ok.png"}]
    spec = BatchInferenceSpec.build(
        model="m",
        input_uri=str(tmp_path / "input" / "rows.jsonl"),
        output_uri=str(tmp_path / "out"),
        user_template="Describe it.",
        image_column="image",
        id_column="name",
        image_allowed_hosts=["127.0.0.1"],
    )

    result = run_rows({"rows.jsonl": (json.dumps(rows[0]) + "\n").encode()}, spec, tmp_path)

    assert [row["name"] for row in result.outputs] == ["ok"], result.errors


# -- the property: whatever the URL, a reason or bytes, and no connection to a refused address -----

_HOSTS = [
    "127.0.0.1",
    "localhost",
    "169.254.169.254",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "2130706433",
    "0x7f.1",
    "0177.1",
    "017700000001",
    "0x7f000001",
    "127.1",
    "0",
    "[::]",
    "10.9.9.9",
    "[fe80::1%25eth0]",
    "images.example.com",
    "rebinding.example.com",
    "public.example.com",
    "metadata.example.com",
    "no-such.example",
    "[64:ff9b::a9fe:a9fe]",
    "[2002:7f00:1::1]",
    "93.184.216.34",
    "user@127.0.0.1",
    "127.0.0.1@public.example.com",
    "public.example.com#@127.0.0.1",
    "127.0.0.1%2f",
    "%31%32%37.0.0.1",
    "xn--nxasmq6b",
    "[::1]:99999",
    "",
]
_ALLOWED = ipaddress.ip_network("10.9.9.0/24")


def _urls() -> st.SearchStrategy[str]:
    hosts = st.sampled_from(_HOSTS) | st.ip_addresses().map(lambda a: f"[{a}]" if a.version == 6 else str(a))
    hosts = hosts | st.text(max_size=20)
    ports = st.sampled_from(["", ":80", ":8265", ":0", ":65536", ":x"])
    paths = st.sampled_from(["/", "/a.png", "/latest/meta-data/", ""]) | st.text(max_size=10)
    schemes = st.sampled_from(["http://", "https://", "HTTP://", "hTTps://"])
    built = st.builds(lambda s, h, p, q: f"{s}{h}{p}{q}", schemes, hosts, ports, paths)
    return built | st.text(max_size=40)


def test_fetching_any_url_gives_bytes_or_a_reason_and_connects_to_no_refused_address(
    resolver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    attempts: list[Any] = []  # Any: socket addresses.

    def connect(sock: socket.socket, address: Any) -> None:  # Any: a socket address.
        attempts.append(address)
        raise ConnectionRefusedError("stand-in: nothing leaves the test")

    monkeypatch.setattr(socket.socket, "connect", connect)
    options = ImageOptions(timeout_seconds=1, sources=ImageSources(allowed_hosts=(str(_ALLOWED),)))

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(url=_urls())
    def check(url: str) -> None:
        attempts.clear()
        try:
            read_image_bytes(url, options, str(tmp_path))
        except ValueError as err:
            kind = reason_kind(str(err))
            assert kind in {
                images.MISSING_KIND,
                images.BAD_VALUE_KIND,
                images.FETCH_KIND,
                NOT_ALLOWED_KIND,
            }, err
        for address in attempts:
            ip = ipaddress.ip_address(address[0])
            assert is_public_address(ip) or ip in _ALLOWED, (url, address)

    check()
