"""The run manifest: what a job says it did, as both sides write and read it.

The pipeline (the cluster side) builds a :class:`RunManifest` when it commits, holds, takes an earlier
try's version or finishes a dry run, and writes it as JSON (:meth:`RunManifest.to_json`): as
``manifest.json`` beside the outputs and on one marked line of the driver log. The operator (the Airflow
side) parses what it finds there with the same class (:meth:`RunManifest.of`) and reads its fields by
name. Downstream readers open ``manifest.json`` itself (docs/downstream-contract.md): its keys are a
contract, so the JSON is exactly the keys a manifest was given, no more.

Every field but the three counts may be missing: a manifest written by an older provider lacks the keys
added since, a dry run's lacks a version's, a committed one's lacks a held run's. A key this class does
not name is kept as it was (``extra="allow"``), so a manifest from a newer job, read here and handed on
(the ``manifest`` XCom), loses nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue

#: A committed run's ``status``.
COMPLETE_STATUS = "complete"
#: A dry run's ``status`` (pipeline/dry_run.py).
DRY_RUN_STATUS = "dry_run"
#: The ``status`` of a run that failed its failed-row check: written, but not made current (it is
#: printed in the driver log and kept in its staging; ``current_version`` names what stays current).
HELD_STATUS = "held"
#: The fields a reader decides by: whose result the manifest is, where its output is, its counts and
#: the failed-row verdict. A value of another type in one of them makes it no run manifest of ours; in
#: any other field, the value is handed on as written and read as unset (:meth:`RunManifest.of`).
DECIDING_FIELDS = frozenset(
    """
    status job_id run_key spec_fingerprint output_uri rows_in rows_out rows_failed rows_duplicate
    errors_by_reason
    """.split()
)


#: A value no manifest holds: a key not written now.
_GONE = object()


class _Part(BaseModel):
    """A manifest or one of its objects: the keys it was given, and any this class does not name."""

    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _keys_given(self, serialize: SerializerFunctionWrapHandler) -> JsonObject:
        """Dumped, it has the keys it was given or set (None too), never a field's default: a manifest
        says what its job wrote, and one read from an older job is handed on as it was."""
        dumped: JsonObject = serialize(self)
        return {key: value for key, value in dumped.items() if key in self.model_fields_set}

    def to_json(self) -> JsonObject:
        """The JSON object it is written as (``manifest.json``, the driver log's line, the XCom)."""
        return self.model_dump(mode="json")


class FailedRowsCheck(_Part):
    """The committing job's verdict on its failed rows (``manifest.failed_rows_verdict``)."""

    passed: bool
    message: str | None = None


class RequestCounts(_Part):
    """An OpenAI batch's counts under OpenAI's names (``request_counts`` of a Batch object)."""

    total: int
    completed: int
    failed: int


class EarlierJob(_Part):
    """The job that generated the rows a later job handed on: what they cost, and where.

    Under ``held_try`` (a job that committed the rows an earlier try held) and ``reused_result`` (a job
    that took the version an earlier try committed): this job started no engine, and its own timings
    would read as a second run paid for.
    """

    job_id: str | None = None
    version: str | None = None
    finished_at: str | None = None
    timings: JsonObject | None = None
    engine_pool: JsonObject | None = None


class RunManifest(_Part):
    """One run's manifest (see the module docstring). Field order is the order a committed run writes."""

    status: str | None = Field(default=None, description="complete, held or dry_run.")
    version: str | None = Field(default=None, description="The version committed (or held).")
    model: str | None = None
    input_uri: str | None = None
    output_uri: str | None = None
    outputs_uri: str | None = Field(default=None, description="The version's outputs folder.")
    errors_uri: str | None = Field(default=None, description="The version's errors folder.")
    output_format: str | None = None
    rows_in: int = Field(default=0, description="Every input row.")
    rows_out: int = Field(default=0, description="Rows with an output.")
    rows_failed: int = Field(default=0, description="Error rows, duplicate ids among them.")
    rows_duplicate: int | None = Field(
        default=None, description="Rows whose id another row has too, less one per id."
    )
    rows_resumed: int | None = Field(default=None, description="Rows an earlier try staged.")
    prepared_rows_reused: bool | None = None
    errors_by_reason: dict[str, int] = Field(default_factory=dict)
    tokens_in: int | None = None
    tokens_out: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    wall_seconds: float | None = None
    timings: JsonObject | None = Field(default=None, description="pipeline/reporting/timings.py.")
    engine_pool: JsonObject | None = Field(default=None, description="The warm pool, if any.")
    layout: JsonObject | None = Field(default=None, description="The replicas per GPU, and who chose.")
    run_key: str | None = None
    spec_fingerprint: str | None = None
    binding: JsonObject | None = Field(default=None, description="What the rows were made from.")
    airflow_run: dict[str, str] | None = Field(default=None, description="The Airflow run of the job.")
    job_id: str | None = Field(default=None, description="The Ray job's submission id.")
    versions: dict[str, str] | None = None
    report_uri: str | None = None
    json_columns: dict[str, list[str]] | None = None
    max_failed_fraction: float | None = None
    max_failed_rows: int | None = None
    id_column: str | None = None
    failed_rows_check: FailedRowsCheck | None = None
    # Written only where they apply:
    held_try: EarlierJob | None = None
    generated_text_counts: dict[str, int] | None = None
    request_counts: RequestCounts | None = None
    #: Set by the publish: the version this one replaced, or None.
    replaced_version: str | None = None
    #: A held run's: the version that stays current, and the input files' digest.
    current_version: str | None = None
    input_digest: str | None = None
    #: A job that took an earlier try's committed version as its result.
    reused_result: EarlierJob | None = None

    #: The values given of another type than their field's, outside :data:`DECIDING_FIELDS`: read as
    #: unset, written back as they were (:meth:`to_json`).
    _unread: JsonObject = PrivateAttr(default_factory=dict)
    #: The JSON object it was read from (:meth:`of`), and what it dumped to then: a value not set since
    #: is written back as it was given (``"12"``, not the 12 it reads as), in the order it was given.
    _given: JsonObject = PrivateAttr(default_factory=dict)
    _as_read: JsonObject = PrivateAttr(default_factory=dict)

    @classmethod
    def of(cls, manifest: ManifestJson, *, lenient: bool = False) -> Self:
        """``manifest`` as a model: itself, or parsed from its JSON object.

        A value of another type than its field's (a newer or an older job's, a hand-edited file) is
        read as unset and handed on as written, as long as the manifest still says whose result it is
        and what it counted: the task takes such a result as it took it before the manifest had a model.

        :param lenient: a value of :data:`DECIDING_FIELDS` of another type reads as unset too, for a
            reader that decides nothing by it (lineage), so never fails the task.
        :raises pydantic.ValidationError: a value of :data:`DECIDING_FIELDS` is not of its field's type
            (a ``ValueError``), unless ``lenient``.
        """
        if isinstance(manifest, cls):
            return manifest
        given = manifest.to_json() if isinstance(manifest, RunManifest) else dict(manifest)
        try:
            run = cls.model_validate(given)
        except ValidationError as err:
            wrong = {str(error["loc"][0]) if error["loc"] else "" for error in err.errors()}
            if "" in wrong or (wrong & DECIDING_FIELDS and not lenient):
                raise
            run = cls.model_validate({key: value for key, value in given.items() if key not in wrong})
            run._unread = {key: given[key] for key in wrong}
        run._as_read, run._given = run.to_json(), given
        return run

    def to_json(self) -> JsonObject:
        """The JSON object it is written as: a manifest read (:meth:`of`) as it was given, in its order,
        but for the fields set since; any value read as unset as it was given."""
        dumped = {**super().to_json(), **self._unread}
        unchanged = {key for key, value in self._as_read.items() if dumped.get(key, _GONE) == value}
        as_given = {
            key: self._given[key] if key in unchanged else dumped[key] for key in self._given if key in dumped
        }
        return as_given | {key: value for key, value in dumped.items() if key not in as_given}


class DryRunManifest(RunManifest):
    """A dry run's manifest (pipeline/dry_run.py): the input's rows counted, rendered and tokenized, and
    the engine time they would take; nothing generated, nothing committed. ``rows_out`` is the rows that
    would reach the engine with a prompt it takes."""

    dry_run: bool | None = None
    dry_run_uri: str | None = Field(default=None, description="Where its manifest and report are.")
    prompt_tokens: int | None = None
    prompt_tokens_longest: int | None = None
    prompt_tokens_histogram: list[JsonObject] | None = None
    output_tokens_at_most: int | None = None
    rows_per_second: float | None = None
    rows_per_second_from: str | None = None
    estimated_startup_seconds: float | None = None
    estimated_engine_seconds: int | None = None
    estimated_gpu_seconds: int | None = None


#: A manifest as a model, or as the JSON object it is written as.
ManifestJson: TypeAlias = "RunManifest | Mapping[str, JsonValue]"
