"""The model cache on a node: folders only the Ray user can write, and copies checked against the bucket.

Layout under ``model_cache_dir`` (the root)::

    <name>-<source key>/      one source: the S3 endpoint and region the job reaches, and the URI
        <objects digest>/     one copy: the objects as listed (key, size, ETag), each fetched
            .raybatch-complete    what was fetched (:class:`Marker`), written last

Why this shape. vLLM loads whatever the folder holds, code included with ``trust_remote_code``, and a
fetched model's weights are the bucket's (private credentials). So:

* Every folder from the root down is the Ray user's and nobody else can write it, and so are the
  folders above it (:mod:`..private_folders`). Folders are made 0700 and files 0600, so another local
  user can neither plant a model where the job looks nor read the weights.
* The source key covers the endpoint, not the URI alone: two deployments whose S3 servers differ
  under one ``s3://`` URI never share a copy. It holds no credential.
* A copy is used only after the objects are listed again (one cheap request, no download) and
  match its marker, and its files have the listed sizes; a listing that fails serves nothing.
* The copy's folder is named by the listing's digest, so a changed model is a new path: the warm pool's
  fingerprint, which covers the model's path, changes with it (engine_pool.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TypedDict
from urllib.parse import urlsplit

from airflow_provider_raybatch.pipeline import storage

if TYPE_CHECKING:
    from typing import BinaryIO

COMPLETE_MARKER = ".raybatch-complete"


class ModelCacheError(RuntimeError):
    """A model that cannot be checked now (its bucket cannot be listed), or changed while it was fetched."""


@dataclass(frozen=True)
class ModelObject:
    """One object of a model as listed: its key below the model's prefix, its size and its ETag (for a
    source that is no S3 bucket, its modification time stands for the ETag)."""

    key: str
    size: int
    etag: str


class MarkedObject(TypedDict):
    key: str
    size: int
    etag: str


class Marker(TypedDict):
    """The completion marker: the source and the objects a copy was fetched from."""

    source: str
    objects: list[MarkedObject]


# -- the source's key ---------------------------------------------------------------------------


def source_key(model_uri: str, options: storage.S3Options) -> str:
    """A digest of the model's URI and the S3 endpoint and region it is fetched from (no credential)."""
    endpoint = storage.s3_endpoint_in_effect(options)
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        endpoint = f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"
    source = {"endpoint": endpoint or "aws", "region": options.region or "", "uri": model_uri.rstrip("/")}
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()


# -- listing ------------------------------------------------------------------------------------


def list_model_objects(model_uri: str) -> list[ModelObject]:
    """The model's objects now, sorted by key (one listing, nothing downloaded).

    :raises ValueError: for a key that is no plain relative path below the model's prefix.
    :raises ModelCacheError: when the bucket cannot be listed (nothing may be served unchecked then).
    """
    if model_uri.startswith("s3://"):
        return _list_s3(model_uri, storage.s3_options())
    paths = storage.list_files(model_uri)
    filesystem, prefix = storage.filesystem(model_uri)
    relative = [relative_model_path(model_uri, prefix, path) for path in paths]
    objects = []
    for key, info in zip(relative, filesystem.get_file_info(paths) if paths else [], strict=True):
        if not info.is_file:
            raise FileNotFoundError(f"model={model_uri!r}: {info.path!r} is gone since it was listed.")
        objects.append(ModelObject(key, info.size, f"mtime_ns:{info.mtime_ns}"))
    return sorted(objects, key=lambda item: item.key)


def _list_s3(model_uri: str, options: storage.S3Options) -> list[ModelObject]:
    # pyarrow's listing drops the ETag, so boto3 lists (the cluster extra installs it).
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = model_uri.removeprefix("s3://").partition("/")
    base = prefix.strip("/")
    try:
        listed = storage.list_s3_objects(bucket, f"{base}/" if base else "", options)
    except (BotoCoreError, ClientError) as err:
        raise ModelCacheError(
            f"model={model_uri!r}: could not list its objects at "
            f"{storage.s3_endpoint_in_effect(options) or 'AWS'} ({type(err).__name__}: {str(err)[:300]}), "
            "so no cached copy can be checked against them and none is used. Check aws_conn_id's "
            "endpoint and keys, and that they may list the prefix."
        ) from err
    objects = [
        ModelObject(relative_model_path(model_uri, f"{bucket}/{base}", item.path), item.size, item.etag)
        for item in listed
    ]
    return sorted(objects, key=lambda item: item.key)


def relative_model_path(model_uri: str, prefix: str, path: str) -> str:
    """A listed file's path below the model's prefix; raises ValueError naming the key unless it is a
    plain relative path: not empty, not absolute, no ``.``, ``..`` or empty step, no NUL byte."""
    base = prefix.rstrip("/") + "/"
    relative = path[len(base) :] if path.startswith(base) else ""
    steps = relative.split("/")
    if not relative or "\0" in relative or any(step in ("", ".", "..") for step in steps):
        raise ValueError(
            f"model={model_uri!r}: refusing to fetch the model: the object {path!r} under it is not a "
            "plain relative path (an empty, '.' or '..' step, an absolute path, or a NUL byte), so it "
            "could be written outside the model's folder. Remove or rename that object in the bucket."
        )
    return relative


def objects_digest(objects: list[ModelObject]) -> str:
    """The name of a copy's folder: a digest of the keys, sizes and ETags."""
    listing = [[item.key, item.size, item.etag] for item in objects]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


# -- the marker ---------------------------------------------------------------------------------


def write_marker(folder: str, model_uri: str, objects: list[ModelObject]) -> None:
    listed = [MarkedObject(key=item.key, size=item.size, etag=item.etag) for item in objects]
    marker: Marker = {"source": model_uri, "objects": listed}
    with open_new_private_file(posixpath.join(folder, COMPLETE_MARKER)) as sink:
        sink.write(json.dumps(marker, indent=1).encode())


def marked_objects(folder: str) -> list[ModelObject] | None:
    """The objects a copy's marker lists; None where it has no marker that reads as one."""
    try:
        with open(posixpath.join(folder, COMPLETE_MARKER), "rb") as source:
            marker = json.loads(source.read(1 << 24))
        return [
            ModelObject(key=item["key"], size=item["size"], etag=item["etag"]) for item in marker["objects"]
        ]
    except (OSError, ValueError, KeyError, TypeError):  # missing, unreadable, not JSON, not the shape
        return None


def copy_matches(folder: str, objects: list[ModelObject]) -> bool:
    """Whether ``folder`` holds a complete copy of ``objects``: its marker records exactly them, and
    each is a plain file (no link) of the listed size there."""
    try:
        with open(posixpath.join(folder, COMPLETE_MARKER), "rb") as source:
            marker = json.loads(source.read(1 << 24))
        if marker.get("objects") != [asdict(item) for item in objects]:
            return False
        for item in objects:
            info = os.lstat(posixpath.join(folder, item.key))
            if not stat.S_ISREG(info.st_mode) or info.st_size != item.size:
                return False
    except (OSError, ValueError, AttributeError):  # missing, unreadable, not JSON, not an object
        return False
    return True


# -- private files ------------------------------------------------------------------------------


def open_new_private_file(path: str) -> BinaryIO:
    """A new file, 0600, never through a link nor over an existing file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    return os.fdopen(os.open(path, flags, 0o600), "wb")
