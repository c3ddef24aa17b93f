"""Progress of a running batch, printed on the driver log for the trigger to relay to the task log.

The staged parts' sidecars (parts.py) are the truth about what is done: a background thread reads
the ones that appeared since its last look, every ``interval`` seconds, and prints one marked line
(:func:`airflow_provider_raybatch.shared.manifest.progress_log_line`). Reading only new sidecars keeps each
look cheap however long the run.
"""

from __future__ import annotations

import json
import threading
import time

from airflow_provider_raybatch.pipeline import sidecars, storage
from airflow_provider_raybatch.pipeline.reporting.timings import FIRST_ROW_IN_ENGINE_KEY
from airflow_provider_raybatch.shared.json_types import JsonObject
from airflow_provider_raybatch.shared.manifest import progress_log_line

DEFAULT_INTERVAL_SECONDS = 30.0


class ProgressReporter:
    """Print progress of the rows staged under ``parts_uri`` (in the output folder ``within``: on local
    disk no link below it is followed) until stopped."""

    def __init__(
        self,
        parts_uri: str,
        within: str,
        rows_total: int,
        rows_resumed: int,
        interval: float = DEFAULT_INTERVAL_SECONDS,
    ) -> None:
        self.parts_uri = parts_uri
        self.within = within
        self.rows_total = rows_total
        self.rows_resumed = rows_resumed
        self.interval = interval
        self._seen: set[str] = set()
        self._rows_done = 0
        self._rows_generated = 0  # by this run's engines (their parts carry FIRST_ROW_IN_ENGINE_KEY)
        self._generating_since: float | None = None  # epoch seconds: an engine took its first row
        self._tokens_out = 0
        self._tokens_out_before = 0
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raybatch-progress", daemon=True)

    def start(self) -> ProgressReporter:
        self._read_new_parts()
        self._tokens_out_before = self._tokens_out  # rates count this run's work only
        self._rows_generated, self._generating_since = 0, None  # ...and so does the engines' rate
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop, then print the final count."""
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)
        self.report()

    def snapshot(self) -> JsonObject:
        self._read_new_parts()
        since = self._generating_since
        return {
            # A batch whose replica died is staged again (commit keeps one copy of each row): counted
            # by part, its rows would count twice. Capped rather than tracked by source, which would
            # hold every row's source in the driver.
            "rows_done": min(self._rows_done, self.rows_total),
            "rows_total": self.rows_total,
            "rows_resumed": self.rows_resumed,
            "tokens_out": self._tokens_out - self._tokens_out_before,
            "elapsed_seconds": round(time.monotonic() - self._started, 1),
            # The engines' rate, for the ETA: over the job's whole time, a long engine build made the
            # first rows look slow ("ETA 24m26s" 27 s before the end).
            "rows_generated": self._rows_generated,
            "generating_seconds": None if since is None else round(max(time.time() - since, 0.0), 1),
        }

    def report(self) -> None:
        try:
            print(progress_log_line(self.snapshot()), flush=True)
        except Exception as err:  # noqa: BLE001 - progress is a nicety; never fail the batch for it.
            print(f"progress unavailable: {type(err).__name__}: {err}", flush=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def _read_new_parts(self) -> None:
        for path in storage.list_files(self.parts_uri, within=self.within):
            if path in self._seen or not path.endswith(".json"):
                continue
            self._seen.add(path)
            try:
                text = storage.read_bytes(
                    storage.listed_uri(self.parts_uri, path), self.within, _small_sidecar
                )
                sidecar = json.loads(text)
            except (OSError, ValueError):  # gone meanwhile, a link, too large or not JSON
                continue
            if sidecars.sidecar_problem(sidecar):
                continue  # none of ours: the commit refuses it, naming it
            self._rows_done += len(sidecar.get("sources", []))
            first_row_in_engine_at = sidecar.get(FIRST_ROW_IN_ENGINE_KEY)
            if isinstance(first_row_in_engine_at, int | float) and not isinstance(
                first_row_in_engine_at, bool
            ):
                self._rows_generated += len(sidecar.get("sources", []))
                since = self._generating_since
                self._generating_since = (
                    min(since, first_row_in_engine_at) if since else first_row_in_engine_at
                )
            self._tokens_out += int(sidecar.get("tokens_out", 0))


def _small_sidecar(size: int) -> None:
    """Refuse a file too large to be a sidecar of ours, unread (the commit refuses it, naming it)."""
    if size > sidecars.MAX_SIDECAR_BYTES:
        raise ValueError(f"{size:,} bytes: no sidecar of ours")
