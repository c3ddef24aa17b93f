"""The run manifest, where DAGs import it from: :class:`RunManifest` (``RunManifest.of(manifest)`` reads
the ``manifest`` XCom or a ``manifest.json``), the statuses, and the driver log's hand-over lines.

They live in the shared layer (:mod:`airflow_provider_raybatch.shared.manifest`,
:mod:`airflow_provider_raybatch.shared.run_manifest`), which both sides import.
"""

from __future__ import annotations

from airflow_provider_raybatch.shared.manifest import (
    DRY_RUNS_FOLDER,
    DUPLICATE_ID_REASON,
    MANIFEST_FILE_NAME,
    MANIFEST_LOG_MARKER,
    MISSING_ID_REASON,
    PROGRESS_LOG_MARKER,
    REUSED_RESULT_KEY,
    VERDICT_REASONS,
    describe_engine_pool,
    describe_progress,
    describe_timings,
    dry_run_uri,
    failed_rows,
    failed_rows_verdict,
    manifest_from_log,
    manifest_log_line,
    progress_from_log,
    progress_log_line,
)
from airflow_provider_raybatch.shared.run_manifest import (
    COMPLETE_STATUS,
    DRY_RUN_STATUS,
    HELD_STATUS,
    DryRunManifest,
    RunManifest,
)

__all__ = [
    "MANIFEST_FILE_NAME",
    "MANIFEST_LOG_MARKER",
    "PROGRESS_LOG_MARKER",
    "DUPLICATE_ID_REASON",
    "MISSING_ID_REASON",
    "VERDICT_REASONS",
    "DRY_RUNS_FOLDER",
    "REUSED_RESULT_KEY",
    "dry_run_uri",
    "manifest_log_line",
    "progress_log_line",
    "manifest_from_log",
    "progress_from_log",
    "failed_rows",
    "failed_rows_verdict",
    "describe_timings",
    "describe_engine_pool",
    "describe_progress",
    "COMPLETE_STATUS",
    "DRY_RUN_STATUS",
    "HELD_STATUS",
    "DryRunManifest",
    "RunManifest",
]
