"""Runs whenever ``daily_support_ticket_summary`` publishes a day's summaries (Asset-scheduled).

Reads the triggering Asset event's extras (output location, counts) and logs a digest; a real
digest would read ``manifest.json`` at ``manifest_uri`` and mail or post the day's summaries.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from airflow.sdk import Asset, dag, task

log = logging.getLogger(__name__)

#: The Asset daily_support_ticket_summary emits (matched by name and URI).
SUPPORT_TICKET_SUMMARIES = Asset(
    name="support_ticket_summaries", uri="s3://my-bucket/raybatch/support_ticket_summaries"
)


@dag(
    schedule=[SUPPORT_TICKET_SUMMARIES],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["raybatch", "example"],
)
def support_summary_digest() -> None:
    @task(multiple_outputs=False)
    def digest(triggering_asset_events: Any = None) -> list[dict[str, Any]]:  # Any: Airflow's event accessor.
        """Log each new day of summaries: where it is and how many tickets it covers."""
        days = []
        for event in triggering_asset_events[SUPPORT_TICKET_SUMMARIES]:
            extra = event.extra
            log.info(
                "summaries at %s: %s tickets summarised, %s failed (manifest %s)",
                extra["output_uri"],
                extra["rows_out"],
                extra["rows_failed"],
                extra["manifest_uri"],
            )
            days.append({"output_uri": extra["output_uri"], "rows_out": extra["rows_out"]})
        return days

    digest()


support_summary_digest()
