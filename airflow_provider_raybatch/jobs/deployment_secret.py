"""The secret that makes this Airflow deployment's Ray jobs its own (shared/job_ids.py signs with it).

Two Airflow deployments (dev and prod) running the same DAG against one Ray cluster give their jobs
the same names; anyone who can submit to the cluster can copy a job's metadata. Only a secret that
this deployment's workers share and nobody else has tells our jobs apart. In order of preference:

1. ``[raybatch] job_identity_secret`` (``AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET``): set it, the same
   on every worker (and triggerer: common.ai's trigger checks the ids it polls), where Airflow's own
   secrets below are not shared or are rotated;
2. ``[core] fernet_key``, which Airflow generates in a new ``airflow.cfg`` and deployments share;
3. ``[api_auth] jwt_secret``, likewise.

The value is never used, printed or stored as it is: only a key derived from it signs.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from airflow_provider_raybatch.shared.exceptions import RayBatchConfigError

#: (section, option) where the secret is looked for, in order.
SECRET_OPTIONS = (("raybatch", "job_identity_secret"), ("core", "fernet_key"), ("api_auth", "jwt_secret"))
_DERIVATION_LABEL = b"airflow-provider-raybatch job identity v1\x00"
_POOL_SCOPE_LABEL = b"airflow-provider-raybatch engine pool scope v1"
#: A configured ``[raybatch] engine_pool_scope``: it goes into every job's runtime env (and so into the
#: warm pools' fingerprints, which name their replicas).
POOL_SCOPE_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def signing_key(secret: str) -> bytes:
    """The HMAC key derived from a configured secret: the secret itself never signs anything."""
    return hashlib.sha256(_DERIVATION_LABEL + secret.encode()).digest()


def deployment_key() -> bytes:
    """This deployment's job-signing key, from the first of :data:`SECRET_OPTIONS` that is set.

    :raises RayBatchConfigError: none is set; no job could be proven ours, so none is submitted.
    """
    from airflow.configuration import conf

    for section, option in SECRET_OPTIONS:
        value = (conf.get(section, option, fallback="") or "").strip()
        if value:
            return signing_key(value)
    raise RayBatchConfigError(
        "This Airflow deployment has no secret to sign its Ray jobs with: set [raybatch] "
        "job_identity_secret (AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET) to a long random value, the "
        "same on every worker. Without it a job could not be told apart from another deployment's "
        "job of the same DAG and run on a shared Ray cluster."
    )


def engine_pool_scope() -> str:
    """The warm engine pools this deployment's jobs may share: ``[raybatch] engine_pool_scope``, else a
    value derived from :func:`deployment_key` (so each deployment has pools of its own).

    Jobs share a replica only when their scopes match (the scope is part of the pool's fingerprint):
    dev's jobs never send prompts to prod's replicas, nor end them to make room while prod waits for
    them. Deployments that trust each other set the same scope to share warm engines.

    :raises RayBatchConfigError: a configured scope that is not 1-64 letters, digits, ``_.-``.
    """
    from airflow.configuration import conf

    configured = (conf.get("raybatch", "engine_pool_scope", fallback="") or "").strip()
    if configured:
        if not POOL_SCOPE_PATTERN.match(configured):
            raise RayBatchConfigError(
                f"[raybatch] engine_pool_scope={configured[:80]!r}: "
                "give 1 to 64 letters, digits, '_', '.' or '-'"
            )
        return configured
    return hmac.new(deployment_key(), _POOL_SCOPE_LABEL, hashlib.sha256).hexdigest()[:16]
