"""A local input file is parsed only when its bytes are those of a file inside the input folder.

Whoever may write a local input folder could plant a link there (``zz.jsonl -> ~ray/.aws/credentials``)
or link a folder elsewhere in: Ray's reader follows links, and the target's lines would come back as
rows (CSV) or as error rows quoting each line as written (JSONL), to whoever reads the run's output.
As for a row's image path (:mod:`.image_sources`: only under the input folder, links resolved), a file
reached through a link is refused, here as that file's error record, and none of its bytes is parsed.

The check is on the bytes, not on a listing: the file is opened from the input folder one name at a
time without following a link (:func:`...shared.local_tree.open_file`), and the bytes Ray read must be that
file's content now. A link swapped for a plain file between Ray's read and this check cannot pass the
target's bytes off as the file's, and a file rewritten meanwhile is refused as changed. The input
folder itself (or the one file ``input_uri`` names) is taken as named: a link at or above it is the
DAG's choice. Object stores have no links, but a key with an empty, ``.`` or ``..`` step below the
input folder is their form of one (:func:`..storage.resolves_elsewhere`): its bytes are never read
(:mod:`.bounded_files`), and it is refused the same way.
"""

from __future__ import annotations

import os
import posixpath

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.shared import local_tree

#: The kind of an input file's reason when it is refused (the file's error record).
INPUT_FILE_REFUSED = "input file refused"
#: How much of the file is read at a time to compare it with the bytes read: no copy of the file.
_CHUNK_BYTES = 1 << 16


def refusal(path: str, input_uri: str, data: bytes) -> str | None:
    """Why the input file ``path`` (as Ray listed it) may not be parsed from ``data``, the bytes Ray read
    for it; None when they are the content of a file inside the input folder (on local disk), or of an
    object whose key is inside it."""
    from pyarrow import fs

    filesystem_, base = storage.filesystem(input_uri)
    name = storage.relative_name(path, input_uri)
    if why := refused_by_name(name):
        return f"{INPUT_FILE_REFUSED}: {name!r} {why}; none of it is read. Rename it."
    if not isinstance(filesystem_, fs.LocalFileSystem):
        return None
    path = posixpath.abspath(path.split("://", 1)[-1])
    folder = base if path.startswith(base.rstrip("/") + "/") else posixpath.dirname(base)
    try:
        fd = local_tree.open_file(path, folder)
    except local_tree.LinkBelowError as err:
        shown = "it" if err.link == path else repr(storage.relative_name(err.link, input_uri))
        return (
            f"{INPUT_FILE_REFUSED}: {name!r} is read through a link ({shown} is one); the job reads only "
            "files inside the input folder, never through a link. Copy the file into the folder."
        )
    except (OSError, ValueError) as err:
        return f"{INPUT_FILE_REFUSED}: {name!r} cannot be opened inside the input folder: {err}"
    try:
        if not _same_bytes(fd, data):
            return (
                f"{INPUT_FILE_REFUSED}: {name!r} changed while the job read it; run again once the input "
                "is written."
            )
    finally:
        os.close(fd)
    return None


def refused_by_name(name: str) -> str | None:
    """Why an input file may not be read by its name alone (``name``: relative to the input folder),
    or None: a control character or line separator in it (Ray's own messages quote a path as it is,
    and a line break there would start a line of the job's log, where the task finds its progress and
    result), or an empty, ``.`` or ``..`` step (an object store's client resolves those to another
    object's key: :func:`..storage.resolves_elsewhere`; a local listing names none)."""
    if not name.isprintable():
        return "has a control character or line break in its name"
    if storage.resolves_elsewhere(name):
        return (
            "has an empty, '.' or '..' step, which an object store's client resolves to another "
            "object's key; the job reads only objects inside the input folder"
        )
    return None


def _same_bytes(fd: int, data: bytes) -> bool:
    offset = 0
    with os.fdopen(os.dup(fd), "rb", buffering=0) as file:
        while chunk := file.read(_CHUNK_BYTES):
            if data[offset : offset + len(chunk)] != chunk:
                return False
            offset += len(chunk)
    return offset == len(data)
