"""Peak RSS of the Airflow side: a fresh interpreter running the operator up to its deferral.

Runs tests/unit/test_airflow_footprint.py as a script (its scenario: a tiny fake Jobs API in-process,
``RayLLMBatchOperator.execute`` until it defers) several times, each in a fresh ``.venvs/airflow``
interpreter, and reports ``ru_maxrss`` against two baselines: a bare interpreter that imports
``airflow.sdk``, and one that imports the provider's modules without running anything.
Target: <= 200 MB for the operator run.

usage: .venvs/airflow/bin/python bench/footprint.py [--repeat 5] [--out bench/results/footprint.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venvs" / "airflow" / "bin" / "python"
SCENARIO = ROOT / "tests" / "unit" / "test_airflow_footprint.py"
_RSS = (
    "import json, resource, sys; "
    "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
    "('ray', 'vllm', 'torch', 'transformers', 'pyarrow')); "
    "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
    "print('FOOTPRINT_REPORT=' + json.dumps("
    "{'ru_maxrss_kib': rss, 'modules_loaded': len(sys.modules), 'heavy_modules': heavy}))"
)
BASELINES = {
    "python + import airflow.sdk": "import airflow.sdk; " + _RSS,
    "python + import the provider's modules": (
        "import airflow_provider_raybatch.operators.llm_batch, airflow_provider_raybatch.triggers.ray, "
        "airflow_provider_raybatch.sensors.ray, airflow_provider_raybatch.hooks.ray; " + _RSS
    ),
}


def _run(args: list[str], home: str) -> dict:
    # This checkout's provider: a script's interpreter would import the venv's (editable) install.
    env = {"AIRFLOW_HOME": home, "HOME": home, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [str(PYTHON), *args], capture_output=True, text=True, timeout=180, env=env, check=True
    )
    line = [x for x in result.stdout.splitlines() if x.startswith("FOOTPRINT_REPORT=")][-1]
    return json.loads(line.removeprefix("FOOTPRINT_REPORT="))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "footprint.json")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as home:
        for name, code in BASELINES.items():
            rows[name] = [_run(["-c", code], home) for _ in range(args.repeat)]
        rows["operator.execute up to deferral (fake Jobs API)"] = [
            _run([str(SCENARIO)], home) for _ in range(args.repeat)
        ]
    lines = [
        "| fresh `.venvs/airflow` interpreter | peak RSS MiB (median) | max | modules | heavy modules "
        "| target |",
        "|---|---|---|---|---|---|",
    ]
    summary = {}
    for name, runs in rows.items():
        rss = [r["ru_maxrss_kib"] / 1024 for r in runs]  # ru_maxrss is KiB on Linux; MiB here
        summary[name] = {
            "peak_rss_mib_median": statistics.median(rss),
            "peak_rss_mib_max": max(rss),
            "modules_loaded": runs[-1]["modules_loaded"],
            "heavy_modules": runs[-1]["heavy_modules"],
        }
        target = "<= 200 MB" if name.startswith("operator") else ""
        lines.append(
            f"| {name} | {statistics.median(rss):.0f} | {max(rss):.0f} | {runs[-1]['modules_loaded']} | "
            f"{', '.join(runs[-1]['heavy_modules']) or 'none'} | {target} |"
        )
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "repeat": args.repeat,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "results": summary,
        "table": "\n".join(lines),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(report["table"] + f"\n\n(RSS in MiB; JSON: {args.out})")


if __name__ == "__main__":
    main()
