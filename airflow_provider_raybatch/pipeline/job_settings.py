"""Whole-number settings a job reads from its environment (``RAYBATCH_*``), all by one rule.

They tune the cluster side (how often a replica restarts, when rows are kept for a retry, how many ids
the driver scans) and reach the job through its runtime env. A value that is not a whole number in
range fails the job, naming the setting (``run.run_batch`` reads them all before any row), rather
than being ignored (the job would then run with a setting its author did not ask for) or raising a
bare ``ValueError`` from ``int()``.
"""

from __future__ import annotations

import os


def whole_number(name: str, default: int, maximum: int) -> int:
    """The job environment's ``name``, a whole number from 0 to ``maximum``; ``default`` if unset or blank.

    :raises ValueError: naming ``name`` and the range, for anything else (a sign, a fraction, words).
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or len(value) > len(str(maximum)) or int(value) > maximum:
        raise ValueError(f"{name}={value[:40]!r}: give a whole number from 0 to {maximum}")
    return int(value)
