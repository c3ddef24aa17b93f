"""The provider the tests exercise is the one installed: the built wheel under RAYBATCH_TEST_INSTALL=wheel
(scripts/test.sh, CI), where users get it from; the checkout in an editable install otherwise.

tests/conftest.py stops a wheel-mode run before collection when the checkout would shadow the wheel;
these tests show the same facts in the run's report, and check what else depends on where the
package lies: the interpreters the tests start (``airflow dags test`` and the like) import the same
copy, the version Airflow reports is the installed one, and a job ships that copy's modules.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import airflow_provider_raybatch
from airflow_provider_raybatch.jobs.job_shipping import local_modules
from airflow_provider_raybatch.shared.packaging import build_provider_package
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from tests.conftest import ROOT, WHEEL_MODE, site_packages

DISTRIBUTION = "airflow-provider-raybatch"
PACKAGE_DIR = Path(airflow_provider_raybatch.__file__).resolve().parent


@pytest.mark.skipif(not WHEEL_MODE, reason="RAYBATCH_TEST_INSTALL is not wheel: the checkout is under test")
def test_the_provider_is_the_installed_wheel_not_the_checkout() -> None:
    installed = site_packages() / "airflow_provider_raybatch"
    assert installed == PACKAGE_DIR
    assert not PACKAGE_DIR.is_relative_to(ROOT / "airflow_provider_raybatch")
    direct_url = json.loads(
        importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json") or "{}"
    )
    assert direct_url.get("url", "").endswith(".whl"), direct_url  # a wheel file, not a folder (editable)


def test_a_console_script_imports_the_copy_this_process_imports() -> None:
    # -P leaves the cwd off sys.path, as the `airflow` command does: an editable install's .pth, or the
    # installed wheel, decides. Inherited cwd and environment, as `airflow dags test` gets them.
    code = "import airflow_provider_raybatch as p; print(p.__file__)"
    shown = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert Path(shown.stdout.strip()).resolve().parent == PACKAGE_DIR, (
        "the `airflow` command the tests start would import another copy of the provider than this "
        "process does: run the tests through scripts/test.sh"
    )
    # And a plain `python -c` in the tests' cwd (several tests start one), cwd on sys.path.
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert Path(shown.stdout.strip()).resolve().parent == PACKAGE_DIR


def test_the_installed_version_is_the_one_airflow_reports() -> None:
    version = importlib.metadata.version(DISTRIBUTION)
    assert version == airflow_provider_raybatch.__version__
    assert airflow_provider_raybatch.get_provider_info()["versions"][0] == version


def test_a_job_ships_every_module_of_the_imported_copy() -> None:
    spec = BatchInferenceSpec(model="m", input_uri="/in/rows.jsonl", output_uri="/out/", user_template="{t}")
    [provider] = local_modules(spec)
    assert provider == PACKAGE_DIR  # site-packages/airflow_provider_raybatch in wheel mode
    with zipfile.ZipFile(io.BytesIO(build_provider_package(provider).data)) as shipped:
        names = set(shipped.namelist())
    if WHEEL_MODE:  # what the wheel installed (its RECORD), byte code aside
        files = importlib.metadata.files(DISTRIBUTION) or []
        installed = {f.as_posix() for f in files if f.parts[0] == "airflow_provider_raybatch"}
        expected = {name for name in installed if name.endswith(".py")}
        # build_provider_package ships .py files only: a data file the pipeline reads must ship too.
        assert {name for name in installed if "__pycache__" not in name} == expected
    else:
        expected = {
            f"airflow_provider_raybatch/{p.relative_to(PACKAGE_DIR)}" for p in PACKAGE_DIR.rglob("*.py")
        }
    assert names == expected
    assert "airflow_provider_raybatch/pipeline/__main__.py" in names  # the job's entrypoint module
