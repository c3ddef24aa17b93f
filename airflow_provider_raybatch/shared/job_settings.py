"""Whole-number settings a job reads from its environment (``RAYBATCH_*``), all by one rule.

They tune the cluster side (how often a replica restarts, when rows are kept for a retry, how many ids
the driver scans) and reach the job through its runtime env. A value that is not a whole number in
range fails the job, naming the setting (``run.run_batch`` reads them all before any row), rather
than being ignored (the job would then run with a setting its author did not ask for) or raising a
bare ``ValueError`` from ``int()``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from airflow_provider_raybatch.shared.json_types import ArgValue

#: Every such setting, with the largest value it takes. The modules that read one pass its maximum
#: here (tests/unit/pipeline/test_job_settings.py keeps them in step); the operator checks those a DAG
#: sets in its ``runtime_env`` before it submits (:func:`check_env_vars`), and the job again as it
#: starts. None is read by an engine: a warm pool leaves them out of its fingerprint (engine_pool.py).
MAXIMA: dict[str, int] = {
    "RAYBATCH_WARM_WORKERS": 64,  # worker_warmup.py
    "RAYBATCH_DRIVER_SCAN_MAX_ROWS": 10_000_000,  # read/dedupe.py
    "RAYBATCH_KEEP_PREPARED_MIN_ROWS": 10**12,  # read/prepared_cache.py
    "RAYBATCH_ENGINE_MAX_RESTARTS": 1000,  # generate/engine.py
}


#: Not a number and not the DAG author's: the operator writes it into every job's runtime env (the
#: Airflow deployment's ``[raybatch] engine_pool_scope``). Being an env var of the job that no engine
#: setting excludes, it is in every warm pool's fingerprint: jobs of two scopes never share a replica.
POOL_SCOPE_ENV = "RAYBATCH_ENGINE_POOL_SCOPE"


def whole_number(name: str, default: int, maximum: int) -> int:
    """The job environment's ``name``, a whole number from 0 to ``maximum``; ``default`` if unset or blank.

    :raises ValueError: naming ``name`` and the range, for anything else (a sign, a fraction, words).
    """
    return _parsed(name, os.environ.get(name, ""), default, maximum)


def check_env_vars(env_vars: Mapping[str, ArgValue]) -> None:
    """Refuse, before a job is submitted, a value of :data:`MAXIMA`'s settings that the job would refuse.

    :raises ValueError: naming the setting and the range.
    """
    for name, maximum in MAXIMA.items():
        if name in env_vars:
            value = env_vars[name]
            if not isinstance(value, str):  # Ray's env_vars are text
                raise ValueError(f"{name}={value!r}: give it as text, a whole number from 0 to {maximum}")
            _parsed(name, value, 0, maximum)


def _parsed(name: str, value: str, default: int, maximum: int) -> int:
    value = value.strip()
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or len(value) > len(str(maximum)) or int(value) > maximum:
        raise ValueError(f"{name}={value[:40]!r}: give a whole number from 0 to {maximum}")
    return int(value)
