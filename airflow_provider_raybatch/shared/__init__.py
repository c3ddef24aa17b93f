"""The shared layer: what both the Airflow side and the pipeline (the cluster side) import.

The job spec (specs.py), the exceptions, the run manifest (run_manifest.py, manifest.py), the replica
layout, the job's code packages, job ids, the author's functions read from source, the JSON names, and
the small rules both sides apply (JSON Lines, RAYBATCH_* settings, S3 settings, OpenAI endpoints, unsafe
numbers). DAGs import the spec, the exceptions and the manifest's model from the package's top
(``airflow_provider_raybatch.specs`` and so on), which name these.

Nothing here imports the pipeline, the Airflow side (operators, the job layer, hooks, triggers, sensors,
the common.ai adapter, the Batch API plugin), Airflow, Ray, vLLM or torch: pyproject.toml's import
contracts hold it to that.
"""
