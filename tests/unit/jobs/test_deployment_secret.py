"""Tests of airflow_provider_raybatch/jobs/deployment_secret.py: which secret signs this
deployment's jobs."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.jobs.deployment_secret import deployment_key, signing_key
from airflow_provider_raybatch.shared.exceptions import RayBatchConfigError


def test_the_raybatch_option_wins(only_secrets) -> None:
    only_secrets(raybatch="ours", fernet="fernet", jwt="jwt")
    assert deployment_key() == signing_key("ours")


def test_airflow_fernet_key_is_the_default(only_secrets) -> None:
    only_secrets(fernet="fernet", jwt="jwt")
    assert deployment_key() == signing_key("fernet")


def test_the_jwt_secret_when_there_is_no_fernet_key(only_secrets) -> None:
    only_secrets(jwt="jwt")
    assert deployment_key() == signing_key("jwt")


def test_no_secret_fails_naming_the_option_to_set(only_secrets) -> None:
    only_secrets(raybatch="   ")  # blank is unset
    with pytest.raises(RayBatchConfigError, match=r"\[raybatch\] job_identity_secret"):
        deployment_key()


def test_the_secret_itself_never_signs() -> None:
    key = signing_key("s3cret")
    assert b"s3cret" not in key and len(key) == 32
    assert signing_key("s3cret") != signing_key("s3cret ")
