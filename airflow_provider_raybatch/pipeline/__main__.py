"""Entry point of the Ray job: ``python -m airflow_provider_raybatch.pipeline --spec '<json>'``."""

from __future__ import annotations

import argparse
import os
import sys

from airflow_provider_raybatch.specs import BatchInferenceSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_raybatch.pipeline")
    parser.add_argument("--spec", required=True, help="BatchInferenceSpec as JSON (model_dump_json).")
    args = parser.parse_args(argv)
    spec = BatchInferenceSpec.from_json(args.spec)

    from airflow_provider_raybatch.pipeline.run import run_batch  # heavy: Ray Data and vLLM

    run_batch(spec)
    return 0


if __name__ == "__main__":
    code = main()
    # The manifest is committed and printed: skip the interpreter's teardown of torch, vLLM and Ray
    # (2-6 s before Ray marks the job finished, and the Airflow task with it).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
