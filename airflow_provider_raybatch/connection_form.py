"""The ``ray`` connection's form in the Airflow UI, declared as data (stdlib only).

Airflow 3.2+ reads ``conn-fields`` and ``ui-field-behaviour`` from the provider info without
importing the hook; older releases call ``RayHook.get_ui_field_behaviour``. Both come from here.
The custom fields are stored under these names in the connection's extra.
"""

from __future__ import annotations

from airflow_provider_raybatch.shared.json_types import JsonObject

DEFAULT_PORT = 8265

#: Custom fields, stored in ``Connection.extra`` (JSON Schema per field, as Airflow's form renders it).
CONN_FIELDS: dict[str, JsonObject] = {
    "headers": {
        "label": "Extra HTTP headers",
        "description": "JSON object of headers sent with every request, e.g. for an ingress or proxy.",
        "schema": {"type": ["object", "null"], "format": "json"},
    },
    "cookies": {
        "label": "Cookies",
        "description": "JSON object of cookies sent with every request (e.g. an SSO session).",
        "schema": {"type": ["object", "null"], "format": "json"},
    },
    "verify": {
        "label": "Verify TLS certificate",
        "description": "Off only for a test cluster with a self-signed certificate.",
        "schema": {"type": ["boolean", "null"], "default": True},
    },
    "ca_bundle_path": {
        "label": "CA bundle path",
        "description": "PEM file of the CA that signed the dashboard's certificate; overrides 'Verify'.",
        "schema": {"type": ["string", "null"]},
    },
    "timeout_seconds": {
        "label": "Request timeout (s)",
        "schema": {"type": ["number", "null"], "default": 30, "minimum": 1},
    },
    "retry_window_seconds": {
        "label": "Retry window (s)",
        "description": (
            "How long calls retry while the head is unreachable or answers 5xx; 0 turns retries off."
        ),
        "schema": {"type": ["number", "null"], "default": 300, "minimum": 0},
    },
}

_HIDDEN_FIELDS = ["schema", "login"]
_RELABELING = {"host": "Ray dashboard address", "password": "Ray auth token"}
_PLACEHOLDERS = {
    "host": "127.0.0.1, https://ray.example.com or https://gateway.example.com/ray",
    "port": str(DEFAULT_PORT),
    "password": "the cluster's token (ray start writes it to ~/.ray/auth_token)",
}


def provider_connection_type() -> JsonObject:
    """The ``connection-types`` entry of the provider info."""
    return {
        "connection-type": "ray",
        "hook-class-name": "airflow_provider_raybatch.hooks.ray.RayHook",
        "hook-name": "Ray",
        "conn-fields": CONN_FIELDS,
        "ui-field-behaviour": {
            "hidden-fields": _HIDDEN_FIELDS,
            "relabeling": _RELABELING,
            "placeholders": _PLACEHOLDERS,
        },
    }


def ui_field_behaviour() -> JsonObject:
    """The same behaviour in the shape ``BaseHook.get_ui_field_behaviour`` returns."""
    return {"hidden_fields": _HIDDEN_FIELDS, "relabeling": _RELABELING, "placeholders": _PLACEHOLDERS}
