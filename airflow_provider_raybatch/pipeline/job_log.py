"""The job's log: what the driver prints to its stderr, which Ray keeps as the job's log (shown in the
Airflow task's log and the dashboard), and what keeps anyone else's text from starting a line of it.

The Airflow task takes its progress and result from lines that start with their markers
(:mod:`..shared.manifest`), which only this driver prints: each record's later lines, and each line
Ray prints here for workers and other jobs, start with a tab.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys


class _OneLineStart(logging.Formatter):
    """Each later line of a record (a traceback's, or a line break in a text the record quotes: a
    planted file name, an exception's message) starts with a tab, so that no record can start a line
    of the job's log: the Airflow task takes its progress and result from lines that start with their
    markers (:mod:`..shared.manifest`), which this driver prints itself."""

    def format(self, record: logging.LogRecord) -> str:
        return _indented(super().format(record))


def ray_output_on_its_own_lines() -> None:
    """Keep what Ray prints in this driver for others from starting a line of the job's log.

    The Airflow task takes its progress and result from lines that start with their markers, which
    this driver prints itself (:mod:`..shared.manifest`). Ray prints in the driver what workers and
    other jobs' tasks send it:

    - a worker's log line is printed after a ``(pid=...)`` prefix, but an error pushed to drivers
      (``ray._private.utils.push_error_to_driver``: any task of any job may push one to every
      driver) is printed as one "line" with its line breaks, the prefix before the first only;
    - a line holding Ray's progress-bar token is drawn as a bar, its description as it is (a worker
      logging a row's text with line breaks, then such a line, drew forged marker lines);
    - the autoscaler's error, read from the key-value store any job may write, is logged as it is;
    - a worker's line is printed without its prefix where the job's environment asks Ray so
      (``RAY_DISABLE_WORKER_LOG_PREFIX``, a logging config): any worker line could then be a marker.

    So each line Ray is given to print has its later lines start with a tab, each text of a bar's
    state is one line, the driver's Ray logger indents its records' later lines, and workers' lines
    keep their prefix (``ray._private.worker``'s ``print_to_stdstream`` and ``process_tqdm``, checked
    at start in :mod:`.generate.ray_internals`; ``_should_ignore_worker_log_prefix`` where Ray has it:
    Ray 2.57 drops the prefix only for a logging config, which this driver never sets). Called before
    ``ray.init``, which starts the listeners.
    """
    import ray._private.worker as ray_worker

    draw, print_lines = ray_worker.process_tqdm, ray_worker.print_to_stdstream

    def draw_on_one_line(line: str) -> None:
        try:
            state = json.loads(line)
        except ValueError:
            state = None
        if isinstance(state, dict):
            line = json.dumps(
                {key: _one_line(value) if isinstance(value, str) else value for key, value in state.items()}
            )
        draw(line)

    def print_each_on_its_own_lines(data: dict[str, object], ignore_prefix: bool) -> None:
        lines = data.get("lines")
        if isinstance(lines, list):
            data = {**data, "lines": [_indented(line) if isinstance(line, str) else line for line in lines]}
        print_lines(data, ignore_prefix)

    ray_worker.process_tqdm = draw_on_one_line
    ray_worker.print_to_stdstream = print_each_on_its_own_lines
    if hasattr(ray_worker, "_should_ignore_worker_log_prefix"):  # Ray 2.58 on: the variable may drop it
        ray_worker._should_ignore_worker_log_prefix = lambda worker: False
    logging.getLogger(ray_worker.__name__).addFilter(_IndentedRecord())


class _IndentedRecord(logging.Filter):
    """A record's later lines start with a tab (its message made once, arguments and all)."""

    def filter(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):  # a record whose arguments do not format is left as it is
            record.msg, record.args = _indented(record.getMessage()), None
        return True


def _indented(text: str) -> str:
    return text.replace("\n", "\n\t")


def _one_line(text: str) -> str:
    return "".join(" " if not character.isprintable() else character for character in text)


def log_to_the_job_log() -> logging.Handler:
    """Send the pipeline's INFO lines to the driver's stderr, which Ray keeps as the job's log (shown in
    the Airflow task's log and the dashboard). Without a handler, Python prints WARNING and above
    only, so lines such as "Read 2000000 rows ...; 1006417 staged by an earlier try" never showed."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineStart("%(asctime)s\t%(levelname)s %(name)s -- %(message)s"))
    logger = logging.getLogger("airflow_provider_raybatch")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # not again through a handler someone put on the root logger
    return handler
