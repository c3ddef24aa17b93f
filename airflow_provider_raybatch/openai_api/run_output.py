"""Reading a batch run's output folder from the API server: no link followed there, every read bounded.

Whoever can write a run's output (the Ray user, any job on the cluster) can plant a link in it: a part
``outputs/part-1.jsonl -> /etc/airflow/airflow.cfg`` read by path made the API server serve its own
file as the batch's output, and a 300 MiB sidecar read whole grew it by 600 MiB. So on local disk every
name below the run's output folder is opened without following a link (:mod:`..shared.local_tree`, as
the pipeline does): a link is left out of a listing, a link on the way to a file refuses
(:class:`~..shared.local_tree.LinkInOutputError`), and only regular files are read. A JSON file is read
only up to its bound, a part only up to the size it had when opened. Object stores have no links: their
paths are read as they are, within the same bounds.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from airflow.sdk import ObjectStoragePath

from airflow_provider_raybatch.shared import local_tree

log = logging.getLogger(__name__)
_CHUNK_BYTES = 1 << 20


def _local(path: ObjectStoragePath) -> bool:
    return path.protocol == "file"


@contextmanager
def _opened(path: ObjectStoragePath, output: ObjectStoragePath) -> Iterator[tuple[BinaryIO, int]]:
    """The file ``path`` of the run's output folder ``output``, open for reading, and its size then.

    :raises LinkInOutputError: on local disk, it or a folder on the way below ``output`` is a link.
    :raises OSError: it is missing, or no regular file (a FIFO, a device).
    """
    if not _local(path):
        with path.open("rb") as file:
            yield file, path.stat().st_size
        return
    try:
        fd = local_tree.open_file(path.path, output.path)
    except local_tree.LinkBelowError as err:
        raise local_tree.LinkInOutputError(err.link, output.path) from err
    with os.fdopen(fd, "rb") as file:
        yield file, os.fstat(fd).st_size


def files_in(folder: ObjectStoragePath, output: ObjectStoragePath, suffix: str) -> list[ObjectStoragePath]:
    """The files named ``*<suffix>`` right in ``folder`` (under ``output``), sorted by name; none when
    it is missing. A link there is left out.

    :raises LinkInOutputError: ``folder`` or a folder on the way below ``output`` is a link.
    """
    if not _local(folder):
        return sorted(path for path in folder.iterdir() if path.name.endswith(suffix))
    top = posixpath.abspath(folder.path)
    return [
        ObjectStoragePath(f"file://{path}")
        for path in local_tree.list_files(top, output.path)
        if posixpath.dirname(path) == top and path.endswith(suffix)
    ]


def size(path: ObjectStoragePath, output: ObjectStoragePath) -> int:
    """The size of the file ``path`` under ``output`` (what :func:`chunks` reads of it now)."""
    with _opened(path, output) as (_, found):
        return found


def chunks(path: ObjectStoragePath, output: ObjectStoragePath) -> Iterator[bytes]:
    """The bytes of the file ``path`` under ``output``, up to the size it had when opened (one that
    grows meanwhile is not read on and on)."""
    with _opened(path, output) as (file, left):
        while left > 0 and (chunk := file.read(min(_CHUNK_BYTES, left))):
            left -= len(chunk)
            yield chunk


def read_bounded(
    path: ObjectStoragePath, output: ObjectStoragePath, max_bytes: int, what: str
) -> bytes | None:
    """The bytes of the file ``path`` under ``output`` (a ``what``: "manifest", "sidecar"), or None
    when it is missing, a link, or over ``max_bytes``; a refusal is logged, naming the file and why."""
    try:
        with _opened(path, output) as (file, found):
            data = file.read(max_bytes + 1) if found <= max_bytes else b""
    except FileNotFoundError:
        return None
    except OSError as err:  # a link on the way (LinkInOutputError says which), a FIFO, a device
        log.warning("The %s %r of a batch run is not read: %s", what, path.path, err)
        return None
    if found > max_bytes or len(data) > max_bytes:
        log.warning(
            "The %s %r of a batch run is not read: it is over the %s bytes a %s may be.",
            what,
            path.path,
            f"{max_bytes:,}",
            what,
        )
        return None
    return data


def sidecar_files(staging: ObjectStoragePath, output: ObjectStoragePath) -> list[ObjectStoragePath]:
    """The staged parts' sidecars, ``<staging>/<run>/parts/<part>.json``; none when a folder on the way
    is a link (logged, naming it)."""
    if not _local(staging):
        return list(staging.glob("*/parts/*.json")) if staging.exists() else []
    top = posixpath.abspath(staging.path)
    try:
        paths = local_tree.list_files(top, output.path)
    except local_tree.LinkInOutputError as err:
        log.warning("The staged parts of a batch run are not read: %s", err)
        return []
    return [
        ObjectStoragePath(f"file://{path}")
        for path in paths
        if path.endswith(".json")
        and posixpath.relpath(path, top).split("/")[1:2] == ["parts"]
        and posixpath.relpath(path, top).count("/") == 2
    ]
