# syntax=docker/dockerfile:1
# Airflow with the provider: the light side (no Ray, no vLLM, no torch). The provider talks to the
# Ray cluster only through the Jobs REST API, so this image needs nothing of Ray.
# Build from the repository root (docker/airflow.Dockerfile.dockerignore keeps .venvs/ and the rest
# out of the context):
#   docker build -f docker/airflow.Dockerfile -t raybatch-airflow:0.1.0 .

# Stage 1: build the provider's wheel, so the final image carries no source tree or build tools.
FROM apache/airflow:3.3.2-python3.11 AS wheel
WORKDIR /tmp/raybatch
COPY --chown=airflow:root pyproject.toml README.md ./
COPY --chown=airflow:root airflow_provider_raybatch ./airflow_provider_raybatch
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/dist .

# Stage 2: the official image plus the wheel. Airflow is pinned on the same line so that the
# provider's loose `apache-airflow>=3.0` can never upgrade or downgrade it.
FROM apache/airflow:3.3.2-python3.11
# The official image's airflow user (uid 50000, group root), by number so any runtime resolves it.
USER 50000
# The wheel is bind-mounted from stage 1 (BuildKit), so it leaves no layer behind.
RUN --mount=type=bind,from=wheel,source=/tmp/dist,target=/tmp/dist \
    pip install --no-cache-dir "apache-airflow==3.3.2" /tmp/dist/airflow_provider_raybatch-*.whl
# The example DAGs, for deployments without a DAG volume; docker-compose.yaml mounts ../dags over it.
COPY --chown=airflow:root dags /opt/airflow/dags
