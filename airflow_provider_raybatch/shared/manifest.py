"""What the pipeline (cluster) hands the operator (Airflow) through the driver log: the manifest and progress.

The pipeline writes ``manifest.json`` beside the outputs and also prints it on one marked line of
the driver log, so the operator can read it through the Jobs API without storage credentials.
While it runs, it prints a marked progress line now and then, which the trigger turns into a
readable line of the task log. Both sides judge a committed run's failed rows with
:func:`failed_rows_verdict`.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue
from airflow_provider_raybatch.shared.run_manifest import HELD_STATUS, ManifestJson, RunManifest

MANIFEST_FILE_NAME = "manifest.json"
MANIFEST_LOG_MARKER = "RAYBATCH_MANIFEST_JSON="
PROGRESS_LOG_MARKER = "RAYBATCH_PROGRESS_JSON="
#: The ``errors_by_reason`` kind of a row whose id an earlier row already has (counted in ``rows_duplicate``).
DUPLICATE_ID_REASON = "duplicate id"
#: The ``errors_by_reason`` kind of a row without a value in ``id_column`` (pipeline/prompt/prompts.py).
MISSING_ID_REASON = "missing id"
#: How many of the most common reasons a failed-rows verdict names.
VERDICT_REASONS = 3
#: Under ``output_uri``: one folder per run key with a dry run's manifest and report.
DRY_RUNS_FOLDER = "_dry_runs"
#: The key of the manifest a job prints when it took the version an earlier try of its run committed
#: (``reuse_earlier_result``, pipeline/stage/reuse.py): that try's job id, version and costs
#: (:attr:`.RunManifest.reused_result`).
REUSED_RESULT_KEY = "reused_result"


def dry_run_uri(output_uri: str, run_key: str) -> str:
    """Where a dry run of ``run_key`` writes its manifest and report (never where a run commits)."""
    return f"{output_uri.rstrip('/')}/{DRY_RUNS_FOLDER}/{run_key}"


def manifest_log_line(manifest: ManifestJson) -> str:
    """The single log line that carries the manifest."""
    written = manifest.to_json() if isinstance(manifest, RunManifest) else manifest
    return MANIFEST_LOG_MARKER + json.dumps(written, sort_keys=True, separators=(",", ":"))


def progress_log_line(progress: JsonObject) -> str:
    """The log line that carries one progress snapshot (see :func:`describe_progress`)."""
    return PROGRESS_LOG_MARKER + json.dumps(progress, sort_keys=True, separators=(",", ":"))


def _last_marked(
    log: str, marker: str, accept: Callable[[JsonObject], bool] | None = None
) -> JsonObject | None:
    # Searched from the end, not split into lines: the trigger reads a whole driver log (hundreds of
    # KiB) for each progress line, hundreds of triggers per triggerer (bench/RESULTS.md, section 3).
    end = len(log)
    while (start := log.rfind(marker, 0, end)) >= 0:
        if start > 0 and log[start - 1] != "\n":
            # Not at a line's start: the driver prints the marker first on its own line, and a line
            # quoting it (a row's text in a warning, another process's output) is not the job's result.
            # Only "\n" starts a line: Ray prefixes a forwarded line after "\n" alone, so a "\r" in
            # another process's line would let it carry an unprefixed marker.
            end = start
            continue
        line_end = log.find("\n", start)
        # The rest of the marker's line; splitlines() also ends it at "\r" and the like, as before.
        payload = log[start + len(marker) : None if line_end < 0 else line_end].splitlines()
        try:
            found = json.loads(payload[0] if payload else "")
        except json.JSONDecodeError:
            found = None  # a line cut short in the log; an earlier complete one may follow
        if found is not None and (accept is None or accept(found)):
            return found
        end = start
    return None


def manifest_from_log(log: str, accept: Callable[[JsonObject], bool] | None = None) -> JsonObject | None:
    """The last manifest printed in a driver log (as printed: :meth:`.RunManifest.of` reads it), or None
    when the job printed none.

    :param accept: where given, the last manifest it accepts: a later line it refuses (another job's,
        a forgery) does not hide the job's own.
    """
    return _last_marked(log, MANIFEST_LOG_MARKER, accept)


def progress_from_log(log: str) -> JsonObject | None:
    """The latest progress snapshot printed in a driver log, or None before the first."""
    return _last_marked(log, PROGRESS_LOG_MARKER)


def failed_rows(manifest: ManifestJson) -> int:
    """The run's failed rows as the thresholds count them: error rows less duplicate ids."""
    run = RunManifest.of(manifest)
    return max(run.rows_failed - (run.rows_duplicate or 0), 0)


def failed_rows_verdict(
    manifest: ManifestJson,
    max_failed_fraction: float,
    max_failed_rows: int | None,
) -> str | None:
    """None when the run's failed rows are within the thresholds, else why not, in one message.

    Failed rows are the error rows less the duplicate ids (``rows_duplicate``: the rows whose id another
    row has too, less one per id, whichever of them failed and why), and the share is of the distinct
    rows, ``rows_in`` less the same duplicates: a repeated id is neither a failure nor a row of its own,
    and an id fails only when none of its rows has an answer, so a run whose 100 rows are 50 repeats and
    whose other 50 had 15 failures failed 15 of 50 (30%), not 15 of 100. The run fails when that share
    is over ``max_failed_fraction``, when the failed rows are more than ``max_failed_rows`` (unless
    None), and always when rows came in and none came out. An empty input (``rows_in == 0``) passes. The
    message gives the counts (of distinct rows), the most common reasons and where the committed outputs
    and errors are, e.g. ``2,400 of 3,000 rows failed (80.0%, duplicate ids not counted), over
    max_failed_fraction=0.1. Most common reasons: 'missing id' 1,200; ...``.
    """
    run = RunManifest.of(manifest)
    rows_in, rows_out = run.rows_in, run.rows_out
    if rows_in <= 0:
        return None
    failed = failed_rows(run)
    distinct = max(rows_in - (run.rows_duplicate or 0), 1)  # the first of each id counts
    share = failed / distinct  # compared as a quotient: 29 of 100 is exactly at 0.29, not over it
    over = []
    if share > max_failed_fraction:
        over.append(f"max_failed_fraction={max_failed_fraction:g}")
    if max_failed_rows is not None and failed > max_failed_rows:
        over.append(f"max_failed_rows={max_failed_rows:,}")
    if not over and rows_out > 0:
        return None
    message = f"{failed:,} of {distinct:,} rows failed ({share:.1%}, duplicate ids not counted)"
    if over:
        message += ", over " + " and ".join(over)
    if rows_out == 0:
        message += "; no row has an output, which fails a run whatever the thresholds"
    message += "."
    reasons = {
        kind: count
        for kind, count in run.errors_by_reason.items()
        if kind != DUPLICATE_ID_REASON and count > 0
    }
    if reasons:
        common = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))[:VERDICT_REASONS]
        message += " Most common reasons: " + "; ".join(f"{kind!r} {count:,}" for kind, count in common) + "."
        if rows_out == 0 and common[0][0] == MISSING_ID_REASON and run.id_column:
            # Else a misspelled id_column reads as a list of row errors.
            column = run.id_column
            message += f" No row has a value in id_column={column!r}: is that the input's id column?"
    written = [uri for uri in (run.outputs_uri, run.errors_uri) if uri]
    if run.status == HELD_STATUS:
        message += " " + _held_sentence(run, written)
    elif written:
        message += f" Outputs and errors are committed: {', '.join(written)}."
    return message


def _held_sentence(manifest: RunManifest, written: list[str]) -> str:
    """What a held run (:data:`HELD_STATUS`) left where, and how to commit it without paying again."""
    current = manifest.current_version
    kept = f"version {current} stays current" if current else "it has no version yet"
    sentence = f"Nothing was committed: {manifest.output_uri} is as it was ({kept})."
    if manifest.rows_out == 0:  # no outputs to look at, and no threshold passes it
        written = [manifest.errors_uri] if manifest.errors_uri else []
    if written:
        # until the next try of this run, which takes them or deletes them (a message must not
        # point at a folder the retry has deleted)
        sentence += f" This run's {'outputs and errors are' if len(written) > 1 else 'errors are'} kept"
        sentence += f" until its next try, for a look at {', '.join(written)}"
        sentence += f", its report at {manifest.report_uri}." if manifest.report_uri else "."
    if manifest.rows_out == 0:
        return sentence + " Fix the input or the parameters: a retry then starts afresh."
    return sentence + (
        " A retry with looser max_failed_fraction / max_failed_rows (and the same input and parameters) "
        "commits these rows without generating one again; any other retry starts afresh."
    )


_TIMING_LABELS = (  # the phases of reporting/timings.py, short, for one log line
    ("job_wall_s", "job"),
    ("runtime_env_s", "runtime env"),
    ("driver_start_s", "driver start"),
    ("read_and_prepare_s", "read and prepare"),
    ("before_engine_stage_s", "to engine stage start"),
    ("engine_start_to_first_row_s", "engine start to first row"),
    ("engine_build_s", "of which engine build"),
    ("generating_s", "generating"),
    ("engine_stage_end_s", "to engine stage end"),
    ("commit_s", "commit"),
)


def _number(value: JsonValue) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def describe_timings(timings: JsonValue) -> str | None:
    """One line of where a run's time and GPUs went, e.g. ``read and prepare 12.0 s; engine start to
    first row 32.0 s; generating 54.0 s; commit 1.5 s; 87.0 GPU-seconds held (4 replicas x 0.25 GPU)``;
    None for a manifest without ``timings`` (an older job's)."""
    if not isinstance(timings, dict):
        return None
    shown = [
        f"{label} {seconds:.1f} s"
        for key, label in _TIMING_LABELS
        if (seconds := _number(timings.get(key))) is not None
    ]
    held, replicas, gpus = (
        _number(timings.get(key)) for key in ("gpu_seconds_held", "replicas", "gpus_per_replica")
    )
    if held is not None and replicas is not None and gpus == 0:  # a CPU engine: "0.0 GPU-seconds" read wrong
        replica_seconds = _number(timings.get("replica_seconds_held"))
        held_for = f", {replica_seconds:,.1f} replica-seconds" if replica_seconds is not None else ""
        shown.append(f"no GPU held ({replicas:g} CPU replica{'' if replicas == 1 else 's'}{held_for})")
    elif held is not None and replicas is not None and gpus is not None:
        each = f"{replicas:g} replica{'' if replicas == 1 else 's'} x {gpus:g} GPU{'s' if gpus > 1 else ''}"
        shown.append(f"{held:,.1f} GPU-seconds held ({each})")
    return "; ".join(shown) or None


def describe_engine_pool(pool: JsonValue) -> str | None:
    """One line saying whether the run found its engines warm, e.g. ``engine pool 8f26a2bb2cf787aa: 1 of
    1 replicas warm, kept warm 300 s after the job``; None for a run on its own engines.

    Why in the task log: a date that ran cold when the one before had left a pool warm (the pool's
    fingerprint changed with the engine settings, the model or the provider's version) was only found
    by opening the manifest.
    """
    if not isinstance(pool, dict):
        return None
    warm, replicas = _number(pool.get("warm_replicas")), _number(pool.get("replicas"))
    if warm is None or replicas is None:
        return None
    line = f"engine pool {pool.get('fingerprint', '?')}: {warm:g} of {replicas:g} replicas warm"
    builds = [
        seconds
        for timing in pool.get("replica_timings") or []
        if isinstance(timing, dict)
        if (seconds := _number(timing.get("engine_build_seconds"))) is not None
    ]
    if warm == 0:  # the build this job paid for is in engine_pool, not in its timings
        line += f" (started cold, engine built in {max(builds):.1f} s)" if builds else " (started cold)"
    if (keep := _number(pool.get("keep_warm_seconds"))) is not None:
        line += f", kept warm {keep:g} s after the job"
    return line


def describe_progress(progress: JsonObject) -> str:
    """One line for the task log, e.g.
    ``1,200 / 5,000 rows (24.0%), 35.1 rows/s, 210 output tokens/s, ETA 1m48s``.

    Rates count only this run's rows (not those resumed from an earlier try) over this run's time. The
    ETA is at the engines' own rate since they took their first row (``generating_seconds``, from
    pipeline/reporting/progress.py); until then the line says the engines are starting.
    """
    done, total = int(progress["rows_done"]), int(progress["rows_total"])
    resumed, elapsed = int(progress.get("rows_resumed", 0)), float(progress["elapsed_seconds"])
    share = f" ({100 * done / total:.1f}%)" if total else ""
    line = f"{done:,} / {total:,} rows{share}"
    if elapsed <= 0:
        return line
    rows_per_second = (done - resumed) / elapsed
    tokens_per_second = float(progress.get("tokens_out", 0)) / elapsed
    line += f", {rows_per_second:.1f} rows/s, {tokens_per_second:,.0f} output tokens/s"
    if "generating_seconds" in progress:  # a job that says when its engines began: the ETA is at their rate
        generating, generated = (
            _number(progress["generating_seconds"]),
            int(progress.get("rows_generated") or 0),
        )
        if generating is None or generated == 0:
            return line + (", engines starting" if total > done else "")
        rows_per_second = generated / max(generating, 1.0)
        line += f" ({rows_per_second:.1f} rows/s while generating)"  # the rate above counts the start-up
    if rows_per_second > 0 and total > done:
        line += f", ETA {_duration((total - done) / rows_per_second)}"
    return line


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
