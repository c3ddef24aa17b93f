"""Entry point of the Ray job: ``python -m airflow_provider_raybatch.pipeline --spec-fingerprint <fp>``.

The spec itself travels in the job package (``raybatch_job/spec.json``, shared/packaging.py), which
Ray puts on the driver's path: as the entrypoint's argument, a spec past 128 KiB (a long system
prompt, a large JSON schema) could not start (``[Errno 7] Argument list too long``). The entrypoint
names the spec's fingerprint, so the Ray dashboard still tells one batch's jobs from another's, and
the job checks that the package it found holds that spec.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys

from airflow_provider_raybatch.shared.exceptions import BatchSpecError, RayBatchRowsFailedError
from airflow_provider_raybatch.shared.packaging import JOB_MODULE, SPEC_FILE, read_job_file
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec


def shipped_spec(fingerprint: str) -> BatchInferenceSpec:
    """The spec in this job's package; raises BatchSpecError when it is missing or not the one named."""
    data = read_job_file(SPEC_FILE)
    if data is None:
        raise BatchSpecError(
            f"No {JOB_MODULE}/{SPEC_FILE} on this job's path: submit it with RayLLMBatchOperator, which "
            f"uploads the {JOB_MODULE} package and names it in the runtime_env's py_modules."
        )
    spec = BatchInferenceSpec.from_json(data.decode())
    if spec.fingerprint() != fingerprint:
        raise BatchSpecError(
            f"The {JOB_MODULE} package on this job's path holds spec {spec.fingerprint()}, but the "
            f"entrypoint names {fingerprint}: another py_module named {JOB_MODULE!r} shadows the job's own."
        )
    return spec


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_raybatch.pipeline")
    parser.add_argument(
        "--spec-fingerprint",
        required=True,
        help=f"BatchInferenceSpec.fingerprint() of {JOB_MODULE}/{SPEC_FILE}.",
    )
    args = parser.parse_args(argv)
    log_to_the_job_log()
    spec = shipped_spec(args.spec_fingerprint)

    import ray

    from airflow_provider_raybatch.pipeline import worker_warmup

    ray_output_on_its_own_lines()  # before ray.init: its log and error listeners start there
    ray.init()
    # The job's worker processes start while this driver imports Ray Data and reads its input.
    warm_workers = worker_warmup.configured_workers(worker_warmup.replicas_of(spec))
    worker_warmup.start(warm_workers)
    logging.getLogger("airflow_provider_raybatch.pipeline").info(
        "Starting %d warm workers for this job (%d cores here; %s sets it).",
        warm_workers,
        os.cpu_count() or 1,
        worker_warmup.WARM_WORKERS_ENV,
    )

    from airflow_provider_raybatch.pipeline.credentials import held_for_this_job
    from airflow_provider_raybatch.pipeline.run import run_batch  # heavy: Ray Data and vLLM

    with held_for_this_job():  # the S3 settings, if any, leave the cluster's store when this ends
        try:
            run_batch(spec)
        except RayBatchRowsFailedError as err:  # the rows' fault, said in full: no traceback to read past
            logging.getLogger("airflow_provider_raybatch.pipeline").error("%s", err)
            return 1
        except Exception:  # through the job log's formatter, not Python's: its lines start no marker line
            logging.getLogger("airflow_provider_raybatch.pipeline").exception("The job failed.")
            return 1
    return 0


if __name__ == "__main__":
    code = main()
    # The manifest is committed and printed: skip the interpreter's teardown of torch, vLLM and Ray
    # (2-6 s before Ray marks the job finished, and the Airflow task with it).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
