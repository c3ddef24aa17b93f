"""A staged part's sidecar read back from the staging: bounded, and checked to be one our writer makes.

Whoever can write the output can write a run's staging. A sidecar the commit reads back is believed
(its sources, files and counts make the version's totals), so one that no writer of ours could have
made fails the run, naming it, rather than crash it somewhere later (``{"files": {"x": "y"}}`` raised
a bare ``KeyError``) or take its memory (130 MB listing ten million sources grew the commit by 450 MiB
before ``MemoryError``). A well-formed forgery is another matter: whoever can write the output can
also change the version it commits (docs/security.md, "Known limits").
"""

from __future__ import annotations

import json

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue

#: The largest sidecar read back. Ours list a part's sources (tens of bytes a row; a part is half a batch,
#: or a burst, of rows), its counts and its labels: kilobytes.
MAX_SIDECAR_BYTES = 16 << 20
_FOLDERS = frozenset({"outputs", "errors"})
_COUNTS = ("rows_out", "rows_failed", "tokens_in", "tokens_out")


class ForeignSidecarError(RuntimeError):
    """A sidecar in a run's staging that no writer of this provider made; the message names it."""


def read_sidecar(uri: str, name: str, within: str) -> JsonObject:
    """The sidecar at ``uri`` (part ``name``'s), once it is within :data:`MAX_SIDECAR_BYTES` and of the
    shape our writer makes (:func:`sidecar_problem`).

    :param within: the output folder: on local disk no link below it is followed.
    :raises ForeignSidecarError: it is not; the message names the part and what to do.
    """

    def check_size(size: int) -> None:
        if size > MAX_SIDECAR_BYTES:
            raise _foreign(name, f"it is {size:,} bytes, over the {MAX_SIDECAR_BYTES:,} a sidecar may be")

    try:
        sidecar = json.loads(storage.read_bytes(uri, within, check_size))
    except ValueError as err:
        raise _foreign(name, f"it is not JSON: {err}") from err
    if problem := sidecar_problem(sidecar):
        raise _foreign(name, problem)
    return sidecar


def sidecar_problem(sidecar: JsonValue) -> str | None:
    """What in ``sidecar`` no writer of ours makes, or None."""
    if not isinstance(sidecar, dict):
        return f"it is a JSON {type(sidecar).__name__}, not an object"
    files, sources, reasons = sidecar.get("files"), sidecar.get("sources"), sidecar.get("errors_by_reason")
    if not isinstance(files, dict) or not set(files) <= _FOLDERS:
        return "its files are not a map of outputs and errors"
    if not all(storage.is_folder_name(file) for file in files.values()):
        return "its files are not names of files in its folders"
    if not isinstance(sources, list) or not all(isinstance(source, str) for source in sources):
        return "its sources are not a list of texts"
    counts = [sidecar.get(key) for key in _COUNTS]
    if not all(isinstance(count, int) and not isinstance(count, bool) and count >= 0 for count in counts):
        return f"its counts ({', '.join(_COUNTS)}) are not all whole numbers of at least 0"
    rows_out, rows_failed = sidecar["rows_out"], sidecar["rows_failed"]
    if rows_out + rows_failed != len(sources):
        return f"it counts {rows_out} rows out and {rows_failed} failed for {len(sources)} sources"
    if not isinstance(reasons, dict) or not all(
        isinstance(count, int) and not isinstance(count, bool) and count > 0 for count in reasons.values()
    ):
        return "its errors_by_reason is not a map of reasons to counts"
    if sum(reasons.values()) != rows_failed:
        return f"its errors_by_reason counts {sum(reasons.values())} rows, not its {rows_failed} failed"
    return _columns_problem(sidecar)


def _columns_problem(sidecar: dict[str, JsonValue]) -> str | None:
    """What in a Parquet part's record of its columns no writer of ours makes (``parts``' ``columns``,
    ``staged_columns`` and ``rewriting`` keys), or None."""
    columns, staged, rewriting = (sidecar.get(key) for key in ("columns", "staged_columns", "rewriting"))
    if columns is not None and not (
        isinstance(columns, dict)
        and set(columns) <= _FOLDERS
        and all(
            isinstance(types, dict) and all(isinstance(kind, str) for kind in types.values())
            for types in columns.values()
        )
    ):
        return "its columns are not a map of its folders to column types"
    if staged is not None and not (
        isinstance(staged, dict)
        and set(staged) <= _FOLDERS
        and all(
            isinstance(names, list) and all(isinstance(name, str) for name in names)
            for names in staged.values()
        )
    ):
        return "its staged_columns are not a map of its folders to column names"
    if rewriting is not None and not (isinstance(rewriting, list) and set(rewriting) <= _FOLDERS):
        return "its rewriting is not a list of its folders"
    return None


def _foreign(name: str, problem: str) -> ForeignSidecarError:
    name = ascii(name)[1:-1]  # a planted name could hold a line break: one line in the log, as itself
    return ForeignSidecarError(
        f"staged part {name}'s sidecar is not one this provider writes: {problem}. Something else wrote "
        f"the run's staging; delete parts/{name}.json and that part's data files, and a retry redoes "
        "its rows."
    )
