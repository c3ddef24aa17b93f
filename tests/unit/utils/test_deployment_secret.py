"""Tests of airflow_provider_raybatch/utils/deployment_secret.py: which secret signs this
deployment's jobs."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.exceptions import RayBatchConfigError
from airflow_provider_raybatch.utils.deployment_secret import deployment_key, engine_pool_scope, signing_key

OPTIONS = {
    "raybatch": "AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET",
    "fernet": "AIRFLOW__CORE__FERNET_KEY",
    "jwt": "AIRFLOW__API_AUTH__JWT_SECRET",
}


@pytest.fixture
def only(monkeypatch: pytest.MonkeyPatch):
    """Set exactly these options (by short name) in the environment, the others empty."""

    def set_only(**values: str) -> None:
        for name, variable in OPTIONS.items():
            monkeypatch.setenv(variable, values.get(name, ""))

    return set_only


def test_the_raybatch_option_wins(only) -> None:
    only(raybatch="ours", fernet="fernet", jwt="jwt")
    assert deployment_key() == signing_key("ours")


def test_airflow_fernet_key_is_the_default(only) -> None:
    only(fernet="fernet", jwt="jwt")
    assert deployment_key() == signing_key("fernet")


def test_the_jwt_secret_when_there_is_no_fernet_key(only) -> None:
    only(jwt="jwt")
    assert deployment_key() == signing_key("jwt")


def test_no_secret_fails_naming_the_option_to_set(only) -> None:
    only(raybatch="   ")  # blank is unset
    with pytest.raises(RayBatchConfigError, match=r"\[raybatch\] job_identity_secret"):
        deployment_key()


def test_the_secret_itself_never_signs() -> None:
    key = signing_key("s3cret")
    assert b"s3cret" not in key and len(key) == 32
    assert signing_key("s3cret") != signing_key("s3cret ")


SCOPE = "AIRFLOW__RAYBATCH__ENGINE_POOL_SCOPE"


def test_each_deployment_has_an_engine_pool_scope_of_its_own(only, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCOPE, "")
    only(raybatch="prod-secret")
    prod = engine_pool_scope()
    only(raybatch="dev-secret")
    dev = engine_pool_scope()
    assert prod != dev and len(prod) == len(dev) == 16
    assert "secret" not in prod  # derived: nothing of the secret shows in the jobs' runtime env
    only(raybatch="prod-secret")
    assert engine_pool_scope() == prod  # stable: a deployment's jobs find its warm pools again


def test_deployments_that_trust_each_other_share_a_configured_scope(
    only, monkeypatch: pytest.MonkeyPatch
) -> None:
    only(raybatch="prod-secret")
    monkeypatch.setenv(SCOPE, " analytics-team ")
    assert engine_pool_scope() == "analytics-team"
    only(raybatch="dev-secret")
    assert engine_pool_scope() == "analytics-team"


@pytest.mark.parametrize("hostile", ["../x", "a b", "x" * 65, "team\nRAYBATCH_X=1", "é"])
def test_a_configured_scope_outside_the_pattern_is_refused(
    hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SCOPE, hostile)
    with pytest.raises(RayBatchConfigError, match=r"\[raybatch\] engine_pool_scope="):
        engine_pool_scope()
