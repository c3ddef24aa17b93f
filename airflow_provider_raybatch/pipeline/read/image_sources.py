"""Where a row's image may be read from, and reading it there: the job's policy and the readers.

A row's image value is data, and data may be hostile: a URL of the cloud metadata service
(``http://169.254.169.254/...``), of the Ray dashboard on ``127.0.0.1:8265`` or of any internal
server; a path to ``/etc/passwd`` or ``../../`` out of the input folder; an ``s3://`` key in a bucket
the job's credentials reach but the row's author should not. :class:`ImageSources` is the policy:

- ``http(s)://``: public addresses only, unless the host is in ``allowed_hosts`` (host names, IP
  addresses or CIDR blocks). The name is resolved once, every address it resolves to is checked, and
  the socket connects to a checked address: no second lookup that a rebinding DNS server could answer
  differently. Each redirect is a new connection, checked the same way. Proxies from the environment
  (``HTTP(S)_PROXY``) are not used: through a proxy, the check would judge the proxy's address and
  the proxy would fetch whatever it is asked.
- local paths and ``file://``: only under the input folder or ``allowed_local_path``, judged on the
  real path (symlinks and ``..`` resolved), which is then the path opened.
- ``s3://``: only under the input's own folder (when it is on S3) or ``allowed_s3_prefixes``.
- ``data:`` URLs are read; any other scheme is refused.

A refused value fails its row with ``image source not allowed: ...``, decided before anything is
opened, stat'ed or connected to: the reason is the same for an open port and a closed one, for a
file that exists and one that does not.

Every failure of reading an allowed source (no such file, an HTTP error, a timeout, a server that
misbehaves) is an :class:`ImageError` too, whose text is the row's reason: nothing a row holds makes
these functions raise anything else.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import http.client
import ipaddress
import os
import posixpath
import reprlib
import socket
import ssl
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.shared.json_types import CellValue
from airflow_provider_raybatch.shared.specs import (
    check_allowed_local_path,
    parse_allowed_host_entry,
    parse_s3_prefix,
)

if TYPE_CHECKING:
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: The value is None or empty, or names a file that does not exist.
MISSING_KIND = "missing image"
#: The value is not something an image can be read from (wrong type or shape, unsupported scheme).
BAD_VALUE_KIND = "bad image value"
#: Reading the file, object or URL failed (HTTP error, timeout, permission, network).
FETCH_KIND = "image fetch failed"
#: The bytes are over ``max_bytes`` (and, in :mod:`.images`, the pixels or the engine's encoding).
TOO_LARGE_KIND = "image too large"
#: The value names a place the job's policy does not let images come from (:class:`ImageSources`).
NOT_ALLOWED_KIND = "image source not allowed"

_DATA_URL_PREFIX = "data:"
_CHUNK_BYTES = 1 << 16
#: NAT64's well-known prefix: its addresses carry an IPv4 address in their last 32 bits.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class ImageError(ValueError):
    """A row's image (or messages) at fault: ``str()`` is the row's reason, ``"<kind>: <detail>"``.

    Every function here and in :mod:`.images` raises only this for a row's value; its own type lets
    the guards that turn any other failure into a reason pass it through unchanged.
    """


def reason(kind: str, detail: str) -> ImageError:
    return ImageError(f"{kind}: {detail}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, 60, 60, 4, 4


def briefly(value: CellValue) -> str:
    """A short repr: a row's value may be megabytes, or nested deeper than repr() can go."""
    text = _REPR.repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def shorten(text: str, limit: int = 200) -> str:
    """A path or URL as a reason shows it: a row's value may be megabytes long."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


# -- the policy ----------------------------------------------------------------------------------


def is_public_address(address: IPAddress) -> bool:
    """Whether ``address`` is on the public internet.

    Not: loopback, private (RFC 1918, fc00::/7), link-local (169.254/16, where cloud metadata services
    answer; fe80::/10), shared (100.64/10), multicast, unspecified, reserved or site-local. An IPv6
    address that carries an IPv4 one (IPv4-mapped, NAT64, 6to4) is judged by the IPv4 address too, so
    ``::ffff:127.0.0.1`` is loopback. Decimal and octal spellings (``2130706433``, ``0x7f.1``) never get
    here: the resolver turns them into the address they mean.
    """
    if isinstance(address, ipaddress.IPv6Address):
        carried = address.ipv4_mapped or (
            ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in _NAT64 else None
        )
        if carried is not None:  # ipaddress calls these reserved: the IPv4 address decides
            return is_public_address(carried)
        if address.sixtofour is not None and not is_public_address(address.sixtofour):
            return False
        if address.is_site_local:
            return False
    return address.is_global and not (
        address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or address.is_loopback
        or address.is_link_local
        or address.is_private
    )


def _is_within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _local_folder(location: str | None) -> str | None:
    """``location`` as a local absolute path, or None when it is not local (s3://, unset)."""
    if location is None:
        return None
    if location.startswith("file://"):
        location = urllib.parse.unquote(location.removeprefix("file://"))
    elif "://" in location:
        return None
    return posixpath.abspath(location)


@dataclass(frozen=True)
class ImageSources:
    """Where a job's row images may be read from: built once per job (:meth:`from_spec`), checked when built.

    :param input_uri: the job's input file or folder. Local images may be read under its folder, and
        ``s3://`` images under it when it is on S3. Unset: under the folder of the row's file only
        (``relative_to`` of the readers).
    :param allowed_hosts: host names (matched exactly), IP addresses or CIDR blocks whose ``http(s)://``
        images may be fetched although they are not public (:func:`is_public_address`). Default none.
    :param allowed_local_path: an absolute folder that local images may also be read from.
    :param allowed_s3_prefixes: ``s3://`` folders that images may also be read from.
    """

    input_uri: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    allowed_local_path: str | None = None
    allowed_s3_prefixes: tuple[str, ...] = ()
    _host_names: frozenset[tuple[str, int | None]] = field(init=False, repr=False, compare=False)
    _networks: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # TypeError, not ValueError: a bad option is the job's mistake, not a row's. The spec checks
        # the same values with the same functions, so a job never gets here with a bad one.
        try:
            parsed = [
                parse_allowed_host_entry(entry, f"allowed_hosts[{i}]")
                for i, entry in enumerate(self.allowed_hosts)
            ]
            if self.allowed_local_path is not None:
                check_allowed_local_path(self.allowed_local_path, "allowed_local_path")
            for index, prefix in enumerate(self.allowed_s3_prefixes):
                parse_s3_prefix(prefix, f"allowed_s3_prefixes[{index}]")
        except ValueError as err:
            raise TypeError(str(err)) from err
        object.__setattr__(
            self, "_host_names", frozenset(entry for entry in parsed if isinstance(entry[0], str))
        )
        object.__setattr__(
            self, "_networks", tuple(entry for entry in parsed if not isinstance(entry[0], str))
        )

    @classmethod
    def from_spec(cls, spec: BatchInferenceSpec) -> ImageSources:
        """The policy of a job: its input and its ``image_allowed_*`` fields."""
        return cls(
            input_uri=spec.input_uri,
            allowed_hosts=tuple(spec.image_allowed_hosts),
            allowed_local_path=spec.image_allowed_local_path,
            allowed_s3_prefixes=tuple(spec.image_allowed_s3_prefixes),
        )

    # -- http(s) --

    def address_allowed(self, host: str, address: IPAddress, port: int | None = None) -> bool:
        """Whether a connection for ``host`` may go to ``address`` (on ``port``): public, or allowed by
        name or network, for every port or for that one."""
        name = host.lower().strip("[]").removesuffix(".")
        if (name, None) in self._host_names or (port is not None and (name, port) in self._host_names):
            return True
        carried = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        candidates = [address] if carried is None else [address, carried]
        if any(
            candidate in network and allowed_port in (None, port)
            for network, allowed_port in self._networks
            for candidate in candidates
        ):
            return True
        return is_public_address(address)

    def connect(
        self,
        address: tuple[str, int],
        timeout: float | None = None,
        source_address: Any = None,
        *,
        scheme: str,
    ) -> socket.socket:  # Any: http.client's source_address, unused.
        """``socket.create_connection`` for an image fetch (http.client's ``_create_connection``).

        Resolves ``host`` once and connects to one of its addresses only when every address is allowed;
        raises ImageError (``image source not allowed``) before any connection otherwise.
        """
        host, port = address
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
        if not addresses or not all(self.address_allowed(host, ip, int(port)) for ip in addresses):
            raise RefusedHost(scheme, host)
        last_error: OSError | None = None
        for family, kind, proto, _, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                if timeout is None or isinstance(timeout, int | float):  # not http.client's "unset" marker
                    sock.settimeout(timeout)
                sock.connect(sockaddr)
                return sock
            except OSError as err:
                sock.close()
                last_error = err
        raise last_error or OSError(f"no address to connect to for {host}")

    # -- local paths --

    def local_path(self, path: str, relative_to: str | None, shown: str | None = None) -> str:
        """The real path to open for a row's local ``path`` (absolute, or joined already).

        Raises ImageError (``image source not allowed``) unless the real path lies under the input
        folder or ``allowed_local_path``; the decision reads no file, so it tells nothing of the file.

        :param shown: the value as the row gave it, for the reason (default: ``path``).
        """
        try:
            real = os.path.realpath(path)
        except ValueError as err:  # a NUL byte, or text that is no file name (a lone surrogate)
            raise reason(BAD_VALUE_KIND, f"cannot open {briefly(path)}: {err}") from err
        if any(_is_within(real, root) for root in self._local_roots(relative_to)):
            return real
        raise reason(
            NOT_ALLOWED_KIND,
            f"{shorten(shown or path)} is outside the input folder; put the image there or set "
            "image_allowed_local_path to its folder",
        )

    def _local_roots(self, relative_to: str | None) -> list[str]:
        roots = []
        folder = _local_folder(relative_to)
        if folder is not None:
            inputs = _local_folder(self.input_uri)
            # relative_to lies under input_uri when that is a folder (the whole input folder is the
            # input's); when input_uri is one file, relative_to is its folder.
            roots.append(inputs if inputs is not None and _is_within(folder, inputs) else folder)
        if self.allowed_local_path is not None:
            roots.append(self.allowed_local_path)
        return [os.path.realpath(root) for root in roots]

    # -- s3 --

    def check_s3(self, uri: str, relative_to: str | None) -> None:
        """Raise ImageError (``image source not allowed``) unless ``uri`` lies under an allowed S3 folder."""
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        steps = key.split("/")
        if "." in steps or ".." in steps:
            raise reason(
                NOT_ALLOWED_KIND, f"{shorten(uri)} has a '.' or '..' step; name the object by its key"
            )
        for folder_bucket, folder in self._s3_roots(relative_to):
            if bucket == folder_bucket and (not folder or _is_within(key, folder)):
                return
        raise reason(
            NOT_ALLOWED_KIND,
            f"{shorten(uri)} is outside the input's S3 folder; add its folder to image_allowed_s3_prefixes "
            "to read it",
        )

    def _s3_roots(self, relative_to: str | None) -> list[tuple[str, str]]:
        roots = [parse_s3_prefix(prefix) for prefix in self.allowed_s3_prefixes]
        if relative_to is not None and relative_to.startswith("s3://"):
            inputs = self.input_uri if self.input_uri and self.input_uri.startswith("s3://") else None
            folder = (
                inputs if inputs is not None and _is_within(relative_to, inputs.rstrip("/")) else relative_to
            )
            bucket, _, key = folder.removeprefix("s3://").partition("/")
            roots.append((bucket, key.strip("/")))
        return roots


class RefusedHost(ImageError):
    """A connection the policy refuses, raised before it is made: the reason names the host, never the port.

    One text whatever is behind the address (an open port, a closed one, nothing at all).
    """

    def __init__(self, scheme: str, host: str) -> None:
        self.origin = f"{scheme}://{f'[{host}]' if ':' in host else host}"
        shown = shorten(self.origin, 100)
        self.detail = f"{shown} is not a public address; add the host to image_allowed_hosts to fetch it"
        super().__init__(f"{NOT_ALLOWED_KIND}: {self.detail}")


DEFAULT_SOURCES = ImageSources()


# -- reading -------------------------------------------------------------------------------------


def read_source(
    text: str, max_bytes: int, timeout_seconds: float, sources: ImageSources, relative_to: str | None
) -> bytes:
    """The bytes a row's image text names (data URL, path, ``file://``, ``s3://``, ``http(s)://``).

    :param relative_to: folder (local, ``file://`` or ``s3://``) relative paths are resolved against:
        the folder of the row's input file.
    :raises ImageError: with the row's reason; ``image source not allowed`` for what ``sources`` refuses.
    """
    if not text.strip():
        raise reason(MISSING_KIND, "the image path is empty")
    if text.startswith(_DATA_URL_PREFIX):
        return decode_data_url(text, max_bytes)
    scheme, has_scheme, rest = text.partition("://")
    scheme = scheme.lower() if has_scheme else ""
    if not has_scheme and relative_to is not None and not os.path.isabs(text):
        if "://" in relative_to:
            text = f"{relative_to.rstrip('/')}/{text}"
            scheme, _, rest = text.partition("://")
        else:
            text = os.path.join(relative_to, text)
    if scheme in ("http", "https"):
        return _read_http(text, max_bytes, timeout_seconds, sources)
    if scheme == "s3":
        uri = f"s3://{rest}"
        sources.check_s3(uri, relative_to)
        return _read_s3(uri, max_bytes)
    if scheme == "file":
        return _read_local(sources.local_path(_file_uri_path(text), relative_to, text), max_bytes, shown=text)
    if scheme:
        raise reason(
            BAD_VALUE_KIND,
            f"unsupported scheme {briefly(scheme)} in {shorten(text)}; use a path, a data: URL, file://, "
            "s3:// or http(s)://",
        )
    return _read_local(sources.local_path(text, relative_to), max_bytes, shown=text)


def decode_data_url(url: str, max_bytes: int) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise reason(BAD_VALUE_KIND, f"a data URL must be data:<mime>;base64,<data>, got {briefly(url)}")
    size = len(payload) * 3 // 4 - (len(payload) - len(payload.rstrip("=")))  # the decoded size
    if size > max_bytes:
        raise reason(TOO_LARGE_KIND, f"data URL of ~{size} bytes, over max_bytes={max_bytes}")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as err:  # ValueError: text that is not ASCII
        raise reason(BAD_VALUE_KIND, f"data URL is not valid base64: {shorten(str(err))}") from err


def _file_uri_path(uri: str) -> str:
    """The local path of a ``file://`` URI, percent-decoded as pyarrow decodes it."""
    host, _, path = uri[len("file://") :].partition("/")
    if host not in ("", "localhost"):
        raise reason(
            BAD_VALUE_KIND, f"{shorten(uri)} names a host; a file:// URI is file:///<path> on the node"
        )
    return "/" + urllib.parse.unquote(path)


def _read_capped(
    read: Callable[[int], bytes], where: str, max_bytes: int, deadline: float | None = None
) -> bytes:
    chunks, total = [], 0
    while chunk := read(_CHUNK_BYTES):
        total += len(chunk)
        if total > max_bytes:
            raise reason(TOO_LARGE_KIND, f"{shorten(where)} is over max_bytes={max_bytes}")
        if deadline is not None and time.monotonic() > deadline:
            raise reason(FETCH_KIND, f"{shorten(where)}: timed out while reading")
        chunks.append(chunk)
    return b"".join(chunks)


def _read_local(path: str, max_bytes: int, shown: str) -> bytes:
    """A local file's bytes. Regular files only: a FIFO would block the row forever, /dev/zero never end.

    :param shown: the path as the row gave it (reasons name it, not the real path opened).
    """
    shown = shorten(shown)
    try:
        # Opened first, then asked what it is: a name checked and then opened could be a FIFO by the
        # time it opens, and a FIFO's open blocks until a writer comes (never, for the row). O_NONBLOCK
        # makes that open return at once; fstat then sees the FIFO, and a regular file reads as ever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise reason(BAD_VALUE_KIND, f"{shown} is a folder, not an image file")
            if not stat.S_ISREG(mode):
                raise reason(BAD_VALUE_KIND, f"{shown} is not a regular file")
            with open(fd, "rb", closefd=False) as stream:
                return _read_capped(stream.read, shown, max_bytes)
        finally:
            os.close(fd)
    except FileNotFoundError as err:
        raise reason(MISSING_KIND, f"no such file: {shown}") from err
    except OSError as err:  # permission, a name too long, I/O
        raise reason(FETCH_KIND, f"{shown}: {err.strerror or err}") from err


def _read_s3(uri: str, max_bytes: int) -> bytes:
    from pyarrow import fs

    from airflow_provider_raybatch.pipeline import storage

    shown = shorten(uri)
    try:
        filesystem, path = storage.filesystem(uri)
    except Exception as err:  # noqa: BLE001 - a bad bucket name, S3 settings that do not load, ...
        raise reason(BAD_VALUE_KIND, f"cannot read {shown}: {shorten(str(err))}") from err
    try:
        info = filesystem.get_file_info(path)
        if info.type == fs.FileType.NotFound:
            raise reason(MISSING_KIND, f"no such object: {shown}")
        if info.type != fs.FileType.File:
            raise reason(BAD_VALUE_KIND, f"{shown} is a folder, not an image file")
        if info.size is not None and info.size > max_bytes:
            raise reason(TOO_LARGE_KIND, f"{shown} has {info.size} bytes, over max_bytes={max_bytes}")
        with filesystem.open_input_stream(path) as stream:
            return _read_capped(stream.read, uri, max_bytes)
    except ImageError:
        raise
    except Exception as err:  # noqa: BLE001 - access denied, network, throttling: any is this row's fetch failing
        raise reason(FETCH_KIND, f"{shown}: {type(err).__name__}: {shorten(str(err))}") from err


# -- http(s) -------------------------------------------------------------------------------------


class _Deadline:
    """A fetch's deadline, kept by a timer thread that shuts the fetch's sockets down when it passes.

    A socket timeout bounds each read, not the fetch: a server that sends a byte every few seconds
    would hold the row (and its Ray worker) for hours. Shutting a socket down wakes a read blocked on it.
    Name resolution is the one step it cannot cut short (the system resolver's own timeouts bound it).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also on an SSLSocket: it leaves the TLS state to the reading thread.
    with contextlib.suppress(OSError):  # already closed
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _CheckedConnection:
    """An http.client connection whose socket goes only to allowed addresses, watched by the deadline."""

    def __init__(
        self, *args: Any, deadline: _Deadline, sources: ImageSources, **kwargs: Any
    ) -> None:  # Any: http.client's.
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        scheme = "https" if isinstance(self, http.client.HTTPSConnection) else "http"
        # http.client's seam for making the socket (HTTPSConnection wraps what it returns in TLS,
        # checking the certificate against the host name): the address check sits where the
        # connection is made, so it judges the address actually used, on every redirect too.
        self._create_connection = functools.partial(sources.connect, scheme=scheme)

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]  # a mixin: super() is http.client's connection class
        self._deadline.watch(self.sock)  # type: ignore[attr-defined]  # http.client's, as above


class _HTTPConnection(_CheckedConnection, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_CheckedConnection, http.client.HTTPSConnection):
    pass


class _CheckedHandler:
    """urllib's HTTP(S) handler, opening checked connections (do_open is the seam urllib offers)."""

    def __init__(
        self, deadline: _Deadline, sources: ImageSources, **kwargs: Any
    ) -> None:  # Any: the urllib handler's own.
        super().__init__(**kwargs)
        self._deadline = deadline
        self._sources = sources

    def do_open(
        self, http_class: Any, req: urllib.request.Request, **kwargs: Any
    ) -> Any:  # Any: urllib's (the connection class; typeshed's type for it is private), its response.
        secure = issubclass(http_class, http.client.HTTPSConnection)
        connection = functools.partial(
            _HTTPSConnection if secure else _HTTPConnection, deadline=self._deadline, sources=self._sources
        )
        return super().do_open(connection, req, **kwargs)  # type: ignore[misc]  # a mixin, as above


class _HTTPHandler(_CheckedHandler, urllib.request.HTTPHandler):
    pass


class _HTTPSHandler(_CheckedHandler, urllib.request.HTTPSHandler):
    pass


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One context per process: loading the CA certificates for every image would cost more than its fetch."""
    return ssl.create_default_context()


def _opener(deadline: _Deadline, sources: ImageSources) -> urllib.request.OpenerDirector:
    """urllib with http(s) only (a redirect to ftp:// or file:// fails the fetch) and no proxy.

    ``ProxyHandler({})``: proxies from the environment are not used, so that the address check
    judges the image's server, not a proxy that would then fetch any address it is asked.
    """
    opener = urllib.request.OpenerDirector()
    handlers = (
        urllib.request.ProxyHandler({}),
        urllib.request.UnknownHandler(),
        _HTTPHandler(deadline, sources),
        _HTTPSHandler(deadline, sources, context=_tls_context()),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPRedirectHandler(),
        urllib.request.HTTPErrorProcessor(),
    )
    for handler in handlers:
        opener.add_handler(handler)
    return opener


def _declared_length(response: http.client.HTTPResponse) -> int | None:
    declared = response.headers.get("Content-Length") or ""
    return int(declared) if declared.isascii() and declared.isdigit() else None


def _fetch(url: str, max_bytes: int, deadline: _Deadline, sources: ImageSources) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "airflow-provider-raybatch"})
    with _opener(deadline, sources).open(request, timeout=deadline.seconds) as response:
        declared = _declared_length(response)
        if declared is not None and declared > max_bytes:
            raise reason(
                TOO_LARGE_KIND, f"{shorten(url)} declares {declared} bytes, over max_bytes={max_bytes}"
            )
        # read1: one recv at a time, so that the deadline is looked at between the bytes of a slow server.
        data = _read_capped(getattr(response, "read1", response.read), url, max_bytes, deadline.at)
    if deadline.expired:  # the timer shut the socket: what came is cut short
        raise reason(FETCH_KIND, f"{shorten(url)}: timed out after {deadline.seconds:g} s")
    if declared is not None and len(data) < declared:
        raise reason(
            FETCH_KIND, f"{shorten(url)}: the connection closed after {len(data)} of {declared} bytes"
        )
    return data


def _fetch_failure(err: BaseException, deadline: _Deadline) -> str:
    if deadline.expired:
        return f"timed out after {deadline.seconds:g} s"
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {shorten(str(err.reason))}"
    if isinstance(err, urllib.error.URLError):
        if not isinstance(err.reason, BaseException):
            return shorten(str(err.reason))
        err = err.reason
    return f"{type(err).__name__}: {shorten(str(err))}"


def _read_http(url: str, max_bytes: int, timeout_seconds: float, sources: ImageSources) -> bytes:
    """The bytes at ``url``; every failure of the fetch is this row's ``image fetch failed``.

    urllib, http.client, ssl and socket raise a dozen types (InvalidURL for a space, BadStatusLine,
    IncompleteRead, RemoteDisconnected, LineTooLong, timeouts, UnicodeError for a host, OverflowError
    for a port): none of them may fail the job. A refused address (of the URL or of a redirect) is
    ``image source not allowed``, raised before its connection is made.
    """
    deadline = _Deadline(timeout_seconds)
    try:
        with deadline:
            return _fetch(url, max_bytes, deadline, sources)
    except RefusedHost as err:
        if _is_origin_of(err.origin, url):
            raise
        raise reason(NOT_ALLOWED_KIND, f"{shorten(url)} redirects to {err.detail}") from err
    except ImageError:
        raise
    except Exception as err:  # noqa: BLE001 - a row's fetch failing fails that row, never the job
        raise reason(FETCH_KIND, f"{shorten(url)}: {_fetch_failure(err, deadline)}") from err


def _is_origin_of(origin: str, url: str) -> bool:
    """Whether a refused connection's ``scheme://host`` is the URL's own (not a redirect's)."""
    try:
        split = urllib.parse.urlsplit(url)
        host = split.hostname or ""
    except ValueError:  # a URL urllib could not split would not have got to a connection
        return True
    shown = f"[{host}]" if ":" in host else host
    return origin.lower() == f"{split.scheme}://{shown}".lower()
