"""Where a batch's files go, on local disk or S3, through pyarrow's filesystems (as Ray Data uses).

Layout under ``output_uri``::

    manifest.json                 the commit point: names the current version; written last
    versions/<version>/outputs/   the generated rows of a committed run
    versions/<version>/errors/    the rows that failed, with the reason
    _staging/<run_key>/           parts streamed out while a run is in progress (see parts.py),
                                  resumed by a retry; spec.json says which spec staged them
    _published/<version>.json     each version that has been current, until it is superseded and
                                  removed (stage/commit.py collect_superseded)

Readers follow ``manifest.json`` to ``outputs_uri``: they see the previous complete version or the
new complete version, never a partial one. Replacing ``manifest.json`` is atomic (a rename on local
disk, one PUT on S3).

pyarrow's S3 listing has no ETag: :func:`list_s3_objects` lists objects with boto3 instead, with the
same settings.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple, TypeGuard
from urllib.parse import urlsplit

from airflow_provider_raybatch.shared import local_tree
from airflow_provider_raybatch.shared.json_types import Kwargs
from airflow_provider_raybatch.shared.manifest import MANIFEST_FILE_NAME
from airflow_provider_raybatch.shared.specs import InputFormat

if TYPE_CHECKING:
    import pyarrow.fs
    from botocore.client import BaseClient

_FORMAT_EXTENSIONS: dict[str, list[str]] = {
    "jsonl": ["jsonl", "ndjson", "json"],
    "csv": ["csv"],
    "parquet": ["parquet", "pq"],
}


def join(*parts: str) -> str:
    """Join URI parts with single slashes (works for local paths and s3:// URIs alike)."""
    return "/".join([parts[0].rstrip("/"), *(p.strip("/") for p in parts[1:])])


@dataclass(frozen=True)
class OutputLayout:
    """The URIs of one output folder (see the module docstring)."""

    output_uri: str
    run_key: str

    @property
    def manifest_uri(self) -> str:
        return join(self.output_uri, MANIFEST_FILE_NAME)

    @property
    def staging_uri(self) -> str:
        return join(self.output_uri, "_staging", self.run_key)

    @property
    def staged_spec_uri(self) -> str:
        return join(self.staging_uri, "spec.json")

    def version_uri(self, version: str) -> str:
        return join(self.output_uri, "versions", version)

    @property
    def published_uri(self) -> str:
        """The folder that lists the versions which have been current (stage/commit.py)."""
        return join(self.output_uri, "_published")

    def version_uri_of(self, version: str) -> str | None:
        """:meth:`version_uri` of a name read from the output (a manifest, a ``_published/`` entry), or
        None when it is no name this provider issues: whoever can write the output could plant ``..``,
        and the folder it named would be swept or deleted."""
        return self.version_uri(version) if is_folder_name(version) else None

    def new_version(self) -> str:
        """A version name that sorts by when its staging opened (the run started) and never repeats."""
        return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{self.run_key[-12:]}-{uuid.uuid4().hex[:6]}"


#: A version's or run key's name as this provider issues them (:meth:`OutputLayout.new_version`,
#: ``TaskTry.run_key``): one path segment of letters, digits, ``_``, ``.`` and ``-``, never starting
#: with a dot, so never ``.`` or ``..``.
_FOLDER_NAME = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z_.-]{0,127}")


def is_folder_name(name: object) -> TypeGuard[str]:
    """Whether ``name`` (read from the output) is a version or run key's folder name we issue."""
    return isinstance(name, str) and _FOLDER_NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class S3Options:
    """How to reach S3 or an S3-compatible store; the key fields never appear in a repr.

    Unset keys mean the cluster's own credentials (an IAM role, the node's environment).
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def filesystem(self) -> pyarrow.fs.S3FileSystem:
        """One filesystem per settings, shared by every call and thread (pyarrow's is thread-safe): a
        new one per call built a new S3 client and connection each time, ~8 ms of every small GET."""
        return _s3_filesystem(self)

    def _new_filesystem(self) -> pyarrow.fs.S3FileSystem:
        from pyarrow import fs

        kwargs: Kwargs = {"region": self.region}
        if self.access_key:
            kwargs.update(
                access_key=self.access_key, secret_key=self.secret_key, session_token=self.session_token
            )
        if self.endpoint_url:
            endpoint = urlsplit(self.endpoint_url)
            kwargs.update(
                endpoint_override=endpoint.netloc or endpoint.path, scheme=endpoint.scheme or "https"
            )
        return fs.S3FileSystem(**{key: value for key, value in kwargs.items() if value is not None})


@functools.lru_cache(maxsize=8)
def _s3_filesystem(options: S3Options) -> pyarrow.fs.S3FileSystem:
    return options._new_filesystem()


_s3_options: S3Options | None = None


def s3_options() -> S3Options:
    """How this process reaches S3: the settings shipped with the job, else the cluster's own."""
    global _s3_options
    if _s3_options is None:
        from airflow_provider_raybatch.pipeline.credentials import shipped_s3_settings

        _s3_options = S3Options(**(shipped_s3_settings() or {}))
    return _s3_options


def s3_endpoint_in_effect(options: S3Options) -> str | None:
    """The endpoint S3 calls reach: the job's setting, else the node's environment, as pyarrow and
    boto3 read it."""
    return options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class S3Object:
    """One object as S3 lists it: its path (``bucket/key``, as pyarrow names it), size and ETag."""

    path: str
    size: int
    etag: str


def list_s3_objects(bucket: str, prefix: str, options: S3Options) -> list[S3Object]:
    """The objects of ``bucket`` whose keys start with ``prefix``, with the ETags pyarrow's listing
    drops (boto3 lists them, with the settings and the path-style addressing pyarrow uses). Folder
    markers (keys ending in ``/``) are left out, as pyarrow leaves them out.

    :raises botocore.exceptions.BotoCoreError: or ``ClientError``, when the bucket cannot be listed.
    """
    pages = _s3_client(options).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [
        S3Object(f"{bucket}/{item['Key']}", int(item["Size"]), str(item.get("ETag", "")))
        for page in pages
        for item in page.get("Contents", [])
        if not item["Key"].endswith("/")
    ]


@functools.lru_cache(maxsize=8)
def _s3_client(options: S3Options) -> BaseClient:
    """One client per settings (boto3's are thread-safe): making one takes ~0.3 s of CPU."""
    import boto3
    from botocore.config import Config

    kwargs: Kwargs = {"region_name": options.region}
    if options.access_key:
        kwargs.update(
            aws_access_key_id=options.access_key,
            aws_secret_access_key=options.secret_key,
            aws_session_token=options.session_token,
        )
    if options.endpoint_url:
        endpoint = options.endpoint_url
        kwargs["endpoint_url"] = endpoint if "://" in endpoint else f"https://{endpoint}"
    if s3_endpoint_in_effect(options):  # S3-compatible servers: path-style, as pyarrow addresses them
        kwargs["config"] = Config(s3={"addressing_style": "path"})
    return boto3.session.Session().client("s3", **{k: v for k, v in kwargs.items() if v is not None})


def filesystem(uri: str) -> tuple[pyarrow.fs.FileSystem, str]:
    """The pyarrow filesystem of a URI and the path within it."""
    from pyarrow import fs

    if "://" not in uri:
        return fs.LocalFileSystem(), posixpath.abspath(uri)
    if uri.startswith("s3://"):
        return s3_options().filesystem(), uri.removeprefix("s3://")
    return fs.FileSystem.from_uri(uri)


def _names_one_file(input_uri: str) -> bool:
    """Whether ``input_uri`` is one file rather than a folder (or a missing path).

    A trailing slash says folder without asking. Otherwise we ask the URI's filesystem, because a
    name cannot tell: ``s3://b/in/customers`` may be a file and ``s3://b/2026.01.02`` or a Spark
    ``out.parquet`` a folder. On local disk that is a stat; on S3 one metadata request from the
    driver, which Ray's reader then makes again.
    """
    if input_uri.endswith("/"):
        return False
    from pyarrow import fs

    filesystem_, path = filesystem(input_uri)
    return filesystem_.get_file_info(path).type == fs.FileType.File


def extensions_for(input_uri: str, input_format: InputFormat) -> list[str] | None:
    """File extensions to read from a folder; None when ``input_uri`` names one file.

    One named file is read whatever its suffix: ``data.txt`` with ``input_format="jsonl"`` is what
    our own error message tells users to pass, and a filter on it would leave "No input files found".
    """
    return None if _names_one_file(input_uri) else _FORMAT_EXTENSIONS[input_format]


def relative_name(path: str, input_uri: str) -> str:
    """A file's name relative to the input folder (its base name when the input is one file)."""
    base = input_uri.split("://", 1)[-1].rstrip("/")
    path = path.split("://", 1)[-1]
    if "://" not in input_uri:
        base = posixpath.abspath(base)
        path = posixpath.abspath(path)
    if path == base or not path.startswith(base + "/"):
        return posixpath.basename(path)
    return path[len(base) + 1 :]


def resolves_elsewhere(name: str) -> bool:
    """Whether an object key below a folder (``name``: relative to it) has an empty, ``.`` or ``..``
    step: an object store lists and keeps such a key as written, but pyarrow's S3 client (as most
    clients) resolves the steps when it asks for the object, so reading or deleting it by that name
    reaches another object, outside the folder or in another bucket. It is the object store's form of
    a link below a folder; local listings never name such a step."""
    return any(step in ("", ".", "..") for step in name.split("/"))


def input_folder(input_uri: str, name: str) -> str:
    """The folder holding input file ``name`` (as :func:`relative_name` gives it) of ``input_uri``."""
    base = input_uri.rstrip("/")
    if "/" not in name and posixpath.basename(base) == name:  # input_uri is the file itself
        return posixpath.dirname(base) or "."
    folder = posixpath.dirname(name)
    return join(base, folder) if folder else base


def check_model_source(model: str) -> None:
    """Fail before any engine starts when a local model folder is missing or holds no config.json.

    Otherwise vLLM's own error surfaces minutes later from inside an actor, after retries.
    Hub ids are left to vLLM; s3:// sources are fetched first (pipeline/generate/models.py).
    """
    if "://" in model or not (model.startswith(("/", "./", "../", "~")) or posixpath.exists(model)):
        return
    path = posixpath.expanduser(model)
    if not posixpath.isdir(path):
        raise FileNotFoundError(f"model={model!r}: no such folder on the Ray cluster's driver node.")
    if not posixpath.exists(posixpath.join(path, "config.json")):
        raise FileNotFoundError(f"model={model!r}: folder has no config.json, so it is not a model folder.")


def exists(uri: str, within: str | None = None) -> bool:
    """Whether a file or folder is at ``uri``. ``within``: the output folder it lies under: on local disk
    no link below it is followed (:func:`..shared.local_tree.exists`: a link on the way refuses)."""
    from pyarrow import fs

    if local := _local_below(uri, within):
        return local_tree.exists(*local)
    filesystem_, path = filesystem(uri)
    return filesystem_.get_file_info(path).type != fs.FileType.NotFound


def _local_below(uri: str, within: str | None) -> tuple[str, str] | None:
    """The local paths of ``uri`` and of the output folder ``within`` it lies under; None for an
    object store (no links there) or when no output folder is given."""
    from pyarrow import fs

    if within is None:
        return None
    filesystem_, path = filesystem(uri)
    if not isinstance(filesystem_, fs.LocalFileSystem):
        return None
    return path, filesystem(within)[1]


def delete_tree(uri: str, within: str | None = None) -> None:
    """Delete a folder and everything under it; a missing folder is fine.

    :param within: the output folder ``uri`` lies under: on local disk no link below it is followed
        (:mod:`..shared.local_tree`: a link on the way refuses, a link at ``uri`` is removed as a link).
    """
    from pyarrow import fs

    if local := _local_below(uri, within):
        local_tree.delete_tree(*local)
        return
    filesystem_, path = filesystem(uri)
    if filesystem_.get_file_info(path).type == fs.FileType.Directory:
        filesystem_.delete_dir(path)


def delete_file(uri: str, within: str | None = None) -> None:
    """Delete one file; a missing file is fine (a retried cleanup). ``within``: as for :func:`delete_tree`."""
    from pyarrow import fs

    if local := _local_below(uri, within):
        local_tree.delete_file(*local)
        return
    filesystem_, path = filesystem(uri)
    if filesystem_.get_file_info(path).type == fs.FileType.File:
        filesystem_.delete_file(path)


def list_files(uri: str, within: str | None = None) -> list[str]:
    """Paths of the files under a folder (recursively), sorted; empty when the folder is missing.

    :param within: the output folder ``uri`` lies under: on local disk no link below it is followed
        or listed (:mod:`..shared.local_tree`). Without it (a model folder, whose files may be links into a
        cache), links are followed. An object store's key below ``uri`` with an empty, ``.`` or ``..``
        step is never listed (:func:`resolves_elsewhere`).
    """
    from pyarrow import fs

    if local := _local_below(uri, within):
        return local_tree.list_files(*local)
    filesystem_, path = filesystem(uri)
    if filesystem_.get_file_info(path).type != fs.FileType.Directory:
        return []
    infos = filesystem_.get_file_info(fs.FileSelector(path, recursive=True))
    base = path.rstrip("/") + "/"
    # A key with a `..` step is listed as written, but read or deleted as another object: never named.
    return sorted(
        info.path
        for info in infos
        if info.type == fs.FileType.File and not resolves_elsewhere(info.path.removeprefix(base))
    )


def listed_uri(folder_uri: str, path: str) -> str:
    """The URI of a path :func:`list_files` gave for ``folder_uri`` (an object store lists
    ``bucket/key``; a local path is its own URI)."""
    scheme, found, _ = folder_uri.partition("://")
    return f"{scheme}://{path}" if found else path


def remove_files(uri: str, within: str, keep: Callable[[str], bool]) -> int:
    """Remove each file under the folder ``uri`` (of the output folder ``within``) that ``keep``, given
    its listed path, refuses; return how many went. On local disk no link is followed, and every link
    under ``uri`` is removed as a link (:mod:`..shared.local_tree`)."""
    if local := _local_below(uri, within):
        return local_tree.remove_files(*local, keep)
    filesystem_, _ = filesystem(uri)
    removed = 0
    for path in list_files(uri):
        if not keep(path):
            filesystem_.delete_file(path)
            removed += 1
    return removed


def input_file_sizes(input_uri: str, extensions: list[str] | None) -> list[tuple[str, int]]:
    """(path, bytes) of each file the job will read: ``input_uri`` itself, or the files under it with
    one of ``extensions`` (as :func:`extensions_for` gives). One listing, before any worker reads."""
    return [(info.path, info.size) for info in input_file_infos(input_uri, extensions)]


class InputNotFoundError(FileNotFoundError):
    """``input_uri`` names no file a job would read. Raised at the job's start, before any engine: a
    backfill date whose file never arrived failed with Ray Data's FileNotFoundError traceback, after
    the engine had started."""


#: What Ray Data skips in a folder it reads: names starting with these directly under the folder
#: (``_SUCCESS``, ``.DS_Store``, a ``_temporary/`` folder), as its file listing does.
RAY_SKIPPED_PREFIXES = (".", "_")


def read_by_ray_data(path: str, folder: str, extensions: list[str] | None) -> bool:
    """Whether Ray Data reads the file ``path`` when asked to read ``folder`` with ``extensions``: not
    under a skipped name (:data:`RAY_SKIPPED_PREFIXES`), and with one of the extensions in any case
    (``B.JSONL`` is read), as ``ray.data.datasource.file_meta_provider._expand_directory`` and
    ``path_util._has_file_extension`` decide. The start-up check, the input's binding and the prepared
    rows' key must see the files the read will read."""
    relative = path[len(folder) :].lstrip("/") if path.startswith(folder) else path
    if relative.startswith(RAY_SKIPPED_PREFIXES):
        return False
    if extensions is None:
        return True
    suffixes = tuple(ext.lower() if ext.startswith(".") else f".{ext.lower()}" for ext in extensions)
    return path.split("?", 1)[0].lower().endswith(suffixes)


def input_file_infos(input_uri: str, extensions: list[str] | None) -> list[pyarrow.fs.FileInfo]:
    """pyarrow's ``FileInfo`` (path, size, modification time) of each file the job will read; raises
    :class:`InputNotFoundError` when there is none."""
    from pyarrow import fs

    filesystem_, path = filesystem(input_uri)
    info = filesystem_.get_file_info(path)
    if info.type == fs.FileType.File:
        return [info]
    if info.type != fs.FileType.Directory:
        raise InputNotFoundError(
            f"input_uri={input_uri!r}: no such file or folder, as the Ray cluster sees it (a local path is "
            "read on the cluster's nodes, not on the Airflow worker). No row was read or generated."
        )
    selector = fs.FileSelector(path, recursive=True)
    found = [
        item
        for item in filesystem_.get_file_info(selector)
        if item.type == fs.FileType.File and read_by_ray_data(item.path, selector.base_dir, extensions)
    ]
    if not found:
        raise InputNotFoundError(
            f"input_uri={input_uri!r}: the folder holds no {' or '.join(extensions or [])} file to read "
            "(input_format decides which). No row was read or generated."
        )
    return found


class FileStamp(NamedTuple):
    """What tells one input file's bytes from another's without reading them (:func:`input_file_stamps`)."""

    path: str
    size: int
    mtime_ns: int
    #: On local disk the inode and status-change time; on S3 the ETag; elsewhere empty; "gone" for a
    #: file removed between the listing and this look at it.
    change: str


def input_file_stamps(input_uri: str, extensions: list[str] | None) -> list[FileStamp]:
    """Each file the job will read (:func:`input_file_infos`), sorted by path, with what differs
    whenever its bytes may have changed: its size, its modification time, and ``change``.

    Size and modification time alone miss a file rewritten in place with as many bytes whose
    modification time was set back (``rsync -t``, ``cp -p``, any tool that sets it) or not moved on (a
    rewrite within the filesystem's time granularity; a second on S3). So ``change`` holds, for a local
    file, its status-change time, which the kernel sets on every write, rename (a file replaced by a
    rename too) or ``chmod`` and no call can set back; for an S3 object, its ETag. A read changes
    neither. Not the inode: FUSE mounts (s3fs, gcsfuse, sshfs) hand out a new one per lookup, which
    would fail a job whose input never changed. Other filesystems get path, size and modification time
    only. Nothing is read but the listing and the files' metadata: one ``stat`` per local file; for S3,
    one more listing request per 1,000 objects, or one HEAD for an input of one object (which needs no
    right to list the bucket).
    """
    from pyarrow import fs

    infos = input_file_infos(input_uri, extensions)
    filesystem_, path = filesystem(input_uri)
    if isinstance(filesystem_, fs.LocalFileSystem):
        changes = {info.path: _local_change(info.path) for info in infos}
    elif input_uri.startswith("s3://"):
        changes = _s3_etags(path, infos)
    else:
        changes = {info.path: "" for info in infos}
    return sorted(
        FileStamp(info.path, info.size, info.mtime_ns, changes.get(info.path, "gone")) for info in infos
    )


def _local_change(path: str) -> str:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return "gone"
    return f"ctime_ns:{status.st_ctime_ns}"


def _s3_etags(path: str, infos: list[pyarrow.fs.FileInfo]) -> dict[str, str]:
    """The ETag of each listed object, by path: one HEAD for an input of one object, else one listing
    of the input's prefix."""
    bucket, _, key = path.partition("/")
    if len(infos) == 1 and infos[0].path == path:
        head = _s3_client(s3_options()).head_object(Bucket=bucket, Key=key)
        return {path: f"etag:{head.get('ETag', '')}"}
    prefix = f"{key.strip('/')}/" if key.strip("/") else ""
    return {item.path: f"etag:{item.etag}" for item in list_s3_objects(bucket, prefix, s3_options())}


def make_folders(uri: str, within: str | None = None) -> None:
    """Make a folder and those on the way (present ones are fine). ``within``: as for :func:`write_bytes`."""
    if local := _local_below(uri, within):
        local_tree.make_folders(*local)
        return
    filesystem_, path = filesystem(uri)
    filesystem_.create_dir(path, recursive=True)


def write_bytes(uri: str, data: bytes, within: str | None = None) -> None:
    """Write a file so that readers see the old or the new content, never a torn one.

    :param within: the output folder ``uri`` lies under: on local disk no link below it is followed
        (:func:`..shared.local_tree.write_file`: a link on the way refuses, naming it; a link at ``uri`` is
        replaced as a link).
    """
    from pyarrow import fs

    if local := _local_below(uri, within):
        local_tree.write_file(*local, data)
        return
    filesystem_, path = filesystem(uri)
    filesystem_.create_dir(posixpath.dirname(path), recursive=True)
    if not isinstance(filesystem_, fs.LocalFileSystem):  # an object store replaces an object in one PUT
        with filesystem_.open_output_stream(path) as stream:
            stream.write(data)
        return
    temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with filesystem_.open_output_stream(temporary) as stream:
            stream.write(data)
        filesystem_.move(temporary, path)  # rename(2): atomic on one filesystem
    finally:
        if filesystem_.get_file_info(temporary).type != fs.FileType.NotFound:
            filesystem_.delete_file(temporary)


def write_text(uri: str, text: str, within: str | None = None) -> None:
    """:func:`write_bytes` for text."""
    write_bytes(uri, text.encode(), within)


def read_bytes(uri: str, within: str | None = None, check_size: Callable[[int], None] | None = None) -> bytes:
    """A file's bytes.

    :param within: the output folder ``uri`` lies under: on local disk no link below it is followed
        (:func:`..shared.local_tree.read_file`: a link on the way or at ``uri`` refuses, naming it).
    :param check_size: given the file's size before a byte is read; it refuses a file by raising.
    """
    if local := _local_below(uri, within):
        return local_tree.read_file(*local, check_size)
    filesystem_, path = filesystem(uri)
    with filesystem_.open_input_file(path) as file:
        if check_size is not None:
            check_size(file.size())
        return file.read()


#: The most a JSON file the job reads back from its output may be (the manifest, the staging's
#: pointer, seal and owner record, a parts list, a ``_published`` entry, the prepared rows' record):
#: a parts list of 20 million rows is about 10 MB. Whoever can write the output could plant a larger
#: one (sparse: no disk), which the driver would hold whole, on every try.
MAX_CONTROL_FILE_BYTES = 64 << 20


class ControlFileTooLargeError(ValueError):
    """A file of the job's own in its output is larger than :data:`MAX_CONTROL_FILE_BYTES`."""


def read_text(uri: str, within: str | None = None) -> str:
    """One of the job's own small files in its output as UTF-8 text, refused unread past
    :data:`MAX_CONTROL_FILE_BYTES` (:func:`read_bytes`; ``within`` as there).

    :raises ControlFileTooLargeError: it is larger; the message names it.
    """

    def check_size(size: int) -> None:
        if size > MAX_CONTROL_FILE_BYTES:
            raise ControlFileTooLargeError(
                f"{uri} is {size:,} bytes, more than a file this provider writes there may be "
                f"({MAX_CONTROL_FILE_BYTES:,}): something else wrote it. Remove it, or write the run to "
                "another output_uri."
            )

    return read_bytes(uri, within, check_size).decode()
