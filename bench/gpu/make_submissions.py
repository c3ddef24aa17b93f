"""Write the GPU benchmark's Ray job submissions, built by the operator itself (here, in the Airflow env).

The device has no Airflow, so the operator cannot run there. This runs ``RayLLMBatchOperator`` here:
``build_spec`` (after the same JSON handling as in a DAG), ``entrypoint``, ``_runtime_env`` (with an
upload stub that records the zipped packages instead of uploading them) and the job metadata, and
writes the exact body ``RayHook.submit_job`` would POST, plus the folders the packages were zipped
from. bench/gpu/ours_job.py on the device zips those folders again with the same function
(``build_py_module_package``: content-addressed, so the same tree gives the same gcs:// URI),
uploads them and POSTs the body through the same Jobs REST API the hook uses.

usage: .venvs/airflow/bin/python bench/gpu/make_submissions.py      -> bench/gpu/jobs/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import workload  # noqa: E402

from airflow_provider_raybatch.operators.llm_batch import FINGERPRINT_KEY, RayLLMBatchOperator  # noqa: E402
from airflow_provider_raybatch.utils.deployment_secret import signing_key  # noqa: E402
from airflow_provider_raybatch.utils.job_ids import TaskTry  # noqa: E402
from airflow_provider_raybatch.utils.packaging import RayPackage  # noqa: E402

MODEL = "/tmp/llama8b_dummy"  # bench/gpu/make_model.py writes it there (the shared recipe's path)
DATA = "/tmp/gpu_data"
OUT = "/tmp/gpu_out"
PROMPT_TOKENS, MAX_TOKENS = 128, 128
VOCAB_WORDS = 128000  # w0 .. w127999; 128000/128001 are bos/eos (as bench_vllm.py's random ids)
BATCH_SIZE = 64  # the operator's default


class _RecordingHook:
    """Stands in for RayHook.upload_package: records what the operator would upload."""

    def __init__(self) -> None:
        self.packages: list[RayPackage] = []

    def upload_package(self, package: RayPackage) -> str:
        self.packages.append(package)
        return package.uri


def submission(name: str, n: int, concurrency: int = 1) -> dict[str, Any]:  # Any: JSON values.
    kwargs = workload.operator_kwargs(
        MODEL,
        f"{DATA}/prompts-{n}x{PROMPT_TOKENS}.jsonl",
        f"{OUT}/{name}",
        MAX_TOKENS,
        workload.GPU_ENGINE_KWARGS,
        BATCH_SIZE,
        None,
    )
    kwargs["concurrency"] = concurrency  # an int: the operator's default pool (a fixed pool of n replicas)
    operator = RayLLMBatchOperator(task_id="generate", **kwargs)
    task_try = TaskTry("bench_gpu", f"bench__{name}", "generate", -1, 1)
    spec = operator.build_spec(run_key=task_try.run_key())
    recorder = _RecordingHook()
    runtime_env = operator._runtime_env(recorder, spec)  # type: ignore[arg-type]
    return {
        "name": name,
        "requests": n,
        "prompt_tokens": PROMPT_TOKENS,
        "vocab_words": VOCAB_WORDS,
        "spec": json.loads(spec.model_dump_json()),
        # What RayHook.submit_job would POST to /api/jobs/ (entrypoint_resources unset: dropped).
        "body": {
            "entrypoint": operator.entrypoint(spec),
            "submission_id": task_try.submission_id(signing_key("bench-gpu")),  # no Airflow here: a fixed key
            "runtime_env": runtime_env,
            "metadata": {**task_try.metadata(), FINGERPRINT_KEY: spec.fingerprint()},
        },
        "package_paths": [str(path.relative_to(ROOT)) for path in operator._local_modules(spec)],
        "package_uris_here": [package.uri for package in recorder.packages],
    }


def main() -> None:
    jobs = ROOT / "bench" / "gpu" / "jobs"
    jobs.mkdir(exist_ok=True)
    # scale-2: the 20,000 requests on two replicas (a two-GPU machine), against ours-20000's one.
    for name, n, concurrency in (
        ("ours-2000", 2000, 1),
        ("ours-2000-warm", 2000, 1),
        ("ours-20000", 20000, 1),
        ("scale-2", 20000, 2),
    ):
        (jobs / f"{name}.json").write_text(json.dumps(submission(name, n, concurrency), indent=1))
        print(f"wrote {jobs / name}.json")


if __name__ == "__main__":
    main()
