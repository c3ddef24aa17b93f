"""Write the GPU benchmark's Ray job submissions, built by the operator itself (here, in the Airflow env).

The device has no Airflow, so the operator cannot run there. This runs ``RayLLMBatchOperator`` here:
``build_spec`` (after the same JSON handling as in a DAG), ``entrypoint``, ``_runtime_env`` (with an
upload stub that records the packages instead of uploading them) and the job metadata, and writes
the exact body ``RayHook.submit_job`` would POST, plus the folders the code packages were zipped
from and the bytes of the generated ones (the ``raybatch_job`` package holding the spec, which the
entrypoint names by fingerprint). bench/gpu/ours_job.py on the device zips the folders again with the
same functions (``job_shipping.module_packages``: content-addressed, so the same tree gives the same gcs://
URI), uploads them and the generated packages, and POSTs the body through the same Jobs REST API the
hook uses.

Jobs:
  ours-2000, ours-2000-warm, ours-20000, scale-2   the random-words workload (bench/workload.py) on the
                                                   8B-shaped model with the word tokenizer (sections 5, 6)
  ours-2000-pool0        ours-2000 on a warm pool of keep_warm_seconds=0 (engines asked for first)
  backfill-d1..d7        issue 20: 2,000 of those requests a date on a warm pool (section 9)
  backfill-d2-nowarm..d7-nowarm
                         the same dates with RAYBATCH_WARM_WORKERS=0 (section 13)
  pool1-cold, pool1-warm, pool2-cold, pool2-warm
                         issue 23: 20,000 of them on a warm pool of one replica and of two (section 10)
  pool1-warm-nowarm, pool2-warm-nowarm
                         the same warm job with RAYBATCH_WARM_WORKERS=0 (issue 20's warm start, section 13)
  scale-2m-small         issue 19 item 1: the seeds' customers CSV shape, 2,000,000 rows in ONE file,
                         the example DAG's company-industry prompt with its ``choice`` constraint, on a
                         small dummy-weight Llama (bench/gpu/make_model.py --shape small --tokenizer bpe)
  scale-200k-8b          the same on 200,000 rows with the Llama-3.1-8B shape (--shape 8b --tokenizer bpe)
  scale-2m-small-resume  issue 19 item 5: scale-2m-small's spec into its own output folder, plus a
                         ``rerun`` body (try 2: same run key, a new submission id) for after the kill
  rpg-100k-x1..x4, rpg-200k-x1..x4
                         issue 48: the scale-200k-8b shape (100,000 or 200,000 rows) with 1 to 4 engine
                         replicas on ONE GPU, vLLM's periodic stats lines on (raw: a:rpg-*-x1)
  rpg-100k-default, rpg-200k-default
                         the same with the operator's default layout (no concurrency, replica_resources
                         or GPU memory settings: pipeline/generate/default_layout.py chooses; RESULTS 18c)
  rpg-200k-default-pool0 the same on a warm pool of keep_warm_seconds=0 (engines asked for first)
  rt-2000-x1, rt-2000-x2 issue 48: the random-words workload, 2,000 requests, 1 and 2 replicas on one GPU,
                         stats lines on
  images-100k            issue 19 item 6: 100,000 generated images (bench/gpu/make_images.py, run_gpu.sh's
                         "images" stage) captioned by the tiny VLM (scripts/make_tiny_vlm.py), four
                         replicas on the one GPU, as the image-captions example DAG asks

usage: .venvs/airflow/bin/python bench/gpu/make_submissions.py [NAME ... | all]
       (no names: the scale jobs)      -> bench/gpu/jobs/NAME.json
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import workload  # noqa: E402

from airflow_provider_raybatch.jobs import job_shipping  # noqa: E402
from airflow_provider_raybatch.jobs.deployment_secret import signing_key  # noqa: E402
from airflow_provider_raybatch.jobs.job_shipping import FINGERPRINT_KEY  # noqa: E402
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator  # noqa: E402
from airflow_provider_raybatch.shared.job_ids import TaskTry  # noqa: E402
from airflow_provider_raybatch.shared.packaging import RayPackage  # noqa: E402

MODEL = "/tmp/llama8b_dummy"  # bench/gpu/make_model.py writes it there (the shared recipe's path)
DATA = "/tmp/gpu_data"
OUT = "/tmp/gpu_out"
PROMPT_TOKENS, MAX_TOKENS = 128, 128
VOCAB_WORDS = 128000  # w0 .. w127999; 128000/128001 are bos/eos (as bench_vllm.py's random ids)
BATCH_SIZE = 64  # the operator's default

# The scale jobs (issue 19): run_gpu.sh's "install" writes these models and the "data" stage the CSVs.
SMALL_MODEL = "/tmp/llama_small_bpe"  # make_model.py --shape small --tokenizer bpe
BIG_MODEL = "/tmp/llama8b_bpe"  # make_model.py --shape 8b --tokenizer bpe
SCALE_BATCH_SIZE = 256
#: The engine arguments of the scale jobs, raw vLLM's too: max_num_seqs / max_num_batched_tokens are left
#: unset, so the replica gets vLLM's LLM() defaults for them (pipeline/generate/engine.py), as raw LLM() does.
SCALE_ENGINE_KWARGS = {
    "load_format": "dummy",
    "max_model_len": 512,
    "gpu_memory_utilization": 0.9,
    "dtype": "bfloat16",
    "seed": 0,
}
SYSTEM_PROMPT = "You classify companies by industry. Answer with the label only."
USER_TEMPLATE = "What industry is this company in: {Company}"


def industries() -> list[str]:
    """The example DAG's labels (dags/daily_company_industry.py), read from the DAG file itself."""
    spec = importlib.util.spec_from_file_location(
        "daily_company_industry", ROOT / "dags" / "daily_company_industry.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.INDUSTRIES)


def customers_csv(rows: int) -> str:
    """The one CSV file of run_gpu.sh's "data" stage (make_sample_customers.write_customer_files)."""
    return f"{DATA}/customers-{rows}/customers-0000.csv"


class _RecordingHook:
    """Stands in for RayHook.upload_package: records what the operator would upload."""

    def __init__(self) -> None:
        self.packages: list[RayPackage] = []

    def upload_package(self, package: RayPackage) -> str:
        self.packages.append(package)
        return package.uri


def _body(
    operator: RayLLMBatchOperator, spec: Any, task_try: TaskTry, runtime_env: dict[str, Any]
) -> dict[str, Any]:  # Any: JSON.
    """What RayHook.submit_job would POST to /api/jobs/ (entrypoint_resources unset: dropped)."""
    return {
        "entrypoint": operator.entrypoint(spec),
        "submission_id": task_try.submission_id(signing_key("bench-gpu")),  # no Airflow here: a fixed key
        "runtime_env": runtime_env,
        "metadata": {**task_try.metadata(), FINGERPRINT_KEY: spec.fingerprint()},
    }


def _job(
    name: str, kwargs: dict[str, Any], extra: dict[str, Any], rerun: bool = False
) -> dict[str, Any]:  # Any: JSON.
    operator = RayLLMBatchOperator(task_id="generate", **kwargs)
    task_try = TaskTry("bench_gpu", f"bench__{name}", "generate", -1, 1)
    spec = operator.build_spec(run_key=task_try.run_key())
    recorder = _RecordingHook()
    runtime_env = operator._runtime_env(recorder, spec)  # type: ignore[arg-type]
    paths = operator._local_modules(spec)
    path_uris = {package.uri for package in job_shipping.module_packages(spec)}  # as the operator zips them
    job = {
        "name": name,
        **extra,
        "spec": json.loads(spec.model_dump_json()),
        "body": _body(operator, spec, task_try, runtime_env),
        # Zipped again on the device from its own tree (what the body names is replaced by those URIs).
        "package_paths": [str(path.relative_to(ROOT)) for path in paths],
        "package_uris_here": [package.uri for package in recorder.packages],
        # The packages generated per job (the spec's raybatch_job): uploaded byte for byte.
        "generated_packages": [
            {"uri": package.uri, "data_b64": base64.b64encode(package.data).decode()}
            for package in recorder.packages
            if package.uri not in path_uris
        ],
    }
    if rerun:  # Airflow's retry of the same task: try 2, the same run key, so it resumes the staging
        retry = TaskTry("bench_gpu", f"bench__{name}", "generate", -1, 2)
        assert retry.run_key() == spec.run_key
        job["rerun_body"] = _body(operator, spec, retry, runtime_env)
    return job


def submission(
    name: str,
    n: int,
    concurrency: int = 1,
    keep_warm_seconds: float | None = None,
    env_vars: dict[str, str] | None = None,
    replicas_per_gpu: int = 1,
    log_stats: bool = False,
) -> dict[str, Any]:  # Any: JSON values.
    """A job of the random-words workload (sections 5 and 6 of bench/RESULTS.md).

    :param keep_warm_seconds: run on the warm engine pool (the backfill of issue 20, section 9).
    :param env_vars: the job's ``runtime_env`` env vars (e.g. ``RAYBATCH_WARM_WORKERS``).
    :param replicas_per_gpu: ``concurrency`` replicas sharing ONE GPU (a fraction of it each, a KV cache
        of a fixed size each, as scale_submission's), instead of a GPU each (issue 48's curve).
    :param log_stats: vLLM's periodic stats lines on (``disable_log_stats=False``): running / waiting
        requests, throughput, KV cache usage, prefix-cache hit rate (issue 48; raw vLLM reads it too).
    """
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
    if log_stats:
        kwargs["engine_kwargs"]["disable_log_stats"] = False
    if replicas_per_gpu > 1:
        kwargs["concurrency"] = replicas_per_gpu
        kwargs["replica_resources"] = {"GPU": 1 / replicas_per_gpu, "CPU": 1}
        # 256 sequences x (128 + 128) tokens x 128 KiB a token (the 8B shape) = 8 GiB: 12 GiB each.
        kwargs["engine_kwargs"].update(
            gpu_memory_utilization=round(0.8 / replicas_per_gpu, 3), kv_cache_memory_bytes=12 * 2**30
        )
    if keep_warm_seconds is not None:
        kwargs["keep_warm_seconds"] = keep_warm_seconds
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    extra = {
        "requests": n,
        "prompt_tokens": PROMPT_TOKENS,
        "vocab_words": VOCAB_WORDS,
        "replicas_per_gpu": replicas_per_gpu,
    }
    return _job(name, kwargs, extra)


def scale_submission(
    name: str,
    rows: int,
    model: str,
    rerun: bool = False,
    replicas_per_gpu: int = 1,
    input_uri: str | None = None,
    dry_run: bool = False,
    log_stats: bool = False,
    default_layout: bool = False,
    keep_warm_seconds: float | None = None,
) -> dict[str, Any]:  # Any: JSON values.
    """A job of the issue-19 scale workload: the example DAG's operator on the customers CSV.

    :param default_layout: leave the engine layout to the operator's default rule
        (pipeline/generate/default_layout.py): no ``concurrency``, no ``replica_resources``, and no GPU
        memory setting in ``engine_kwargs`` (``replicas_per_gpu`` is then not used).

    :param log_stats: vLLM's periodic stats lines on (``disable_log_stats=False``; the replica's default
        is off, as ``LLM()``'s: pipeline/generate/engine.py); raw vLLM on the same spec gets them too.

    :param replicas_per_gpu: engine replicas sharing the one GPU (a fraction of it each, a KV cache of
        a fixed size each so that their start-ups do not size it from each other's memory): for a small
        model, one replica's process, not the GPU, sets the pace (bench/engine_feed.sh).

    :param keep_warm_seconds: run on a warm engine pool that keeps its replicas this long after the job.
    """
    kwargs = {
        "model": model,
        "input_uri": input_uri or customers_csv(rows),
        "output_uri": f"{OUT}/{name}",
        "input_format": "csv",
        "system_prompt": SYSTEM_PROMPT,
        "user_template": USER_TEMPLATE,
        "sampling_params": {
            "temperature": 0,
            "max_tokens": 16,
            "structured_outputs": {"choice": industries()},
        },
        "engine_kwargs": dict(SCALE_ENGINE_KWARGS),
        "id_column": "Customer Id",
        "keep_columns": ["Company", "Country"],
        "batch_size": SCALE_BATCH_SIZE,
    }
    if log_stats:
        kwargs["engine_kwargs"]["disable_log_stats"] = False
    if keep_warm_seconds is not None:
        kwargs["keep_warm_seconds"] = keep_warm_seconds
    if dry_run:  # issue 19 item 2: the pre-engine path on 20M rows, on the device machine's CPUs
        kwargs.update(dry_run=True, dry_run_rows_per_second=1000.0, max_failed_fraction=1.0)
    if default_layout:
        # SCALE_ENGINE_KWARGS sets gpu_memory_utilization (0.9), one of the settings that make a job's
        # layout its own (default_layout.LAYOUT_ENGINE_KWARGS: the rule would then say "the job's
        # settings" and not choose): dropped here, so the default rule chooses, as for a user who sets none.
        del kwargs["engine_kwargs"]["gpu_memory_utilization"]
    elif replicas_per_gpu > 1:
        kwargs["concurrency"] = replicas_per_gpu
        kwargs["replica_resources"] = {"GPU": 1 / replicas_per_gpu, "CPU": 1}
        kwargs["engine_kwargs"].update(
            gpu_memory_utilization=round(0.8 / replicas_per_gpu, 3), kv_cache_memory_bytes=4 * 2**30
        )
    extra = {
        "requests": rows,
        "workload": "customers",
        "input_rows": rows,
        "replicas_per_gpu": "default" if default_layout else replicas_per_gpu,
    }
    return _job(name, kwargs, extra, rerun=rerun)


TINY_VLM = "/tmp/tiny_vlm"  # scripts/make_tiny_vlm.py, written by run_gpu.sh's "images" stage
IMAGES = 100_000


def image_submission(
    name: str,
    rows: int,
    replicas_per_gpu: int = 4,
    eager: bool = False,
    env_vars: dict[str, str] | None = None,
    skip_mm_profiling: bool = False,
) -> dict[str, Any]:  # Any: JSON.
    """Issue 19 item 6: the image path at the vision seed's scale, as the image-captions example runs it."""
    kwargs: dict[str, Any] = {
        "model": TINY_VLM,
        "input_uri": f"{DATA}/images-{rows}",
        "output_uri": f"{OUT}/{name}",
        "input_format": "parquet",
        "system_prompt": "You write one-sentence image captions.",
        "user_template": "Describe this image in one sentence.",
        "image_column": "image",
        "image_max_side": 224,
        "id_column": "image_id",
        "keep_columns": ["filename"],
        "sampling_params": {"temperature": 0, "max_tokens": 16},
        "engine_kwargs": {
            "max_model_len": 512,
            "dtype": "bfloat16",
            "seed": 0,
            "limit_mm_per_prompt": {"image": 1},
            "gpu_memory_utilization": round(0.8 / replicas_per_gpu, 3),
            "kv_cache_memory_bytes": 2 * 2**30,
            **({"enforce_eager": True} if eager else {}),
        },
        "concurrency": replicas_per_gpu,
        "replica_resources": {"GPU": 1 / replicas_per_gpu, "CPU": 1},
        "batch_size": 64,
        "max_failed_fraction": 0.01,  # 1 in 500 images is broken on purpose (make_images.py)
    }
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    if skip_mm_profiling:
        kwargs["engine_kwargs"]["skip_mm_profiling"] = True
    extra = {"requests": rows, "workload": "images", "input_rows": rows, "replicas_per_gpu": replicas_per_gpu}
    return _job(name, kwargs, extra)


JOBS = {
    # scale-2: the 20,000 requests on two replicas (a two-GPU machine), against ours-20000's one.
    "ours-2000": lambda: submission("ours-2000", 2000, 1),
    "ours-2000-warm": lambda: submission("ours-2000-warm", 2000, 1),
    "ours-20000": lambda: submission("ours-20000", 20000, 1),
    # ours-2000 on a warm pool that keeps nothing warm: its replica asked for at the driver's start
    # (issue 48's single cold job, lever b of RESULTS 19).
    "ours-2000-pool0": lambda: submission("ours-2000-pool0", 2000, 1, 0.0),
    "scale-2": lambda: submission("scale-2", 20000, 2),
    # A 7-date backfill of 2,000 rows a date on one warm engine pool (issue 20; RESULTS section 9).
    **{
        f"backfill-d{day}": functools.partial(submission, f"backfill-d{day}", 2000, 1, 600)
        for day in range(1, 8)
    },
    # The same dates without the driver's warm workers, on the same pool (issue 20's warm start).
    **{
        f"backfill-d{day}-nowarm": functools.partial(
            submission, f"backfill-d{day}-nowarm", 2000, 1, 600, {"RAYBATCH_WARM_WORKERS": "0"}
        )
        for day in range(2, 8)
    },
    # Issue 23: 20,000 requests on a warm pool of one replica, then of two (a two-GPU machine), each
    # cold (the job that builds the pool) and warm (the next job, on the same pool): RESULTS section 10.
    **{
        f"pool{replicas}-{state}": functools.partial(
            submission, f"pool{replicas}-{state}", 20000, replicas, 600
        )
        for replicas in (1, 2)
        for state in ("cold", "warm")
    },
    # A warm job without the driver's warm workers (pipeline/worker_warmup.py), on the same pool: the
    # setting is a job-side one, which the pool's fingerprint leaves out (issue 20's warm start).
    **{
        f"pool{replicas}-warm-nowarm": functools.partial(
            submission, f"pool{replicas}-warm-nowarm", 20000, replicas, 600, {"RAYBATCH_WARM_WORKERS": "0"}
        )
        for replicas in (1, 2)
    },
    "scale-2m-small": lambda: scale_submission("scale-2m-small", 2_000_000, SMALL_MODEL),
    "scale-2m-small-x4": lambda: scale_submission(
        "scale-2m-small-x4", 2_000_000, SMALL_MODEL, replicas_per_gpu=4
    ),
    "scale-200k-8b": lambda: scale_submission("scale-200k-8b", 200_000, BIG_MODEL),
    "scale-200k-small": lambda: scale_submission("scale-200k-small", 200_000, SMALL_MODEL),
    "scale-200k-small-x4": lambda: scale_submission(
        "scale-200k-small-x4", 200_000, SMALL_MODEL, replicas_per_gpu=4
    ),
    "dry-20m": lambda: scale_submission(
        "dry-20m", 20_000_000, SMALL_MODEL, input_uri=f"{DATA}/customers-20000000", dry_run=True
    ),
    "scale-2m-small-resume": lambda: scale_submission(
        "scale-2m-small-resume", 2_000_000, SMALL_MODEL, rerun=True, replicas_per_gpu=4
    ),
    # Issue 48: replicas per GPU on the seeds' shape (the 8B shape, the customers CSV, the `choice`), 1 to
    # 4 on ONE GPU, vLLM's stats lines on; raw vLLM runs the x1 spec (a:rpg-200k-x1). run_gpu.sh "rpg".
    **{
        f"rpg-{rows // 1000}k-x{replicas}": functools.partial(
            scale_submission,
            f"rpg-{rows // 1000}k-x{replicas}",
            rows,
            BIG_MODEL,
            replicas_per_gpu=replicas,
            log_stats=True,
        )
        for rows in (100_000, 200_000)
        for replicas in (1, 2, 3, 4)
    },
    # The same with the operator's default layout (no layout settings: the default rule chooses, and the
    # manifest's `layout` says what; RESULTS 18c). Raw vLLM runs the x1 spec (a:rpg-200k-x1).
    **{
        f"rpg-{rows // 1000}k-default": functools.partial(
            scale_submission,
            f"rpg-{rows // 1000}k-default",
            rows,
            BIG_MODEL,
            log_stats=True,
            default_layout=True,
        )
        for rows in (100_000, 200_000)
    },
    # rpg-200k-default on a warm pool that keeps nothing warm (keep_warm_seconds=0): its replicas are
    # asked for at the driver's start and built beside the read, as a pool's are, where a job's own
    # engines start only with the engine dataset (issue 48: RESULTS 19, lever b).
    "rpg-200k-default-pool0": functools.partial(
        scale_submission,
        "rpg-200k-default-pool0",
        200_000,
        BIG_MODEL,
        log_stats=True,
        default_layout=True,
        keep_warm_seconds=0.0,
    ),
    # The same on the random-token bench (2,000 x 128 in / 128 out), 1 and 2 replicas on the one GPU.
    **{
        f"rt-2000-x{replicas}": functools.partial(
            submission, f"rt-2000-x{replicas}", 2000, 1, replicas_per_gpu=replicas, log_stats=True
        )
        for replicas in (1, 2)
    },
    "images-100k": lambda: image_submission("images-100k", IMAGES),
    # The same without compiled or CUDA graphs: images-100k's EngineCores crashed in the vision tower
    # on vLLM 0.25.1 (RESULTS 7f).
    "images-100k-eager": lambda: image_submission("images-100k-eager", IMAGES, eager=True),
    # The same on vLLM's previous GPU model runner: the crash is in the new runner's encoder path
    # (v1/worker/gpu/mm/encoder_runner.py), which VLLM_USE_V2_MODEL_RUNNER=0 leaves out.
    "images-100k-v1": lambda: image_submission(
        "images-100k-v1", IMAGES, env_vars={"VLLM_USE_V2_MODEL_RUNNER": "0"}
    ),
    # Both runners crashed in the vision tower while profiling with dummy images (RESULTS 7f): none.
    "images-100k-sp": lambda: image_submission("images-100k-sp", IMAGES, skip_mm_profiling=True),
}
SCALE_JOBS = (
    "scale-2m-small",
    "scale-2m-small-x4",
    "scale-200k-small",
    "scale-200k-small-x4",
    "scale-200k-8b",
    "scale-2m-small-resume",
    "dry-20m",
    "images-100k",
    "images-100k-eager",
    "images-100k-v1",
    "images-100k-sp",
)


def main() -> None:
    names = sys.argv[1:] or list(SCALE_JOBS)
    if names == ["all"]:
        names = list(JOBS)
    unknown = [name for name in names if name not in JOBS]
    if unknown:
        sys.exit(f"unknown jobs {unknown}; known: {', '.join(JOBS)}")
    jobs = ROOT / "bench" / "gpu" / "jobs"
    jobs.mkdir(exist_ok=True)
    for name in names:
        (jobs / f"{name}.json").write_text(json.dumps(JOBS[name](), indent=1))
        print(f"wrote {jobs / name}.json")


if __name__ == "__main__":
    main()
