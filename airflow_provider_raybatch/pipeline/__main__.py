"""Entry point of the Ray job: ``python -m airflow_provider_raybatch.pipeline --spec-fingerprint <fp>``.

The spec itself travels in the job package (``raybatch_job/spec.json``, shared/packaging.py), which
Ray puts on the driver's path: as the entrypoint's argument, a spec past 128 KiB (a long system
prompt, a large JSON schema) could not start (``[Errno 7] Argument list too long``). The entrypoint
names the spec's fingerprint, so the Ray dashboard still tells one batch's jobs from another's, and
the job checks that the package it found holds that spec.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from airflow_provider_raybatch.pipeline.job_log import log_to_the_job_log, ray_output_on_its_own_lines
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
