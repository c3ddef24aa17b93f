"""S3 settings shipped with one job, kept out of everything the Ray dashboard shows.

The operator zips them into a module of their own, ``raybatch_job_credentials``, and uploads it to
the cluster's package store like the pipeline code; the job's runtime_env names only its
``gcs://`` URI. Ray puts ``py_modules`` on the path of the driver and of every worker, so each
process that touches S3 reads them here, and no environment variable, entrypoint argument or job
metadata ever carries a key. Without a shipped module the cluster's own credentials apply
(an IAM role, the node's environment).
"""

from __future__ import annotations

import importlib
import importlib.resources
import json
import secrets
from typing import Any

CREDENTIALS_MODULE = "raybatch_job_credentials"
_SETTINGS_FILE = "s3.json"
S3_SETTING_NAMES = ("endpoint_url", "region", "access_key", "secret_key", "session_token")


def package_files(settings: dict[str, str | None]) -> dict[str, bytes]:
    """The files of the credentials module, by path inside its zip.

    A random nonce makes every job's package (and so its content-addressed URI) unique, so the URI
    says nothing about the keys.
    """
    unknown = set(settings) - set(S3_SETTING_NAMES)
    if unknown:
        raise ValueError(f"Unknown S3 settings: {sorted(unknown)}.")
    return {
        f"{CREDENTIALS_MODULE}/__init__.py": b'"""S3 settings of one raybatch job (generated)."""\n',
        f"{CREDENTIALS_MODULE}/{_SETTINGS_FILE}": json.dumps(settings).encode(),
        f"{CREDENTIALS_MODULE}/nonce": secrets.token_hex(16).encode(),
    }


def shipped_s3_settings() -> dict[str, Any] | None:  # Any: JSON values.
    """The settings shipped with this job, or None when it relies on the cluster's credentials."""
    try:
        module = importlib.import_module(CREDENTIALS_MODULE)
    except ImportError:
        return None
    return json.loads(importlib.resources.files(module).joinpath(_SETTINGS_FILE).read_text())
