"""Staging, resume and commit: how a run becomes visible exactly once, and how a retry resumes.

While a run is in progress its result rows stream in as parts (see
:mod:`~airflow_provider_raybatch.pipeline.stage.parts`): each part's sidecar into
``_staging/<run_key>/parts/``, its data files straight into the version folder the run will commit,
``versions/<version>/outputs/`` and ``errors/``, named when staging opens
(``_staging/<run_key>/spec.json`` holds that version and what the rows are made from: the spec, the
input files, the code and the model, :mod:`.binding`). Readers never see it before the commit: they
follow ``manifest.json``. A retry of the same logical run (same ``run_key``, made from the same) reads
the sources of the staged parts and processes only the rest; one live job at a time writes a run's
staging (:mod:`.ownership`).

Commit keeps the first staged copy of each row (a retried batch stages its rows again), checks that
every input row is accounted for and writes the run report (``report.html``, see
:mod:`~airflow_provider_raybatch.pipeline.reporting.report`) into the version folder; it moves no data
file, so it costs a read of each sidecar (in parallel) and a listing, however many rows. Then it
replaces ``manifest.json`` and only then deletes the sidecars and the versions it supersedes (unless
``keep_versions``; :func:`publish`, :func:`collect_superseded`). A run whose failed rows fail it
(``max_failed_fraction``, ``max_failed_rows``) is held instead: ``manifest.json`` and the version it
names stay, and so does the staging, for a retry.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from airflow_provider_raybatch.pipeline import sidecars, storage
from airflow_provider_raybatch.pipeline.reporting import report
from airflow_provider_raybatch.pipeline.row_types import StagedRow
from airflow_provider_raybatch.pipeline.stage.binding import RunBinding
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue
from airflow_provider_raybatch.shared.manifest import DUPLICATE_ID_REASON, HELD_STATUS, failed_rows_verdict
from airflow_provider_raybatch.shared.run_manifest import EarlierJob, RunManifest
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: Sub-folders of a run's staging folder (see parts.py).
PART_FOLDERS = ("outputs", "errors", "parts")
#: Sidecar key: its ``sources`` are the output rows' then the error rows', each in file order.
SOURCES_IN_FILE_ORDER = "sources_in_file_order"
#: ``spec.json`` key: the version whose folder the staged data files are written into.
STAGED_VERSION_KEY = "version"
#: ``spec.json`` key: what the staged rows were made from (:class:`.binding.RunBinding`).
BINDING_KEY = "binding"
#: In a held run's staging (:func:`hold`): the manifest it did not commit.
HELD_MANIFEST = "held.json"
#: Sidecars read at once: an object store answers each GET in milliseconds, tens of thousands per run.
SIDECAR_READERS = 32


def reason_kind(reason: str) -> str:
    """An error reason's kind: the words before its first colon ('malformed JSON: line 6, ...')."""
    return reason.split(":", 1)[0].strip()[:80]


#: In a staging once its commit has the parts it commits: no part may be added to the version after it
#: (:func:`seal`, :meth:`.parts.PartWriter.check_still_staging`).
SEAL_FILE_NAME = "sealed.json"
#: Beside a committed version's folders, the parts it is made of, written before the manifest names it.
#: A file of its folders that this does not list is a late writer's: a replica cut off from Ray that
#: checked its staging before the seal, stalled through the whole commit, wrote, and died before its
#: second check. The next try of the output removes it (:func:`sweep_current_version`); a reader that
#: must never meet one reads only the listed parts (docs/downstream-contract.md).
PARTS_FILE_NAME = "parts.json"


class InvariantError(RuntimeError):
    """Rows would be lost or doubled: the run refuses to commit."""


@dataclass(frozen=True)
class StagedPart:
    name: str
    sidecar: JsonObject


def _pointer(layout: OutputLayout) -> JsonObject | None:
    """The staging's ``spec.json`` (its spec's fingerprint, the version it stages into), or None.

    :raises InvariantError: it names no version this provider writes (``..``: the output itself, which
        a discarded staging's version folder would delete).
    """
    if not storage.exists(layout.staged_spec_uri, within=layout.output_uri):
        return None
    pointer: JsonObject = json.loads(storage.read_text(layout.staged_spec_uri, within=layout.output_uri))
    version = pointer.get(STAGED_VERSION_KEY)
    if version is not None and not storage.is_folder_name(version):
        raise InvariantError(
            f"{layout.staged_spec_uri} names version {str(version)[:200]!r}, which this provider never "
            "writes: something else wrote the run's staging. Delete that staging folder for the run to "
            "start again."
        )
    return pointer


def staged_data_uri(layout: OutputLayout) -> str:
    """Where this run's staged data files are: its version folder (the staging folder itself before
    :func:`open_staging` names one)."""
    version = (_pointer(layout) or {}).get(STAGED_VERSION_KEY)
    return layout.version_uri(version) if version else layout.staging_uri


def current_version(layout: OutputLayout) -> str | None:
    """The version ``manifest.json`` names now, or None before the first commit.

    :raises InvariantError: the manifest names no version this provider writes (``..``): whoever wrote
        it is not this provider, and its name would be swept as a folder of the output's.
    """
    return _checked_version(RunManifest.of(current_manifest(layout) or {}).version)


def _checked_version(version: str | None) -> str | None:
    if version is not None and not storage.is_folder_name(version):
        raise InvariantError(
            f"manifest.json names version {version[:200]!r}, which this provider never writes: something "
            "else wrote the output's manifest. Restore it, or write this run to another output_uri."
        )
    return version


def current_manifest(layout: OutputLayout) -> JsonObject | None:
    if not storage.exists(layout.manifest_uri, within=layout.output_uri):
        return None
    manifest: JsonObject = json.loads(storage.read_text(layout.manifest_uri, within=layout.output_uri))
    return manifest


def _sidecars(
    layout: OutputLayout, data_uri: str | None = None, known: Iterable[StagedPart] = ()
) -> list[StagedPart]:
    """The committed parts; a sidecar whose data files are gone no longer counts and is removed.

    Files go missing when a commit moved them into a version folder and died before publishing:
    their rows are then redone rather than counted over an empty folder. The sidecars are read in
    parallel, and the data files are checked against one listing of each folder, not one by one.

    :param known: parts whose sidecars this process has already (the replicas reported them with their
        batches, or resume read them): only the listed sidecars not among them are read.
    """
    known_by_name = {part.name: part for part in known}
    data_uri = data_uri or staged_data_uri(layout)
    listed = storage.list_files(storage.join(layout.staging_uri, "parts"), within=layout.output_uri)
    paths = [path for path in listed if path.endswith(".json")]  # not a temporary file of a write that died
    present = {
        folder: {
            posixpath.basename(path)
            for path in storage.list_files(storage.join(data_uri, folder), within=layout.output_uri)
        }
        for folder in ("outputs", "errors")
    }

    def read(path: str) -> StagedPart:
        name = posixpath.basename(path).removesuffix(".json")
        if name in known_by_name:
            return known_by_name[name]
        uri = storage.listed_uri(layout.staging_uri, path)
        return StagedPart(
            name, sidecars.read_sidecar(uri, name, layout.output_uri)
        )  # believed: checked first

    with ThreadPoolExecutor(max_workers=SIDECAR_READERS, thread_name_prefix="raybatch-sidecars") as pool:
        staged = list(pool.map(read, paths))
    parts = []
    for part in staged:
        if all(name in present[folder] for folder, name in part.sidecar["files"].items()):
            parts.append(part)
            continue
        log.warning("Staged part %s lost its data files; its rows will be redone.", part.name)
        _delete_part(layout, part, data_uri)
    return parts


def _delete_part(layout: OutputLayout, part: StagedPart, data_uri: str | None = None) -> None:
    """Delete a part's data files, then its sidecar (so a crash in between leaves an invalid part)."""
    data_uri = data_uri or staged_data_uri(layout)
    for folder, name in part.sidecar["files"].items():
        storage.delete_file(storage.join(data_uri, folder, name), within=layout.output_uri)
    storage.delete_file(
        storage.join(layout.staging_uri, "parts", f"{part.name}.json"), within=layout.output_uri
    )


def _remove_orphans(layout: OutputLayout, committed: set[str], data_uri: str | None = None) -> int:
    """Delete data files of parts that never got their sidecar (written while the job died), and on
    local disk any link there, as a link: none is followed (:func:`.storage.remove_files`)."""
    data_uri = data_uri or staged_data_uri(layout)

    def keep(path: str) -> bool:
        return posixpath.basename(path).split(".", 1)[0] in committed

    return sum(
        storage.remove_files(storage.join(data_uri, folder), layout.output_uri, keep)
        for folder in ("outputs", "errors")
    )


def _is_committed(layout: OutputLayout, version: str | None) -> bool:
    return version is not None and version == current_version(layout)


def _discard(layout: OutputLayout, pointer: JsonObject) -> None:
    """Delete a staging and the data it staged into its version folder (never a committed version's)."""
    version = pointer.get(STAGED_VERSION_KEY)
    if version and not _is_committed(layout, version):
        # first: spec.json, deleted last, still names it
        storage.delete_tree(layout.version_uri(version), within=layout.output_uri)
    storage.delete_tree(layout.staging_uri, within=layout.output_uri)


def open_staging(
    layout: OutputLayout, spec: BatchInferenceSpec, binding: RunBinding | None = None
) -> set[str]:
    """Prepare staging for this run and return the sources of rows an earlier try already staged
    (:func:`open_staging_parts`, for callers that need only the sources)."""
    parts = open_staging_parts(layout, spec, binding)
    return {source for part in parts for source in part.sidecar["sources"]}


def open_staging_parts(
    layout: OutputLayout, spec: BatchInferenceSpec, binding: RunBinding | None = None
) -> list[StagedPart]:
    """Prepare staging for this run and return the parts an earlier try already staged.

    Staging made from anything else (:class:`.binding.RunBinding`: the spec, the input files, the code
    or the model changed between tries) is discarded with the data it staged, and the log says what
    changed; so are the files of parts that were being written when an earlier try died. A fresh
    staging names the version it stages into and what it is made from (``spec.json``; see
    :func:`staged_data_uri`).

    :param binding: what this run is made from; unset: the spec alone (:func:`binding_of` gives all).
    """
    binding = binding or RunBinding(spec=spec.fingerprint())
    pointer = _pointer(layout)
    changes = binding.changes_from(RunBinding.from_dict(pointer.get(BINDING_KEY))) if pointer else []
    if pointer is not None and changes:
        log.warning(
            "Staging of %s is not this run's (changed since: %s): discarding its rows and starting afresh.",
            layout.run_key,
            ", ".join(changes),
        )
        _discard(layout, pointer)
        pointer = None
    elif pointer is not None and _is_committed(layout, pointer.get(STAGED_VERSION_KEY)):
        # Committed, and the commit died before it deleted its sidecars: this run starts afresh.
        log.info(
            "Staging of %s was committed as version %s already; starting over.",
            layout.run_key,
            pointer.get(STAGED_VERSION_KEY),
        )
        storage.delete_tree(layout.staging_uri, within=layout.output_uri)
        pointer = None
    if pointer is None:
        # No spec.json: nothing staged, or the rest of a staging folder whose deletion died half way.
        storage.delete_tree(layout.staging_uri, within=layout.output_uri)
        staged = {
            "fingerprint": binding.spec,
            BINDING_KEY: binding.as_dict(),
            STAGED_VERSION_KEY: layout.new_version(),
        }
        storage.write_text(layout.staged_spec_uri, json.dumps(staged), within=layout.output_uri)
        return []
    if storage.exists(
        _seal_uri(layout), within=layout.output_uri
    ):  # an earlier try's commit held its rows or died: resumed now
        storage.delete_file(_seal_uri(layout), within=layout.output_uri)
    data_uri = staged_data_uri(layout)
    parts = _sidecars(layout, data_uri)
    removed = _remove_orphans(layout, {part.name for part in parts}, data_uri)
    if removed:
        log.info("Removed %d staged files of parts an earlier try did not finish.", removed)
    return parts


class PartRewriter(Protocol):
    """What commit needs to stage a part again without some of its rows (:class:`.parts.PartWriter`)."""

    def read_part(self, part: StagedPart) -> list[StagedRow]: ...

    def write_part(self, rows: list[StagedRow]) -> StagedPart: ...

    def conform_parts(self, parts: list[StagedPart]) -> dict[str, list[str]]: ...


def _drop_repeated_rows(
    layout: OutputLayout,
    parts: list[StagedPart],
    rewriter: PartRewriter | None = None,
    data_uri: str | None = None,
) -> list[StagedPart]:
    """Keep the first staged copy of each row (parts in name order).

    A batch whose replica died is retried whole, and its rows are staged again, mixed with the rows
    of other batches: a part whose rows were all staged before goes; a part repeating some of them
    is staged again without those (the new part first, so a crash in between leaves only a part
    that the next commit drops). Without ``rewriter``, or for a part from before sidecars listed
    rows in file order, a partial repeat refuses the commit.
    """
    data_uri = data_uri or staged_data_uri(layout)
    seen: set[str] = set()
    kept = []
    for part in sorted(parts, key=lambda p: p.name):
        sources = set(part.sidecar["sources"])
        overlap = sources & seen
        if not overlap:
            seen |= sources
            kept.append(part)
            continue
        if overlap == sources:
            log.warning("Dropping staged part %s: its %d rows were staged before.", part.name, len(sources))
            _delete_part(layout, part, data_uri)
            continue
        if rewriter is None or not part.sidecar.get(SOURCES_IN_FILE_ORDER):
            raise InvariantError(f"staged part {part.name} repeats {len(overlap)} of its rows only partly.")
        rows = [row for row in rewriter.read_part(part) if row["source"] not in seen]
        restaged = rewriter.write_part(rows)
        _delete_part(layout, part, data_uri)
        log.warning(
            "Staged part %s repeats %d of its %d rows: staged the other %d again as %s.",
            part.name,
            len(overlap),
            len(sources),
            len(rows),
            restaged.name,
        )
        seen |= sources
        kept.append(restaged)
    return kept


@dataclass
class CommittedRun:
    version: str
    outputs_uri: str
    errors_uri: str
    rows_out: int = 0
    rows_failed: int = 0
    #: Error rows whose id another row has too, less one per id: neither failures nor rows of their own
    #: for the failed-rows thresholds (``manifest.failed_rows_verdict``).
    rows_duplicate: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    errors_by_reason: dict[str, int] = field(default_factory=dict)
    generated_text_counts: dict[str, int] | None = None
    #: ``versions/<version>/report.html``; None when the report could not be rendered.
    report_uri: str | None = None
    #: Columns of each folder written as JSON text (their values are not of one Arrow type).
    json_columns: dict[str, list[str]] = field(default_factory=dict)
    #: The parts the version is made of (:func:`seal` removes any other file from its folders).
    part_names: frozenset[str] = frozenset()
    #: Why the run's failed rows fail its task (``manifest.failed_rows_verdict``); None when they do not.
    #: A run they fail is held (:func:`hold`), not published.
    failed_rows_message: str | None = None

    @property
    def held(self) -> bool:
        return self.failed_rows_message is not None


def write_version(
    layout: OutputLayout,
    spec: BatchInferenceSpec,
    rows_in: int,
    *,
    rewriter: PartRewriter | None = None,
    rows_resumed: int | None = None,
    started_at: datetime | None = None,
    versions: Mapping[str, str] | None = None,
    known_parts: Iterable[StagedPart] = (),
    timings: Mapping[str, JsonValue] | None = None,
    engine_pool: Mapping[str, JsonValue] | None = None,
    held_try: Mapping[str, JsonValue] | None = None,
    rows_duplicate: int | None = None,
) -> CommittedRun:
    """Make the staged parts a version (invisible until :func:`publish`) and write its run report there.

    A version whose failed rows fail the run (``run.held``) is to be held (:func:`hold`), not published.

    The parts' data files are in the version folder already (in place): nothing moves.

    :param rewriter: stages a part again without the rows it repeats (:func:`_drop_repeated_rows`).
    :param rows_resumed: rows an earlier try staged (shown in the report; unset: "—").
    :param started_at: when the run started: the report's wall time runs from it to now, and its
        throughput chart starts there (unset: at the first part).
    :param versions: library versions to show, e.g. ``{"ray": ..., "vllm": ...}``.
    :param known_parts: parts whose sidecars the caller has (reported by the replicas and the sink,
        read by resume): commit reads only the other sidecars it lists, one GET each.
    :param timings: where the run's time went so far (reporting/timings.py), shown in the report.
    :param engine_pool: the warm pool the run's engine stage used (the manifest's ``engine_pool``),
        shown in the report.
    :param held_try: the earlier try whose held rows this run commits (:func:`held_try`): what
        generating them took, shown in the report.
    :param rows_duplicate: the input's rows whose id another row has too, good or not, less one per id
        (``rows_in`` less the distinct rows, counted as the rows were read:
        :func:`..read.dedupe.find_first_sources`); unset: the ``duplicate id`` errors, which leave out
        the failed rows of an id that another row has.
    """
    data_uri = staged_data_uri(layout)
    if data_uri == layout.staging_uri:
        raise InvariantError(
            f"staging at {layout.staging_uri} names no version: open it first (open_staging)."
        )
    parts = _drop_repeated_rows(layout, _sidecars(layout, data_uri, known_parts), rewriter, data_uri)
    _remove_orphans(layout, {part.name for part in parts}, data_uri)
    version = posixpath.basename(data_uri.rstrip("/"))
    run, labels = _added_up(layout, version, parts, rewriter)
    if run.rows_out + run.rows_failed != rows_in:
        raise InvariantError(
            f"rows in {rows_in} != rows out {run.rows_out} + rows failed {run.rows_failed}; "
            f"staging kept at {layout.staging_uri} (data files at {data_uri}) for inspection, "
            "nothing committed."
        )
    run.rows_duplicate = (
        run.errors_by_reason.get(DUPLICATE_ID_REASON, 0) if rows_duplicate is None else rows_duplicate
    )
    counts = _check_failed_rows(layout, spec, run, rows_in)
    if spec.structured_choices is not None or labels:  # the operator's choice, or rows' own
        run.generated_text_counts = dict(sorted(labels.items()))
    # Rendered before anything moves: a rendering bug must not leave the parts half committed.
    page = _render_report(
        run, spec, parts, rows_in, rows_resumed, started_at, versions, timings, engine_pool, held_try
    )
    for folder in ("outputs", "errors"):  # an empty run's folders too: readers list them
        storage.make_folders(storage.join(layout.version_uri(version), folder), within=layout.output_uri)
    if page is not None:
        run.report_uri = storage.join(layout.version_uri(version), report.REPORT_FILE_NAME)
        storage.write_text(run.report_uri, page, within=layout.output_uri)
    elif run.held:  # the message named the report it would have
        counts.report_uri = None
        run.failed_rows_message = failed_rows_verdict(counts, spec.max_failed_fraction, spec.max_failed_rows)
    return run


def _added_up(
    layout: OutputLayout, version: str, parts: list[StagedPart], rewriter: PartRewriter | None
) -> tuple[CommittedRun, Counter[str]]:
    """The version's run with its parts' counts added up, and the generated texts' labels counted."""
    run = CommittedRun(
        version=version,
        outputs_uri=storage.join(layout.version_uri(version), "outputs"),
        errors_uri=storage.join(layout.version_uri(version), "errors"),
    )
    if rewriter is not None:  # one schema for all parts of an output (see part_schema)
        run.json_columns = rewriter.conform_parts(parts)
    run.part_names = frozenset(part.name for part in parts)
    reasons: Counter[str] = Counter()
    labels: Counter[str] = Counter()
    for part in parts:
        run.rows_out += part.sidecar["rows_out"]
        run.rows_failed += part.sidecar["rows_failed"]
        run.tokens_in += part.sidecar["tokens_in"]
        run.tokens_out += part.sidecar["tokens_out"]
        reasons.update(part.sidecar["errors_by_reason"])
        labels.update(part.sidecar.get("generated_text_counts", {}))
    run.errors_by_reason = dict(sorted(reasons.items()))
    return run, labels


def _check_failed_rows(
    layout: OutputLayout, spec: BatchInferenceSpec, run: CommittedRun, rows_in: int
) -> RunManifest:
    """Set ``run.failed_rows_message`` when the run's failed rows fail it (it is then held); the
    counts the verdict was made from, for :func:`write_version` to make it again without a report."""
    counts = RunManifest(
        rows_in=rows_in,
        rows_out=run.rows_out,
        rows_failed=run.rows_failed,
        rows_duplicate=run.rows_duplicate,
        errors_by_reason=run.errors_by_reason,
        outputs_uri=run.outputs_uri,
        errors_uri=run.errors_uri,
        id_column=spec.id_column,
    )
    if failed_rows_verdict(counts, spec.max_failed_fraction, spec.max_failed_rows) is not None:
        # Held, not published (:func:`hold`): the message says what stays current and what is kept.
        counts.status = HELD_STATUS
        counts.current_version = current_version(layout)
        counts.output_uri = layout.output_uri
        counts.report_uri = storage.join(layout.version_uri(run.version), report.REPORT_FILE_NAME)
        run.failed_rows_message = failed_rows_verdict(counts, spec.max_failed_fraction, spec.max_failed_rows)
    return counts


def _render_report(
    run: CommittedRun,
    spec: BatchInferenceSpec,
    parts: list[StagedPart],
    rows_in: int,
    rows_resumed: int | None,
    started_at: datetime | None,
    versions: Mapping[str, str] | None,
    timings: Mapping[str, JsonValue] | None = None,
    engine_pool: Mapping[str, JsonValue] | None = None,
    held_try: Mapping[str, JsonValue] | None = None,
) -> str | None:
    """The version's report page (see :func:`write_version`), or None, logged, when it cannot be rendered.

    The report is a view of the run, not part of its result: a failure here must not fail a commit
    whose every row is accounted for, which a retry would only redo and fail the same way.
    """
    try:
        committed_at = datetime.now(UTC)
        if started_at is not None and started_at.tzinfo is None:
            started_at = started_at.replace(tzinfo=UTC)
        summary = {
            "model": spec.model,
            "input_uri": spec.input_uri,
            "version": run.version,
            "outputs_uri": run.outputs_uri,
            "errors_uri": run.errors_uri,
            "rows_in": rows_in,
            "rows_out": run.rows_out,
            "rows_failed": run.rows_failed,
            "rows_duplicate": run.rows_duplicate,
            "rows_resumed": rows_resumed,
            "tokens_in": run.tokens_in,
            "tokens_out": run.tokens_out,
            "errors_by_reason": run.errors_by_reason,
            "failed_rows_message": run.failed_rows_message,
            "generated_text_counts": run.generated_text_counts,
            "versions": dict(versions or {}),
            "started_at": started_at.isoformat() if started_at else None,
            "committed_at": committed_at.isoformat(timespec="seconds"),
            "wall_seconds": (committed_at - started_at).total_seconds() if started_at else None,
            "timings": dict(timings) if timings is not None else None,
            "engine_pool": dict(engine_pool) if engine_pool is not None else None,
            "held_try": dict(held_try) if held_try is not None else None,
        }
        return report.render_report(summary, report.ReportStats.of_sidecars(part.sidecar for part in parts))
    except Exception:  # noqa: BLE001 - see the docstring; the manifest then carries report_uri None.
        log.exception("Could not render the run report of version %s; committing without it.", run.version)
        return None


def hold(layout: OutputLayout, manifest: JsonObject) -> None:
    """Keep a run that failed its failed-row check out of ``manifest.json``: what was current stays so.

    A run whose rows mostly failed (a wrong column, a broken prompt) must not replace the date's
    last good result, nor delete it. Its version folder (outputs, errors, report) and its staging
    stay as they are, with the manifest it would have committed (status ``held``) beside the
    sidecars, for a retry to take (:func:`take_held`).
    """
    storage.write_text(
        held_manifest_uri(layout), json.dumps(manifest, indent=2, sort_keys=True), within=layout.output_uri
    )


def held_manifest_uri(layout: OutputLayout) -> str:
    """Where :func:`hold` keeps a held run's manifest: in its staging, which a commit deletes."""
    return storage.join(layout.staging_uri, HELD_MANIFEST)


@dataclass(frozen=True)
class HeldRun:
    """An earlier try's held run that this try may take (:func:`take_held`)."""

    manifest: JsonObject
    #: The thresholds pass its rows now: this try commits them. Else it is held again as it is.
    passes: bool


def take_held(layout: OutputLayout, spec: BatchInferenceSpec, binding: RunBinding) -> HeldRun | None:
    """The earlier try's held run (:func:`hold`), when this try is of the same run; else None, and
    its rows discarded.

    A held run is kept as it is until the run changes: a try made from the same spec, input files,
    code and model (``binding``) takes it without starting an engine, and commits its rows if the
    thresholds now pass them (the user loosened ``max_failed_fraction`` to accept them), or is held
    again at once (an automatic retry: the same rows would be generated, paid for and held again).
    A try made from anything else (the input fixed in place, a fixed preprocess behind the same name)
    discards them with their version folder and starts afresh. Call before :func:`open_staging_parts`.
    """
    if not storage.exists(held_manifest_uri(layout), within=layout.output_uri):
        return None
    held: JsonObject = json.loads(storage.read_text(held_manifest_uri(layout), within=layout.output_uri))
    changes = binding.changes_from(RunBinding.from_dict(RunManifest.of(held).binding))
    if changes:
        log.warning(
            "An earlier try of %s held its rows; changed since: %s: discarding them and starting afresh.",
            layout.run_key,
            ", ".join(changes),
        )
        _discard(layout, _pointer(layout) or {})
        return None
    passes = failed_rows_verdict(held, spec.max_failed_fraction, spec.max_failed_rows) is None
    if passes:
        log.info(
            "Committing the %s rows an earlier try of %s held, as the thresholds now pass them.",
            RunManifest.of(held).rows_in,
            layout.run_key,
        )
    else:
        log.warning(
            "An earlier try of %s held its rows, and the thresholds still fail them: holding them "
            "again without generating anything.",
            layout.run_key,
        )
    return HeldRun(held, passes)


def held_try(held: Mapping[str, JsonValue]) -> JsonObject:
    """What the try that generated and held the rows a later try committed paid for them: the committed
    manifest's ``held_try`` (that later job started no engine: its own timings show none, and the run
    read as free)."""
    return _held_try(RunManifest.of(held)).to_json()


def _held_try(held: RunManifest) -> EarlierJob:
    return EarlierJob(
        job_id=held.job_id, version=held.version, timings=held.timings, engine_pool=held.engine_pool
    )


def held_again(held: Mapping[str, JsonValue], job_id: str | None) -> JsonObject:
    """The manifest of a try held again on the rows an earlier try held (:func:`take_held`): the held
    try's, as ``job_id``'s, with what generating the rows took under ``held_try``. This job started no
    engine: the held try's timings as its own read as a second run paid for."""
    manifest = RunManifest.of(held)
    again = {"job_id": job_id, "timings": None, "engine_pool": None, "held_try": _held_try(manifest)}
    return manifest.model_copy(update=again).to_json()


def seal(layout: OutputLayout, run: CommittedRun) -> None:
    """Close the staging to parts added after :func:`write_version` listed them, before the version is
    published or held; then remove the version folder's files of any part it did not commit.

    A replica of a job that has ended (cut off from Ray, not from the store) checks its staging before
    each part (:meth:`.parts.PartWriter.check_still_staging`). One that checked before the commit's
    listing and wrote after it would add rows to the version folder that the manifest does not count,
    and readers read that folder whole. After the seal such a writer refuses, and removes what it wrote
    since its last check; what it wrote before the seal is removed here. A retry reopening the staging
    lifts the seal (:func:`open_staging_parts`).
    """
    storage.write_text(_seal_uri(layout), json.dumps({"version": run.version}), within=layout.output_uri)
    removed = _remove_orphans(layout, set(run.part_names), staged_data_uri(layout))
    if removed:
        log.warning(
            "Removed %d files that a late writer added to version %s while it was committed.",
            removed,
            run.version,
        )


def _seal_uri(layout: OutputLayout) -> str:
    return storage.join(layout.staging_uri, SEAL_FILE_NAME)


def publish(
    layout: OutputLayout,
    manifest: JsonObject,
    keep_versions: bool,
    committed_parts: frozenset[str] | None = None,
) -> None:
    """Make the version visible (manifest last), then clean up staging and the versions it supersedes.

    The manifest gets ``replaced_version``: the version it replaces (deleted unless ``keep_versions``),
    or None, so the task can say so (a re-run that replaced a good version without a word).

    Two runs of one output (a manual and a scheduled run of a date) may publish at the same moment:
    both read the same previous version, and the manifest written last wins. Deleting only the version
    each read as previous left the other's behind for good, and its task handed that version on while
    the manifest named another. So each publish lists its own version under ``_published/`` once its
    manifest names it, and then removes every listed version that is no longer current
    (:func:`collect_superseded`): whichever publish finishes last removes the other's, and the task of
    the run whose version went fails, naming the commit that replaced it (operators/job_results.py).

    With ``keep_versions`` the version this publish replaces is taken off the list (kept for good) and
    nothing is collected; a version that a concurrent publish replaced without seeing it is removed by
    the next publish that does not keep versions.

    :param committed_parts: the parts the version is made of (:attr:`CommittedRun.part_names`): any
        other file in its folders, a late writer's that :func:`seal` could not see yet, is removed
        once the manifest names the version, before the staging (the writers' fence) goes.
    """
    previous = RunManifest.of(current_manifest(layout) or {})
    _checked_version(previous.version)
    version = RunManifest.of(manifest).version
    if version is None:
        raise InvariantError("the manifest to publish names no version.")
    replaced = previous.version if previous.version != version else None
    manifest["replaced_version"] = replaced
    # The version replaced is listed before the manifest that replaces it: a publish that dies between
    # its manifest and its own listing leaves its version for the next publish to list here, and the
    # one it replaced listed already (a manifest named it: current until then, so never collected early).
    if (
        replaced
        and not keep_versions
        and not storage.exists(_published_entry(layout, replaced), within=layout.output_uri)
    ):
        _list_published(layout, replaced, previous.run_key)
    if committed_parts is not None:
        storage.write_text(
            parts_uri(layout, version), json.dumps(sorted(committed_parts)), within=layout.output_uri
        )
    storage.write_text(
        layout.manifest_uri, json.dumps(manifest, indent=2, sort_keys=True), within=layout.output_uri
    )
    _list_published(layout, version, layout.run_key)  # after the manifest: see collect_superseded
    if committed_parts is not None:  # a late writer that wrote after the seal's sweep and died since
        _remove_orphans(layout, set(committed_parts), layout.version_uri(version))
    if replaced and keep_versions:
        storage.delete_file(_published_entry(layout, replaced), within=layout.output_uri)
    storage.delete_tree(layout.staging_uri, within=layout.output_uri)
    if not keep_versions:
        collect_superseded(layout)


def parts_uri(layout: OutputLayout, version: str) -> str:
    """``versions/<version>/parts.json``: the parts a committed version is made of."""
    return storage.join(layout.version_uri(version), PARTS_FILE_NAME)


def sweep_current_version(layout: OutputLayout) -> int:
    """Remove the files of the current version's folders that its parts list does not name; return how
    many. Run as each try of the output starts, before it may hand the version on.

    Only a late writer adds such a file (:data:`PARTS_FILE_NAME`), and a committed version is otherwise
    never written again, so this removes nothing a reader of the version should see. A version
    committed before the list existed is left as it is.
    """
    version = current_version(layout)
    if version is None or not storage.exists(parts_uri(layout, version), within=layout.output_uri):
        return 0
    listed = set(json.loads(storage.read_text(parts_uri(layout, version), within=layout.output_uri)))
    removed = _remove_orphans(layout, listed, layout.version_uri(version))
    if removed:
        log.warning(
            "Removed %d files from committed version %s that its parts list does not name: a "
            "replica of an ended job wrote them after the commit.",
            removed,
            version,
        )
    return removed


def _published_entry(layout: OutputLayout, version: str) -> str:
    return storage.join(layout.published_uri, f"{version}.json")


def _list_published(layout: OutputLayout, version: str, run_key: str | None) -> None:
    entry = {"version": version, "run_key": run_key}
    storage.write_text(
        _published_entry(layout, version), json.dumps(entry, sort_keys=True), within=layout.output_uri
    )


def collect_superseded(layout: OutputLayout) -> None:
    """Delete each version listed under ``_published/`` that is no longer current.

    Safe beside any other publish or collection of the output: a version is listed only once a
    manifest has named it, and the current version is read after the listing, so a listed version
    that is not current then has been replaced for good. Left alone: the current version, and one a
    run's staging still names (its commit died after writing the manifest; a retry resumes that
    staging and publishes the version again). Each version's entry goes after its folder, so a
    collection that dies half way is finished by the next.
    """
    published = storage.list_files(layout.published_uri, within=layout.output_uri)
    listed = [path for path in published if path.endswith(".json")]
    current = current_version(layout)
    for path in listed:
        version = posixpath.basename(path).removesuffix(".json")
        folder = layout.version_uri_of(version)
        if version == current:
            continue
        if folder is None:  # planted (``...json`` names ``..``: the output itself): never ours to delete
            log.warning("Left %r alone: it lists %r, no version this provider writes.", path, version[:200])
            continue
        uri = storage.listed_uri(layout.output_uri, path)
        try:
            entry = json.loads(storage.read_text(uri, within=layout.output_uri))
            run_key = entry.get("run_key") if isinstance(entry, dict) else None
            staging = OutputLayout(layout.output_uri, run_key) if storage.is_folder_name(run_key) else None
            staged = _pointer(staging) if staging else None
        except OSError:  # its entry or that staging deleted meanwhile: by a collection or commit beside
            continue
        except ValueError:  # no entry this provider wrote: its version is not known to be superseded
            log.warning("Left %r alone: it is not JSON.", path)
            continue
        if (staged or {}).get(STAGED_VERSION_KEY) == version:
            continue
        storage.delete_tree(folder, within=layout.output_uri)
        storage.delete_file(uri, within=layout.output_uri)
