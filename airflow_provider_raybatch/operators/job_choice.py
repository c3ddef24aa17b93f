"""What a try does with the newest Ray job of its run: attach to it, or submit a new job (stopping it
first where it runs with other parameters). Pure: the operator finds the job and acts on the choice.

A new job is submitted also when the earlier one ended: the new job resumes its staged rows, or takes
the version the run committed when nothing it was made from has changed (``pipeline/stage/reuse.py``);
both are decided on the cluster, where the rows are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from airflow_provider_raybatch.hooks.ray import JobInfo
from airflow_provider_raybatch.jobs.job_shipping import FINGERPRINT_KEY


class Start(enum.Enum):
    """How a try starts."""

    #: No earlier job of the run, or one that ended: a new job.
    SUBMIT = "submit"
    #: The earlier try's job still runs, with this try's parameters: wait for it.
    ATTACH = "attach"
    #: The earlier try's job still runs, with other parameters (a clear after editing the prompt): its
    #: rows are not this try's, so stop it and submit a new job.
    STOP_AND_SUBMIT = "stop and submit"


@dataclass(frozen=True)
class StartChoice:
    start: Start
    #: The run's newest earlier job the choice is about (None: there is none, or it had other
    #: parameters and ended, so nothing of it counts).
    previous: JobInfo | None

    @property
    def previous_ended(self) -> bool:
        """A new job follows an ended job of the same parameters (it may resume or reuse its rows)."""
        return self.start is Start.SUBMIT and self.previous is not None


def choose_start(previous: JobInfo | None, fingerprint: str) -> StartChoice:
    """The try's start, given the run's newest job (:meth:`.llm_batch.RayLLMBatchOperator._previous_job`)
    and this try's spec fingerprint."""
    if previous is None:
        return StartChoice(Start.SUBMIT, None)
    same_parameters = previous.metadata.get(FINGERPRINT_KEY) == fingerprint
    if previous.status.is_terminal:
        return StartChoice(Start.SUBMIT, previous if same_parameters else None)
    return StartChoice(Start.ATTACH if same_parameters else Start.STOP_AND_SUBMIT, previous)
