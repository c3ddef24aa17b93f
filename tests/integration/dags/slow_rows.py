"""A preprocess that takes its time: a read long enough to show what a job does while it reads."""

from __future__ import annotations

import time

#: Seconds each row's preprocess waits.
SECONDS_PER_ROW = 0.5


def prepare_slowly(row: dict) -> dict:
    time.sleep(SECONDS_PER_ROW)
    return row
