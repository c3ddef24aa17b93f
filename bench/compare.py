"""Raw vLLM (a) against our pipeline as a Ray job (b) on the same batch; optionally the Airflow overhead.

(a) bench/raw_vllm.py in a plain process of the Ray env: ``LLM.generate`` on the rows' token ids.
(b) ``RayLLMBatchOperator(...).execute()`` up to its deferral, against a local Ray head: the operator
    itself builds the spec, zips and uploads the packages and submits the job, exactly as in a DAG.
    The bench then polls the job (0.5 s) and watches the staged part sidecars appear.
Both read the same spec (model, engine_kwargs, sampling_params, prompts); bench/phases.py says how
each phase is measured.
(c) ``--airflow``: the example DAG through ``airflow dags test`` (deferrable path) on the tiny model;
    task-instance start/end from the Airflow DB against the Ray job's start/end (bench/airflow_dag.py).

usage (under the Ray lock; bench/run_cpu.sh does that):
  .venvs/airflow/bin/python bench/compare.py [--n 384] [--airflow] [--out bench/results/cpu_compare.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import phases  # noqa: E402
import workload  # noqa: E402
from cluster import LocalCluster  # noqa: E402

RAY_PYTHON = ROOT / ".venvs" / "ray" / "bin" / "python"


def log(message: str) -> None:
    print(f"[bench {datetime.now():%H:%M:%S}] {message}", flush=True)


def git_state() -> str:
    """The commit the tree is on, and whether it has uncommitted changes (other people's, too)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    changed = len(git("status", "--porcelain").splitlines())
    return f"{git('rev-parse', '--short', 'HEAD')}" + (f" + {changed} uncommitted paths" if changed else "")


def machine() -> dict[str, Any]:  # Any: JSON values.
    with open("/proc/cpuinfo") as cpuinfo:
        names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "cpu_model": names[0] if names else "",
        "mem_gib": round(mem_gib, 1),
        "kernel": platform.release(),
    }


def run_raw(spec_file: Path, out_dir: Path, log_file: Path) -> dict[str, Any]:  # Any: JSON values.
    log("(a) raw vLLM: starting")
    load_before = os.getloadavg()[0]
    t_launch = time.time()
    with log_file.open("w") as stream:
        subprocess.run(
            [str(RAY_PYTHON), str(ROOT / "bench" / "raw_vllm.py"), str(spec_file), str(out_dir)],
            stdout=stream,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=900,
        )
    t_exit = time.time()
    result = phases.raw_result(json.loads((out_dir / "raw_result.json").read_text()), t_launch, t_exit)
    result.update(
        load_avg_1m_before=load_before,
        load_avg_1m_after=os.getloadavg()[0],
        omp_binding=phases.omp_binding(log_file.read_text()),
    )
    log(f"(a) done: {result['end_to_end_s']:.1f} s end to end, {result['generating_s']:.1f} s generating")
    return result


class FakeTI:
    """The task-instance attributes RayLLMBatchOperator.execute reads."""

    def __init__(self, dag_id: str, run_id: str, task_id: str) -> None:
        self.dag_id, self.run_id, self.task_id = dag_id, run_id, task_id
        self.map_index, self.try_number = -1, 1
        self.xcoms: dict[str, Any] = {}  # Any: XCom values.

    def xcom_push(self, key: str, value: Any) -> None:  # Any: XCom values.
        self.xcoms[key] = value


def _time_hook_calls(calls: list[tuple[str, float]]) -> None:
    """Record every Jobs API call RayHook makes (method, path, seconds): where execute() spends its time."""
    from airflow_provider_raybatch.hooks.ray import RayHook

    send = RayHook._send

    def timed(self: RayHook, request: Any) -> Any:  # Any: the hook's private request type.
        t0 = time.perf_counter()
        try:
            return send(self, request)
        finally:
            calls.append((f"{request.method} {request.path[:40]}", round(time.perf_counter() - t0, 3)))

    RayHook._send = timed  # type: ignore[method-assign]


def run_ours(
    cluster: LocalCluster, op_kwargs: dict[str, Any], out_dir: Path, run_id: str
) -> dict[str, Any]:  # Any
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
    from airflow_provider_raybatch.shared.job_ids import TaskTry
    from airflow_provider_raybatch.shared.manifest import manifest_from_log

    log("(b) our pipeline: submitting through RayLLMBatchOperator.execute")
    operator = RayLLMBatchOperator(task_id="generate", **op_kwargs)
    ti = FakeTI("bench_compare", run_id, "generate")
    staging = (
        Path(op_kwargs["output_uri"])
        / "_staging"
        / TaskTry(ti.dag_id, ti.run_id, ti.task_id, -1, 1).run_key()
    )
    calls: list[tuple[str, float]] = []
    _time_hook_calls(calls)
    load_before = os.getloadavg()[0]
    t_submit = time.time()
    try:
        operator.execute({"ti": ti})
        raise RuntimeError("the operator did not defer")
    except TaskDeferred:
        pass
    t_deferred = time.time()
    execute_calls = list(calls)
    hook = operator.hook
    parts = phases.watch_parts(lambda: hook.get_job_status(operator.job_id).is_terminal, staging)
    info = hook.get_job_info(operator.job_id)
    logs = hook.get_job_logs(operator.job_id)
    (out_dir / "job.log").write_text(logs)
    if info.status.value != "SUCCEEDED":
        raise RuntimeError(f"job {operator.job_id} {info.status.value}: {info.message}\n{logs[-3000:]}")
    tasks = phases.creation_tasks(cluster.address, cluster.auth_headers())
    (out_dir / "actor_creation_tasks.json").write_text(json.dumps(tasks, indent=1))
    result = phases.ours_result(
        t_submit=t_submit,
        t_submitted=t_deferred,
        job_start=info.start_time_ms / 1000,
        job_end=info.end_time_ms / 1000,
        manifest=manifest_from_log(logs),
        manifest_mtime=(Path(op_kwargs["output_uri"]) / "manifest.json").stat().st_mtime,
        logs=logs,
        tasks=tasks,
        parts=parts,
    )
    result.update(
        job_id=operator.job_id,
        execute_api_calls=execute_calls,
        load_avg_1m_before=load_before,
        load_avg_1m_after=os.getloadavg()[0],
        omp_binding=phases.omp_binding(logs),
    )
    generating = result.get("generating_s", 0)
    log(f"(b) done: {result['end_to_end_s']:.1f} s end to end, {generating:.1f} s generating")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--state", type=Path, default=Path("/tmp/raybatch-bench"), help="models, data, cluster"
    )
    parser.add_argument("--n", type=int, default=384, help="requests")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--skip-raw", action="store_true")
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--airflow", action="store_true", help="also run the example DAG (airflow dags test)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu_compare.json")
    args = parser.parse_args()

    state = args.state
    model = state / f"llama-h{args.hidden}-l{args.layers}"
    subprocess.run(
        [
            str(RAY_PYTHON),
            str(ROOT / "bench" / "make_model.py"),
            str(model),
            "--hidden",
            str(args.hidden),
            "--layers",
            str(args.layers),
            "--heads",
            str(args.hidden // 64),
            "--intermediate",
            str(args.hidden * 11 // 4),
        ],
        check=True,
    )
    vocab_words = json.loads((model / "config.json").read_text())["vocab_size"] - 2
    prompts = workload.write_prompts(
        state / "data" / f"prompts-{args.n}x{args.prompt_tokens}.jsonl",
        args.n,
        args.prompt_tokens,
        vocab_words,
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    run_dir = state / "runs" / stamp
    run_dir.mkdir(parents=True)
    op_kwargs = workload.operator_kwargs(
        str(model),
        str(prompts),
        str(run_dir / "ours_output"),
        args.max_tokens,
        workload.CPU_ENGINE_KWARGS,
        args.batch_size,
        {"CPU": 1},
    )

    from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

    spec = RayLLMBatchOperator(task_id="generate", **op_kwargs).build_spec()
    spec_file = run_dir / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    report: dict[str, Any] = {  # Any: JSON values.
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": " ".join(sys.argv),
        "git": git_state(),
        "workload": {
            "requests": args.n,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "model": model.name,
            "model_config": json.loads((model / "config.json").read_text()),
        },
        "spec": json.loads(spec.model_dump_json()),
    }

    raw = None if args.skip_raw else run_raw(spec_file, run_dir / "raw_output", run_dir / "raw.log")
    report["a_raw_vllm"] = raw
    ours = None
    if not args.skip_ours or args.airflow:
        with LocalCluster(state / "ray") as cluster:
            os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = cluster.connection_json()
            if not args.skip_ours:
                ours = report["b_ours_ray_job"] = run_ours(
                    cluster, op_kwargs, run_dir, run_id=f"bench__{stamp}"
                )
            if args.airflow:
                import airflow_dag

                report["c_airflow"] = airflow_dag.run(cluster, state, run_dir)
    if raw and ours:
        report["ratios_b_over_a"] = phases.ratios(raw, ours)
    report["table"] = phases.table(
        raw, ours, (("load average (1 min) before", "load_avg_1m_before", "{:.2f}"),)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print("\n" + report["table"])
    if "c_airflow" in report:
        print("\n" + report["c_airflow"]["table"])
    print(f"\nJSON: {args.out}\nlogs: {run_dir}")


if __name__ == "__main__":
    main()
