"""Read each input file with Ray Data as ``read_binary_files`` does, never past the input-file bound.

The job checks every file's size on its listing at the start (``run._check_input_files``), but a
file can grow between that listing and the read: a local file extended (a sparse ``truncate -s`` is
instant and takes no disk), an S3 object overwritten. ``read_binary_files`` reads each file whole
(``f.readall()``), so a worker held whatever the file had become, twice over, before any bound was
checked. Here each read asks for at most :data:`.rows.MAX_INPUT_FILE_BYTES` + 1 bytes (pyarrow's
local and S3 streams read what is asked: a ranged GET on S3), and one byte past the bound fails the
job naming the file, as a file over the bound at the start does.

Only ``_read_stream`` differs from Ray's ``BinaryDatasource``, and ``_open_input_source`` for an
object key with an empty, ``.`` or ``..`` step (:func:`..storage.resolves_elsewhere`), which is read
as no bytes (its file's error record says why): Ray Data still lists the paths (with the extensions
filter and the job's S3 filesystem), adds the ``path`` column and reads files in parallel read tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from ray.data.datasource import FileBasedDatasource

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.read import input_links, rows

if TYPE_CHECKING:
    import pyarrow.fs
    from ray.data import Dataset

#: The column of a file's bytes, as ``read_binary_files`` names it.
BYTES_COLUMN = "bytes"


class BoundedBinaryDatasource(FileBasedDatasource):
    """``read_binary_files``' rows (``bytes``, and ``path`` with ``include_paths``), each file read
    up to ``limit`` + 1 bytes: a file past ``limit`` raises :class:`.rows.InputFileTooLargeError`
    naming it relative to ``input_uri``."""

    def __init__(self, input_uri: str, limit: int, **kwargs: object) -> None:
        # Unbuffered: the read asks for the whole bound at once, and a read-ahead buffer (Ray's
        # default, 32 MiB) would fetch past a bound smaller than itself.
        super().__init__(input_uri, open_stream_args={"buffer_size": 0}, **kwargs)
        self._input_uri = input_uri
        self._limit = limit

    def _open_input_source(
        self, filesystem: pyarrow.fs.FileSystem, path: str, **open_args: object
    ) -> pa.NativeFile:
        # A name refused as it is (an object key with a `..` step names another object once the client
        # resolves it; a line break in a name would start a line in Ray's own error messages): nothing
        # of it is read, not even a HEAD, and the file's row refuses it (:func:`.input_links.refusal`).
        if input_links.refused_by_name(storage.relative_name(path, self._input_uri)):
            return pa.BufferReader(b"")
        return super()._open_input_source(filesystem, path, **open_args)

    def _read_stream(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        data = read_within(f, self._limit)
        if len(data) > self._limit:
            raise rows.input_file_over_bound(storage.relative_name(path, self._input_uri), self._limit)
        yield pa.table({BYTES_COLUMN: pa.array([data], pa.binary())})

    def _rows_per_file(self) -> int:
        return 1


def read_within(f: pa.NativeFile, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of ``f`` from where it is: all of a file within ``limit``, and one
    byte more of a longer one, so that the caller knows it is past without reading the rest."""
    want = limit + 1
    chunks = []
    while want > 0 and (chunk := f.read(want)):  # a stream may return fewer bytes than asked
        chunks.append(chunk)
        want -= len(chunk)
    return b"".join(chunks)  # one chunk (the usual case) is returned as it is, not copied


def read_input_files(
    input_uri: str, filesystem: pyarrow.fs.FileSystem, extensions: list[str] | None
) -> Dataset:
    """The input's files as ``{"bytes", "path"}`` rows, each within :data:`.rows.MAX_INPUT_FILE_BYTES`
    (read at each call), through ``filesystem`` and keeping only ``extensions`` (None: every file)."""
    import ray.data

    datasource = BoundedBinaryDatasource(
        input_uri,
        rows.MAX_INPUT_FILE_BYTES,
        filesystem=filesystem,
        include_paths=True,
        file_extensions=extensions,
    )
    return ray.data.read_datasource(datasource)
