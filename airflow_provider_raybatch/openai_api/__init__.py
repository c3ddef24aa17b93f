"""An OpenAI-compatible Batch API on the Airflow API server: files and batches, run as DAG runs."""
