"""The pipeline's log lines reach the job's log (pipeline/__main__.py): INFO and above, on stderr."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_raybatch.pipeline.__main__ import log_to_the_job_log


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
