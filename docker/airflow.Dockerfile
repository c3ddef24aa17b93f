# Airflow with the provider: the light side (no Ray, no vLLM, no torch).
# Build from the repository root: docker build -f docker/airflow.Dockerfile -t raybatch-airflow .
FROM apache/airflow:3.3.2-python3.11
COPY --chown=airflow:root pyproject.toml README.md /opt/raybatch/
COPY --chown=airflow:root airflow_provider_raybatch /opt/raybatch/airflow_provider_raybatch
RUN pip install --no-cache-dir "apache-airflow==3.3.2" /opt/raybatch
COPY --chown=airflow:root dags /opt/airflow/dags
