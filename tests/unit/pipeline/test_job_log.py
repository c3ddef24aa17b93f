"""The pipeline's log lines reach the job's log (pipeline/job_log.py): INFO and above, on stderr; no
record starts a line of it but its first."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_raybatch.pipeline.job_log import log_to_the_job_log
from airflow_provider_raybatch.shared.manifest import manifest_from_log, progress_from_log


def test_info_lines_of_the_pipeline_reach_stderr_once(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("airflow_provider_raybatch")
    before = (list(logger.handlers), logger.level, logger.propagate)
    root_handler = logging.StreamHandler()  # a handler someone else configured: no second copy there
    logging.getLogger().addHandler(root_handler)
    handler = log_to_the_job_log()
    try:
        logging.getLogger("airflow_provider_raybatch.pipeline").info(
            "Took the %d rows an earlier try kept", 7
        )
        logging.getLogger("airflow_provider_raybatch.pipeline").debug("not shown")
        err = capsys.readouterr().err
    finally:
        logger.removeHandler(handler)
        logging.getLogger().removeHandler(root_handler)
        logger.handlers[:], logger.level, logger.propagate = before[0], before[1], before[2]
    assert err.count("Took the 7 rows an earlier try kept") == 1, err
    assert "INFO airflow_provider_raybatch.pipeline -- Took the 7 rows" in err
    assert "not shown" not in err


def test_a_text_a_record_quotes_cannot_start_a_marker_line(capsys: pytest.CaptureFixture[str]) -> None:
    # A planted file name in a warning, or in an exception's message, carried the task's markers.
    planted = (
        'x\nRAYBATCH_PROGRESS_JSON={"rows_done": 999999}\nRAYBATCH_MANIFEST_JSON={"job_id": "j"}\n.parquet'
    )
    logger = logging.getLogger("airflow_provider_raybatch")
    before = (list(logger.handlers), logger.level, logger.propagate)
    handler = log_to_the_job_log()
    try:
        logging.getLogger("airflow_provider_raybatch.pipeline").warning("Ignoring %s", planted)
        try:
            raise ValueError(planted)
        except ValueError:
            logging.getLogger("airflow_provider_raybatch.pipeline").exception("The job failed.")
        err = capsys.readouterr().err
    finally:
        logger.removeHandler(handler)
        logger.handlers[:], logger.level, logger.propagate = before[0], before[1], before[2]
    assert err.count("RAYBATCH_PROGRESS_JSON=") == 2  # the warning's, and the traceback's last line
    assert progress_from_log(err) is None and manifest_from_log(err) is None
    assert "\n\tTraceback (most recent call last):" in err  # the traceback still reads as one


_PROGRESS_BAR = """
import contextlib, io, json, logging
import ray._private.worker as ray_worker
from ray.experimental.tqdm_ray import RAY_TQDM_MAGIC
from airflow_provider_raybatch.pipeline.job_log import ray_output_on_its_own_lines
ray_output_on_its_own_lines()
forged = 'r\\nRAYBATCH_PROGRESS_JSON={"rows_done": 999}\\nRAYBATCH_MANIFEST_JSON={"job_id": "j"}\\n'
state = {"__magic_token__": RAY_TQDM_MAGIC, "x": 0, "pos": 0, "total": 10, "unit": "it", "ip": "1.2.3.4",
         "pid": 42, "uuid": "u1", "closed": False, "desc": forged}
err = io.StringIO()
with contextlib.redirect_stderr(err):
    ray_worker.process_tqdm(json.dumps(state))
    # An error any task may push to every driver (ray._private.utils.push_error_to_driver), and the
    # autoscaler's error any job may write to the key-value store.
    ray_worker.print_to_stdstream(
        {"lines": [forged], "pid": "raylet", "ip": "1.2.3.4", "localhost": "1.2.3.4", "is_err": True}, False
    )
    logging.getLogger(ray_worker.__name__).addHandler(logging.StreamHandler())
    logging.getLogger(ray_worker.__name__).warning(forged)
# RAY_DISABLE_WORKER_LOG_PREFIX (set below, as a job's environment may) no longer drops workers' prefix.
import ray._private.ray_constants as ray_constants
ray_constants.RAY_DISABLE_WORKER_LOG_PREFIX = True
dropped = getattr(ray_worker, "_should_ignore_worker_log_prefix", lambda worker: False)(None)  # Ray 2.58 on
print(json.dumps({"err": err.getvalue(), "prefix_dropped": dropped}))
"""


def test_what_ray_prints_for_others_cannot_start_a_marker_line() -> None:
    # The driver draws a worker's line holding Ray's progress-bar token as a bar, its description as
    # it is (a row's text with line breaks, logged by a worker, started forged marker lines); it prints
    # an error pushed to drivers, and the autoscaler's error, with their line breaks.
    from tests.unit.pipeline.ray_env import run_in_ray_env

    out = run_in_ray_env(_PROGRESS_BAR)
    err = out["err"]

    assert err.count("RAYBATCH_PROGRESS_JSON=") >= 3  # drawn and printed, never at a line's start
    assert progress_from_log(err) is None and manifest_from_log(err) is None
    assert out["prefix_dropped"] is False  # a worker's line keeps its "(pid=...)" prefix
