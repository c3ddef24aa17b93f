"""Entry point of the Ray job: ``python -m airflow_provider_raybatch.pipeline --spec '<json>'``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading

from airflow_provider_raybatch.specs import BatchInferenceSpec


def _import_in_background(module: str) -> None:
    """Import ``module`` in a daemon thread. A later ``import`` of it waits for this one (the import
    lock) and raises its error, if any, where the module is used."""

    def load() -> None:
        with contextlib.suppress(BaseException):  # the real import later raises it where it matters
            __import__(module)

    threading.Thread(target=load, name=f"import {module}", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_raybatch.pipeline")
    parser.add_argument("--spec", required=True, help="BatchInferenceSpec as JSON (model_dump_json).")
    args = parser.parse_args(argv)
    spec = BatchInferenceSpec.from_json(args.spec)
    # Ray Data LLM imports transformers, torch and vLLM (13-25 s on a GPU node): let that overlap
    # Ray's start-up and the reading and preparing of the rows instead of following them.
    _import_in_background("ray.data.llm")

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
