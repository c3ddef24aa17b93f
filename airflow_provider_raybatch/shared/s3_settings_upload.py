"""The S3 settings of one job as an upload for the Jobs API's package store, under a random name.

The operator ships them this way (``jobs/job_shipping.py``); the driver takes them from the
cluster's store and deletes them (``pipeline/credentials.py``, whose docstring says why this shape).
"""

from __future__ import annotations

import json
import secrets

from airflow_provider_raybatch.shared.packaging import RayPackage

S3_SETTING_NAMES = ("endpoint_url", "region", "access_key", "secret_key", "session_token")
UPLOAD_PREFIX = "gcs://raybatch_s3_settings_"


def settings_upload(settings: dict[str, str | None]) -> RayPackage:
    """The settings as a package-store upload under a random name, for no runtime_env field.

    The name is random (not a hash of the content), so it says nothing about the keys, and two
    submits of the same settings never share an upload that the first job's driver deletes.
    """
    unknown = set(settings) - set(S3_SETTING_NAMES)
    if unknown:
        raise ValueError(f"Unknown S3 settings: {sorted(unknown)}.")
    return RayPackage(uri=f"{UPLOAD_PREFIX}{secrets.token_hex(16)}.json", data=json.dumps(settings).encode())
