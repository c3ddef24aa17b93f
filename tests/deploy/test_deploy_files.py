"""The deployment files say what the docs promise: lint passes, and the compose file, the images and
the KubeRay manifest wire Airflow, Ray (token auth) and S3 together without a secret in them.

Nothing here needs a Docker engine or Kubernetes: Compose v5's ``config`` (from scripts/lint_deploy.sh's
tool venv) resolves the compose file, and Ray's own autoscaler code reads the RayCluster manifest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_raybatch.shared.exceptions import ClusterLayoutError
from airflow_provider_raybatch.shared.layout import ClusterResources, NodeResources, plan_layout
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
RAYCLUSTER = ROOT / "deploy" / "kuberay" / "raycluster.yaml"
LINT = ROOT / "scripts" / "lint_deploy.sh"
COMPOSE_BIN = ROOT / ".venvs" / "lint" / "bin" / "docker-compose"
RAY_PYTHON = ROOT / ".venvs" / "ray" / "bin" / "python"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|FERNET|_KEY\b|ACCESS_KEY", re.IGNORECASE)
INTERPOLATION = re.compile(r"(?<!\$)\$\{(\w+)(?::?[-?+][^}]*)?\}")
AIRFLOW_SERVICES = {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}
RAY_SERVICES = {"ray-head", "ray-gpu-worker"}


def _clean_env() -> dict[str, str]:
    """Only PATH and HOME: a variable exported by whoever runs the tests must not fill a gap in .env."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}


def _compose(*args: str, env_file: Path = ENV_EXAMPLE) -> subprocess.CompletedProcess[str]:
    command = [str(COMPOSE_BIN), "--project-directory", str(DOCKER), "-f", str(COMPOSE_FILE)]
    command += ["--env-file", str(env_file), *args]
    return subprocess.run(command, capture_output=True, text=True, env=_clean_env(), timeout=60)


def _env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.lstrip().startswith("#")}


@pytest.fixture(scope="session")
def lint_run() -> subprocess.CompletedProcess[str]:
    """scripts/lint_deploy.sh, once: installs its tools into .venvs/lint on first use."""
    return subprocess.run(["bash", str(LINT)], capture_output=True, text=True, cwd=ROOT, timeout=900)


@pytest.fixture(scope="session")
def compose(lint_run: subprocess.CompletedProcess[str]) -> dict[str, Any]:  # Any: compose JSON.
    """The compose model as Compose resolves it with .env.example."""
    if not COMPOSE_BIN.exists():
        pytest.fail(f"scripts/lint_deploy.sh did not install docker-compose:\n{lint_run.stderr[-2000:]}")
    result = _compose("config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="session")
def raycluster() -> dict[str, Any]:  # Any: the manifest's YAML.
    return yaml.safe_load(RAYCLUSTER.read_text())


# --- the lint script ---------------------------------------------------------------------------------


def test_lint_deploy_passes(lint_run: subprocess.CompletedProcess[str]) -> None:
    assert lint_run.returncode == 0, lint_run.stdout + lint_run.stderr
    for check in ("hadolint", "docker-compose config", "compose-spec schema", "yamllint"):
        assert f"ok: {check}" in lint_run.stdout
    assert all(f"docker/{path.name}" in lint_run.stdout for path in DOCKERFILES)


def test_lint_deploy_fails_on_findings(tmp_path: Path, lint_run: subprocess.CompletedProcess[str]) -> None:
    """A copy of the tree with an unpinned Dockerfile and a compose file missing a variable fails."""
    assert lint_run.returncode == 0
    (tmp_path / "scripts").mkdir()
    shutil.copy(LINT, tmp_path / "scripts" / "lint_deploy.sh")
    shutil.copytree(DOCKER, tmp_path / "docker")
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    (tmp_path / ".venvs").symlink_to(ROOT / ".venvs")  # the installed tools, stamp matching
    (tmp_path / "docker" / "bad.Dockerfile").write_text("FROM python\nRUN pip install ray\n")
    env_example = tmp_path / "docker" / ".env.example"
    env_example.write_text(re.sub(r"(?m)^RAY_AUTH_TOKEN=.*\n", "", env_example.read_text()))

    result = subprocess.run(["bash", "scripts/lint_deploy.sh"], capture_output=True, text=True, cwd=tmp_path)

    assert result.returncode == 1
    assert "DL3006" in result.stdout and "DL3013" in result.stdout  # untagged image, unpinned pip
    assert "RAY_AUTH_TOKEN" in result.stderr
    assert "2 check(s) failed" in result.stderr


# --- docker-compose.yaml -----------------------------------------------------------------------------


def test_compose_brings_up_airflow_ray_and_s3(compose: dict[str, Any]) -> None:
    expected = {"postgres", "airflow-init", "minio", "minio-init", *AIRFLOW_SERVICES, *RAY_SERVICES}

    assert set(compose["services"]) == expected
    commands = {name: compose["services"][name]["command"] for name in AIRFLOW_SERVICES}
    assert commands == {
        "airflow-apiserver": ["api-server"],
        "airflow-scheduler": ["scheduler"],
        "airflow-dag-processor": ["dag-processor"],
        "airflow-triggerer": ["triggerer"],
    }
    assert compose["services"]["airflow-init"]["command"] == ["db", "migrate"]


def test_airflow_waits_for_the_database_and_its_migration(compose: dict[str, Any]) -> None:
    for name in AIRFLOW_SERVICES:
        depends = compose["services"][name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["airflow-init"]["condition"] == "service_completed_successfully"


def test_the_ray_connection_reaches_the_head_with_the_token(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_raybatch.hooks.ray import RayHook

    token = _env_example()["RAY_AUTH_TOKEN"]
    for name in AIRFLOW_SERVICES:
        environment = compose["services"][name]["environment"]
        monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", environment["AIRFLOW_CONN_RAY_DEFAULT"])
        settings = RayHook(ray_conn_id="ray_default").settings

        assert json.loads(environment["AIRFLOW_CONN_RAY_DEFAULT"])["conn_type"] == "ray"
        assert settings.base_url == "http://ray-head:8265"
        assert settings.headers["Authorization"] == f"Bearer {token}"


def test_the_aws_connection_points_at_minio(compose: dict[str, Any]) -> None:
    env = _env_example()
    conn = json.loads(compose["services"]["airflow-scheduler"]["environment"]["AIRFLOW_CONN_AWS_DEFAULT"])

    assert conn["conn_type"] == "aws"
    assert (conn["login"], conn["password"]) == (env["S3_ACCESS_KEY_ID"], env["S3_SECRET_ACCESS_KEY"])
    assert conn["extra"]["endpoint_url"] == "http://minio:9000"
    minio = compose["services"]["minio"]["environment"]
    assert (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]) == (conn["login"], conn["password"])


def test_ray_nodes_use_token_auth_and_reach_s3(compose: dict[str, Any]) -> None:
    env = _env_example()
    for name in RAY_SERVICES:
        environment = compose["services"][name]["environment"]
        assert environment["RAY_AUTH_MODE"] == "token"
        assert environment["RAY_AUTH_TOKEN"] == env["RAY_AUTH_TOKEN"]
        assert environment["AWS_ENDPOINT_URL"] == "http://minio:9000"  # pyarrow's S3 reads it
        assert environment["AWS_ACCESS_KEY_ID"] == env["S3_ACCESS_KEY_ID"]
    head = compose["services"]["ray-head"]["command"]
    assert "--head" in head and "--num-gpus=0" in head and "--dashboard-host=0.0.0.0" in head
    assert compose["services"]["ray-gpu-worker"]["command"][:3] == ["ray", "start", "--address=ray-head:6379"]


def test_the_gpu_worker_reserves_nvidia_gpus(compose: dict[str, Any]) -> None:
    (device,) = compose["services"]["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]

    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "deploy" not in compose["services"]["ray-head"]


def test_the_bucket_is_created_before_ray_starts(compose: dict[str, Any]) -> None:
    init = compose["services"]["minio-init"]

    assert "mc mb --ignore-existing" in " ".join(init["command"])
    assert init["environment"]["S3_BUCKET"] == _env_example()["S3_BUCKET"]
    assert compose["services"]["ray-head"]["depends_on"]["minio-init"]["condition"] == (
        "service_completed_successfully"
    )


def test_the_example_dags_are_mounted_read_only(compose: dict[str, Any]) -> None:
    for name in AIRFLOW_SERVICES:
        (dags,) = [v for v in compose["services"][name]["volumes"] if v["target"] == "/opt/airflow/dags"]
        assert Path(dags["source"]) == ROOT / "dags"
        assert dags["read_only"] is True


def test_ports_are_published_on_loopback_only(compose: dict[str, Any]) -> None:
    published = [port for service in compose["services"].values() for port in service.get("ports", [])]

    assert {port["published"] for port in published} == {"8080", "8265", "9000", "9001"}
    assert {port["host_ip"] for port in published} == {"127.0.0.1"}


def test_every_airflow_option_set_exists_in_airflow(compose: dict[str, Any]) -> None:
    from airflow.configuration import retrieve_configuration_description

    description = retrieve_configuration_description()
    for name in AIRFLOW_SERVICES:
        for key in compose["services"][name]["environment"]:
            if key.startswith("AIRFLOW__"):
                section, option = key.removeprefix("AIRFLOW__").lower().split("__", 1)
                options = description.get(section, {}).get("options", {})
                assert option in options, f"{key} is no option of Airflow 3.3.2"


def test_compose_refuses_to_start_without_the_ray_token(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(re.sub(r"(?m)^RAY_AUTH_TOKEN=.*$", "RAY_AUTH_TOKEN=", ENV_EXAMPLE.read_text()))
    if not COMPOSE_BIN.exists():
        pytest.skip("scripts/lint_deploy.sh has not installed docker-compose")

    result = _compose("config", "--quiet", env_file=env_file)

    assert result.returncode != 0
    assert "RAY_AUTH_TOKEN" in result.stderr and "set it in docker/.env" in result.stderr


def test_no_secret_is_written_in_the_compose_file() -> None:
    text = COMPOSE_FILE.read_text()
    model = yaml.safe_load(text)
    blocks = [*(s.get("environment", {}) for s in model["services"].values() if isinstance(s, dict))]
    blocks += [model[key]["environment"] for key in model if key.startswith("x-")]
    for environment in blocks:
        for key, value in environment.items():
            if SECRET_NAME.search(key):
                assert INTERPOLATION.fullmatch(str(value)), f"{key} must come from docker/.env, not {value!r}"
            if key.startswith("AIRFLOW_CONN_"):
                fields = re.findall(r'"(password|login)": "([^"]*)"', value)
                assert fields and all(INTERPOLATION.fullmatch(v) for _, v in fields), key
    for key, value in _env_example().items():
        if value and SECRET_NAME.search(key):
            assert value not in text


def test_env_example_holds_placeholders_only() -> None:
    for key, value in _env_example().items():
        if SECRET_NAME.search(key):
            assert value == "" or value.startswith("change-me"), f"{key} looks like a real secret"


def test_env_example_defines_what_compose_needs_and_nothing_else() -> None:
    text = COMPOSE_FILE.read_text()
    used = {match.group(1) for match in INTERPOLATION.finditer(text)}
    required = {m.group(1) for m in INTERPOLATION.finditer(text) if ":?" in m.group(0)}

    assert required <= set(_env_example())
    assert set(_env_example()) <= used


# --- the Dockerfiles ---------------------------------------------------------------------------------


def _instructions(path: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    return [part.strip() for part in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if part.strip()]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda path: path.name)
def test_dockerfiles_pin_base_images_and_packages(path: Path) -> None:
    instructions = _instructions(path)
    for image in (line.split()[1] for line in instructions if line.upper().startswith("FROM ")):
        assert ":" in image and not image.endswith(":latest"), f"{path.name}: FROM {image} is not pinned"
    installs = [m.group(1) for line in instructions for m in re.finditer(r"pip install ([^&;]+)", line)]
    for package in (p.strip("\"'") for args in installs for p in args.split()):
        if package.startswith(("-", "/", "http")) or "download.pytorch.org" in package:
            continue
        assert "==" in package, f"{path.name}: pip install {package} is not pinned"


def test_the_ray_gpu_image_pins_the_pair_ray_itself_pins() -> None:
    """ray 2.57.0's `llm` extra pins vllm 0.25.1: the image installs exactly that pair, on Ray's image."""
    text = (DOCKER / "ray-gpu.Dockerfile").read_text()

    assert "FROM rayproject/ray:2.57.0-py311-gpu" in text
    assert '"ray[data,default,llm]==2.57.0"' in text and '"vllm==0.25.1"' in text


def test_the_airflow_image_keeps_its_build_context_small() -> None:
    text = (DOCKER / "airflow.Dockerfile.dockerignore").read_text()
    patterns = [line for line in text.splitlines() if line and not line.startswith("#")]

    assert patterns[0] == "*"  # everything out (.venvs/ holds gigabytes), then the few paths back in
    assert {p for p in patterns if p.startswith("!")} == {
        "!pyproject.toml",
        "!README.md",
        "!airflow_provider_raybatch/",
        "!dags/",
    }
    # Every path the Dockerfile copies from the context is let back in.
    copied = re.findall(
        r"(?m)^COPY (?!--from)(?:--\S+ )*(.+) \S+$", (DOCKER / "airflow.Dockerfile").read_text()
    )
    sources = [part for line in copied for part in line.split()]
    assert sorted(sources) == ["README.md", "airflow_provider_raybatch", "dags", "pyproject.toml"]
    for source in sources:
        assert f"!{source}" in patterns or f"!{source}/" in patterns, source


# --- deploy/kuberay/raycluster.yaml ------------------------------------------------------------------


def _containers(raycluster: dict[str, Any]) -> list[dict[str, Any]]:  # Any: the manifest's YAML.
    groups = [raycluster["spec"]["headGroupSpec"], *raycluster["spec"]["workerGroupSpecs"]]
    return [group["template"]["spec"]["containers"][0] for group in groups]


def test_raycluster_is_a_ray_io_v1_raycluster(raycluster: dict[str, Any]) -> None:
    spec = raycluster["spec"]

    assert (raycluster["apiVersion"], raycluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert spec["enableInTreeAutoscaling"] is True
    assert set(spec) <= {
        "rayVersion",
        "enableInTreeAutoscaling",
        "autoscalerOptions",
        "headGroupSpec",
        "workerGroupSpecs",
        "headServiceAnnotations",
        "suspend",
        "authOptions",
        "gcsFaultToleranceOptions",
    }
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        # The CRD types rayStartParams as a map of strings: a bare number is rejected by the API server.
        assert all(isinstance(value, str) for value in group["rayStartParams"].values())


def test_raycluster_has_a_cpu_head_and_a_gpu_group_that_scales_from_zero(raycluster: dict[str, Any]) -> None:
    head = raycluster["spec"]["headGroupSpec"]
    (workers,) = raycluster["spec"]["workerGroupSpecs"]
    head_limits = head["template"]["spec"]["containers"][0]["resources"]["limits"]
    worker_limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]

    assert head["rayStartParams"]["num-gpus"] == "0" and "nvidia.com/gpu" not in head_limits
    assert workers["minReplicas"] == 0 and workers["replicas"] == 0 and workers["maxReplicas"] >= 1
    assert int(worker_limits["nvidia.com/gpu"]) >= 1


def test_raycluster_turns_token_auth_on_everywhere_from_a_secret(raycluster: dict[str, Any]) -> None:
    blocks = [container["env"] for container in _containers(raycluster)]
    blocks.append(raycluster["spec"]["autoscalerOptions"]["env"])  # the autoscaler sidecar talks to the GCS
    for env in blocks:
        by_name = {item["name"]: item for item in env}
        assert by_name["RAY_AUTH_MODE"]["value"] == "token"
        assert set(by_name["RAY_AUTH_TOKEN"]) == {"name", "valueFrom"}  # never a literal value
        assert by_name["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "raybatch-ray-auth",
            "key": "auth_token",
        }


def test_raycluster_runs_the_ray_gpu_image_at_its_ray_version(
    raycluster: dict[str, Any], compose: dict[str, Any]
) -> None:
    version = raycluster["spec"]["rayVersion"]

    assert f"ray[data,default,llm]=={version}" in (DOCKER / "ray-gpu.Dockerfile").read_text()
    for container in _containers(raycluster):
        assert container["image"].endswith(f"/raybatch-ray-gpu:{version}")
    assert compose["services"]["ray-head"]["image"] == f"raybatch-ray-gpu:{version}"


@pytest.fixture(scope="session")
def autoscaler_view(raycluster: dict[str, Any]) -> dict[str, Any]:  # Any: autoscaler config.
    """The node types Ray's KubeRay autoscaler derives from the manifest (Ray 2.60's own code)."""
    if not RAY_PYTHON.exists():
        pytest.skip(".venvs/ray is missing (scripts/setup_envs.sh makes it)")
    code = (
        "import json, sys\n"
        "from ray.autoscaler._private.kuberay import autoscaling_config\n"
        "cr = json.load(sys.stdin)\n"
        "cr['metadata'].setdefault('namespace', 'default')\n"
        "config = autoscaling_config._derive_autoscaling_config_from_ray_cr(cr)\n"
        "types = config['available_node_types']\n"
        "print(json.dumps({k: {**v, 'node_config': None} for k, v in types.items()}))"
    )
    result = subprocess.run(
        [str(RAY_PYTHON), "-c", code],
        input=json.dumps(raycluster),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_rays_autoscaler_reads_the_manifest_as_intended(autoscaler_view: dict[str, Any]) -> None:
    node_types = autoscaler_view

    assert node_types["headgroup"]["resources"]["GPU"] == 0
    gpu = node_types["gpu"]
    assert (gpu["min_workers"], gpu["max_workers"]) == (0, 4)
    assert gpu["resources"]["GPU"] == 1 and gpu["resources"]["CPU"] == 8
    # Declared, so a job with accelerator_type="H100" can scale the group up from zero.
    assert gpu["resources"]["accelerator_type:H100"] == 1


def test_the_layout_planner_agrees_with_the_manifest_at_full_scale(autoscaler_view: dict[str, Any]) -> None:
    node_types = autoscaler_view
    gpu = node_types["gpu"]
    head = NodeResources("head", node_types["headgroup"]["resources"], is_head=True)
    workers = [
        NodeResources(f"gpu-{i}", gpu["resources"], accelerator_type="H100")
        for i in range(gpu["max_workers"])
    ]
    full_scale = ClusterResources((head, *workers))
    base = {"model": "m", "input_uri": "s3://b/in.csv", "output_uri": "s3://b/out", "user_template": "{x}"}

    pool_of_four = BatchInferenceSpec.build(**base, concurrency=(1, 4), accelerator_type="H100")
    plan_layout(pool_of_four).check_fits(full_scale)
    with pytest.raises(ClusterLayoutError) as raised:
        spec = BatchInferenceSpec.build(**base, engine_kwargs={"tensor_parallel_size": 2})
        plan_layout(spec).check_fits(full_scale)
    assert raised.value.parameter == "engine_kwargs.tensor_parallel_size"
