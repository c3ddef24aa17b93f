"""The ``ray`` connection form as Airflow's own ProvidersManager loads it (the API server's source)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.providers_manager import ProvidersManager

from airflow_provider_raybatch.connection_form import CONN_FIELDS
from airflow_provider_raybatch.hooks.ray import RayConnectionSettings

EXPECTED_FIELDS = {
    "headers",
    "cookies",
    "verify",
    "ca_bundle_path",
    "timeout_seconds",
    "retry_window_seconds",
}


@pytest.fixture(scope="module")
def manager() -> ProvidersManager:
    return ProvidersManager()


def test_custom_fields_reach_the_form(manager: ProvidersManager) -> None:
    widgets = manager.connection_form_widgets

    ours = {name.removeprefix("extra__ray__") for name in widgets if name.startswith("extra__ray__")}
    assert ours == EXPECTED_FIELDS
    assert widgets["extra__ray__verify"].field["schema"]["title"] == "Verify TLS certificate"
    assert widgets["extra__ray__retry_window_seconds"].field["value"] == 300


def test_field_behaviour_relabels_token_and_address(manager: ProvidersManager) -> None:
    behaviour = manager.field_behaviours["ray"]

    assert set(behaviour["hidden_fields"]) == {"schema", "login"}
    assert behaviour["relabeling"] == {"host": "Ray dashboard address", "password": "Ray auth token"}


class _Conn:
    """The attributes RayConnectionSettings reads, as the form saves them."""

    def __init__(self, extra: dict[str, Any]) -> None:  # Any: JSON values.
        self.host, self.port, self.schema, self.password = "ray.example.com", 443, "https", "tok"
        self.extra_dejson = extra


def test_values_saved_by_the_form_are_read_back() -> None:
    form_values = {
        "headers": json.dumps({"X-Team": "ml"}),  # the JSON widget may hand over text
        "cookies": {"session": "abc"},
        "verify": True,
        "ca_bundle_path": "/etc/ssl/ray-ca.pem",
        "timeout_seconds": 12,
        "retry_window_seconds": 0,
    }
    assert set(form_values) == set(CONN_FIELDS)

    settings = RayConnectionSettings.from_connection(_Conn(form_values))  # type: ignore[arg-type]

    assert settings.base_url == "https://ray.example.com:443"
    assert settings.headers == {"X-Team": "ml", "Authorization": "Bearer tok"}
    assert settings.cookies == {"session": "abc"}
    assert settings.verify == "/etc/ssl/ray-ca.pem"  # a CA bundle wins over the on/off switch
    assert settings.timeout_seconds == 12.0
    assert settings.retry_window_seconds == 0.0


def test_unset_form_fields_fall_back_to_defaults() -> None:
    settings = RayConnectionSettings.from_connection(_Conn({name: None for name in CONN_FIELDS}))  # type: ignore[arg-type]

    assert settings.verify is True
    assert settings.headers == {"Authorization": "Bearer tok"}
    assert settings.timeout_seconds == 30.0
    assert settings.retry_window_seconds == 300.0
