"""Ray submission ids and job metadata derived from an Airflow task-instance try.

A submission id is deterministic, so a retried submit finds its job instead of starting a second
one, and it carries an HMAC under this Airflow deployment's secret (jobs/deployment_secret.py), so
nobody else can make one: a job on a shared cluster is adopted or stopped only when its id proves
it ours. Metadata on its own proves nothing: any cluster user can copy it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
SUBMISSION_ID_PREFIX = "raybatch"
_MAX_PART_LENGTH = 40
_RUN_KEYS = ("airflow_dag_id", "airflow_run_id", "airflow_task_id", "airflow_map_index", "airflow_run_after")
TRY_NUMBER_KEY = "airflow_try_number"
ATTEMPT_KEY = "raybatch_submission_attempt"
#: Ray job metadata key: "true" when the job may take the version an earlier try of its run committed
#: from the same parameters, input, code and model (``reuse_earlier_result``: pipeline/stage/reuse.py).
#: Set by the operator only: a job submitted otherwise (common.ai's) always generates.
REUSE_COMMITTED_KEY = "raybatch_reuse_committed"
#: The most submissions one try makes under ids of its own (see :attr:`TaskTry.attempt`).
MAX_SUBMISSION_ATTEMPTS = 20
#: Hex digits of the HMAC in a submission id (64 bits: not guessable, still readable).
_MAC_DIGITS = 16
#: Every id :meth:`TaskTry.submission_id` makes has this shape (ASCII, under 200 characters): the three
#: cleaned names, the map index, try and attempt, the HMAC.
_SUBMISSION_ID = re.compile(
    rf"{SUBMISSION_ID_PREFIX}-[A-Za-z0-9_.-]{{0,{3 * _MAX_PART_LENGTH + 2}}}"
    rf"-m(?:-?[0-9]{{1,10}}|None)-t[0-9]{{1,6}}(?:-a[0-9]{{1,6}})?-[0-9a-f]{{{_MAC_DIGITS}}}",
    re.ASCII,
)
_MAP_INDEX = re.compile(r"-?[0-9]{1,10}", re.ASCII)


@dataclass(frozen=True)
class TaskTry:
    """Which task-instance try a Ray job belongs to.

    ``run_after`` is the DAG run's own creation identity (Airflow's ``dag_run.run_after``, ISO
    text): it stays the same through retries and clears of the run, and differs when a manual run
    is deleted and created again under the same ``run_id``. A scheduled run created again has the
    same ``run_after`` (its data interval's end), so its try 1 may find the deleted run's try-1 id
    taken: ``attempt`` then counts up to the first free id (the operator's ``_submit``).
    """

    dag_id: str
    run_id: str
    task_id: str
    map_index: int | None  # as Airflow's task instance types it (-1 when not mapped); used as given
    try_number: int
    run_after: str = ""
    attempt: int = 1

    def submission_id(self, secret: bytes) -> str:
        """``raybatch-<dag>-<task>-<run>-m<map index>-t<try>[-a<attempt>]-<mac>``: readable, URL-safe,
        unique, ours.

        The parts are shortened and cleaned for readability; ``<mac>``, an HMAC of the exact values
        under the deployment's ``secret``, keeps two runs whose cleaned names collide apart, and
        two deployments (or a re-created run) sharing names apart, and cannot be made without it.
        The first attempt has no ``-a`` part.
        """
        values = [self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number, self.run_after]
        if self.attempt != 1:
            values.append(f"attempt {self.attempt}")
        mac = signed(secret, values)
        parts = [
            _clean(self.dag_id),
            _clean(self.task_id),
            _clean(self.run_id),
            f"m{self.map_index}",
            f"t{self.try_number}",
            *([f"a{self.attempt}"] if self.attempt != 1 else []),
        ]
        return "-".join([SUBMISSION_ID_PREFIX, *parts, mac])

    def run_key(self) -> str:
        """The logical run's identity, without the try: every retry of it shares this key.

        ``<task id, cleaned, at most 24 characters>-m<map index>-<hash>``. It names the staging folder a
        retry resumes from, so the key of an id that ever worked must never change. Leading dots are
        dropped from the readable part: a task id Airflow allows may start with ``.``, and the key must
        not (it is a folder name: never ``.`` or ``..``, nor hidden). No key that worked began with a
        dot, so dropping them changes none of those.
        """
        exact = "\x1f".join(map(str, (self.dag_id, self.run_id, self.task_id, self.map_index)))
        readable = _clean(self.task_id)[:24].lstrip(".")
        return f"{readable}-m{self.map_index}-{hashlib.sha256(exact.encode()).hexdigest()[:16]}"

    def owns(self, job_id: str, metadata: Mapping[str, str], secret: bytes) -> bool:
        """Whether a Ray job is one of this logical run's (any try), as only this deployment could say.

        Its metadata must name this run, and its submission id must be the one this deployment
        gives the try the metadata names: a copied or forged metadata, another deployment's job of
        the same DAG and run id, or a job of an earlier run of the same run id all fail here.
        """
        mine = self.metadata()
        if not all(metadata.get(key) == mine[key] for key in _RUN_KEYS):
            return False
        return issued_by(job_id, metadata, secret)

    def metadata(self) -> dict[str, str]:
        """Ray job metadata (string values only) that lets our jobs be found by listing."""
        return {
            "airflow_dag_id": self.dag_id,
            "airflow_run_id": self.run_id,
            "airflow_task_id": self.task_id,
            "airflow_map_index": str(self.map_index),
            "airflow_run_after": self.run_after,
            TRY_NUMBER_KEY: str(self.try_number),
            ATTEMPT_KEY: str(self.attempt),
        }

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> TaskTry | None:
        """The try a job's metadata names, read back as :meth:`metadata` wrote it; None when it names none."""
        if not all(isinstance(metadata.get(key), str) for key in _RUN_KEYS):
            return None
        map_index = metadata["airflow_map_index"]
        try_number, attempt = metadata.get(TRY_NUMBER_KEY, ""), metadata.get(ATTEMPT_KEY, "1")
        if not (
            (map_index == "None" or _MAP_INDEX.fullmatch(map_index))
            and _small_count(try_number)
            and _small_count(attempt)
        ):
            return None
        return cls(
            metadata["airflow_dag_id"],
            metadata["airflow_run_id"],
            metadata["airflow_task_id"],
            None if map_index == "None" else int(map_index),
            int(try_number),
            metadata["airflow_run_after"],
            int(attempt),
        )


def signed(secret: bytes, values: Iterable[object]) -> str:
    """An HMAC-SHA256 of ``values`` (as text, joined by the unit separator, which no Airflow id holds)
    under the deployment's ``secret``: 16 hex digits (64 bits) that only the deployment can make."""
    joined = "\x1f".join(map(str, values)).encode()
    return hmac.new(secret, joined, hashlib.sha256).hexdigest()[:_MAC_DIGITS]


def is_submission_id(text: str) -> bool:
    """Whether ``text`` has the shape of an id :meth:`TaskTry.submission_id` makes.

    A cheap first look, before the cluster is asked about it: a NUL byte, a path, an overlong or
    non-ASCII string never leaves the process. It proves nothing: :func:`issued_by` does.
    """
    return isinstance(text, str) and _SUBMISSION_ID.fullmatch(text) is not None


def issued_by(job_id: str, metadata: Mapping[str, str], secret: bytes) -> bool:
    """Whether ``job_id`` is the submission id that ``secret``'s deployment gives the try ``metadata`` names.

    Metadata proves nothing on its own (any cluster user can copy it); the id's HMAC over its exact
    values cannot be made without the secret. So a job passes only under the one id this deployment
    issued for what its metadata says: another deployment's job, or any made-up id, fails.
    """
    task_try = TaskTry.from_metadata(metadata)
    if task_try is None or not (isinstance(job_id, str) and job_id.isascii()):
        return False
    return hmac.compare_digest(job_id.encode(), task_try.submission_id(secret).encode())


def _small_count(text: str) -> bool:
    """A try or attempt number as metadata holds it: ASCII digits, not absurdly many."""
    return text.isascii() and text.isdigit() and len(text) <= 6


def _clean(value: str) -> str:
    return _UNSAFE.sub("_", value).strip("_")[:_MAX_PART_LENGTH]
