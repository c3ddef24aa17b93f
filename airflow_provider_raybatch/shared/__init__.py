"""The shared layer: pure pieces that both the Airflow side and the pipeline (the cluster side) import.

Nothing here imports the pipeline, the Airflow side (operators, hooks, triggers, sensors, the common.ai
adapter, the Batch API plugin), Airflow, Ray, vLLM or torch: pyproject.toml's import contracts hold it
to that.
"""
