"""Tests of airflow_provider_raybatch/shared/job_ids.py: submission ids, run keys, metadata, ownership."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from airflow.sdk.definitions._internal.node import validate_key
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.jobs.deployment_secret import signing_key
from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.job_ids import (
    SUBMISSION_ID_PREFIX,
    TaskTry,
    is_submission_id,
    issued_by,
)
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

TRY = TaskTry(
    dag_id="daily_company_industry",
    run_id="scheduled__2026-11-21T00:00:00+00:00",
    task_id="classify",
    map_index=-1,
    try_number=1,
    run_after="2026-11-22T00:00:00+00:00",
)
SAFE = re.compile(r"[A-Za-z0-9_.-]+")
KEY = signing_key("prod-deployment-secret")
OTHER_KEY = signing_key("dev-deployment-secret")


def test_submission_id_is_deterministic() -> None:
    same = TaskTry(TRY.dag_id, TRY.run_id, TRY.task_id, TRY.map_index, TRY.try_number, TRY.run_after)

    assert TRY.submission_id(KEY) == same.submission_id(KEY)


def test_submission_id_is_readable() -> None:
    submission_id = TRY.submission_id(KEY)

    assert submission_id.startswith(f"{SUBMISSION_ID_PREFIX}-daily_company_industry-classify-scheduled__2026")
    assert "-m-1-t1-" in submission_id


@pytest.mark.parametrize(
    "change",
    [
        {"try_number": 2},
        {"map_index": 0},
        {"map_index": 1},
        {"run_id": "scheduled__2026-11-22T00:00:00+00:00"},
        {"run_id": "manual__2026-11-21T00:00:00+00:00"},
        {"task_id": "classify_2"},
        {"dag_id": "other_dag"},
        {"run_after": "2026-11-25T09:14:03.123456+00:00"},  # the same run id, deleted and created again
    ],
)
def test_submission_id_differs_per_try_map_index_and_run(change: dict) -> None:
    assert replace(TRY, **change).submission_id(KEY) != TRY.submission_id(KEY)


def test_submission_id_differs_per_deployment() -> None:
    """Dev and prod running the same DAG and run id on one cluster get different job ids."""
    assert TRY.submission_id(KEY) != TRY.submission_id(OTHER_KEY)


def test_names_that_clean_alike_still_differ() -> None:
    first = replace(TRY, dag_id="a b", run_id="r:1")
    second = replace(TRY, dag_id="a/b", run_id="r 1")

    assert first.submission_id(KEY) != second.submission_id(KEY)


@pytest.mark.parametrize(
    "task_try",
    [
        TRY,
        replace(TRY, dag_id="dág / ünïcode", task_id="group.task id", run_id="manual__2026:x?y#z&w%"),
        replace(TRY, dag_id="///", task_id="***", run_id="???"),
        replace(TRY, dag_id="d" * 300, task_id="t" * 300, run_id="r" * 300, map_index=12345, try_number=99),
    ],
)
def test_submission_id_uses_only_safe_characters(task_try: TaskTry) -> None:
    submission_id = task_try.submission_id(KEY)

    assert SAFE.fullmatch(submission_id), submission_id
    assert len(submission_id) <= 200
    assert is_submission_id(submission_id)


def test_metadata_values_are_strings() -> None:
    metadata = replace(TRY, map_index=3, try_number=2).metadata()

    assert metadata == {
        "airflow_dag_id": TRY.dag_id,
        "airflow_run_id": TRY.run_id,
        "airflow_task_id": TRY.task_id,
        "airflow_map_index": "3",
        "airflow_run_after": TRY.run_after,
        "airflow_try_number": "2",
        "raybatch_submission_attempt": "1",
    }
    assert all(isinstance(key, str) and isinstance(value, str) for key, value in metadata.items())


# -- run_key: one logical run, every try ----------------------------------------------------------

RUN_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")  # BatchInferenceSpec.run_key's pattern


@pytest.mark.parametrize("try_number", [1, 2, 7, 99])
def test_run_key_is_the_same_for_every_try(try_number: int) -> None:
    assert replace(TRY, try_number=try_number).run_key() == TRY.run_key()


def test_run_key_is_deterministic_and_readable() -> None:
    same = TaskTry(TRY.dag_id, TRY.run_id, TRY.task_id, TRY.map_index, TRY.try_number)

    assert same.run_key() == TRY.run_key()  # run_after is not in it: staging outlives a re-created run
    assert re.fullmatch(r"classify-m-1-[0-9a-f]{16}", TRY.run_key()), TRY.run_key()
    assert re.fullmatch(r"classify-m3-[0-9a-f]{16}", replace(TRY, map_index=3).run_key())


@pytest.mark.parametrize(
    "change",
    [
        {"map_index": 0},
        {"map_index": 1},
        {"run_id": "scheduled__2026-11-22T00:00:00+00:00"},
        {"run_id": "manual__2026-11-21T00:00:00+00:00"},
        {"task_id": "classify_2"},
        {"dag_id": "other_dag"},
    ],
)
def test_run_key_differs_per_run_map_index_task_and_dag(change: dict) -> None:
    assert replace(TRY, **change).run_key() != TRY.run_key()


def test_run_keys_of_names_that_clean_alike_still_differ() -> None:
    first = replace(TRY, dag_id="a b", run_id="r:1", task_id="t/1")
    second = replace(TRY, dag_id="a/b", run_id="r 1", task_id="t 1")

    assert first.run_key() != second.run_key()


def test_run_key_does_not_collide_across_fields() -> None:
    """The exact values are joined with a separator that cannot appear in them, so shifting text
    from one field to the next gives another key."""
    assert replace(TRY, dag_id="ab", run_id="c").run_key() != replace(TRY, dag_id="a", run_id="bc").run_key()


@pytest.mark.parametrize(
    "task_try",
    [
        TRY,
        replace(TRY, dag_id="dág / ünïcode", task_id="group.task id", run_id="manual__2026:x?y#z&w%"),
        replace(TRY, dag_id="///", task_id="***", run_id="???"),
        replace(TRY, task_id="ünïcödé"),
        replace(TRY, dag_id="d" * 300, task_id="t" * 300, run_id="r" * 300, map_index=12345, try_number=99),
    ],
)
def test_run_key_matches_the_spec_pattern(task_try: TaskTry) -> None:
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    run_key = task_try.run_key()

    assert RUN_KEY_PATTERN.fullmatch(run_key), run_key
    assert run_key not in (".", "..")  # it names a folder under _staging/
    spec = BatchInferenceSpec.build(
        model="m", input_uri="in.jsonl", output_uri="out", user_template="{x}", run_key=run_key
    )
    assert spec.run_key == run_key


def spec_with(run_key: str) -> BatchInferenceSpec:
    return BatchInferenceSpec.build(
        model="m", input_uri="in.jsonl", output_uri="out", user_template="{x}", run_key=run_key
    )


@pytest.mark.parametrize("task_id", [".hidden", "..", "...", "._x", ".-", "." * 250, "_.x", "group..task"])
def test_a_task_id_airflow_allows_that_starts_with_a_dot_gives_a_valid_run_key(task_id: str) -> None:
    """Airflow accepts ``.hidden`` as a task id; its run key once began with a dot, which the spec
    refuses, so every try failed on ``run_key``, a field the DAG author never set."""
    validate_key(task_id)  # Airflow's own rule for task and DAG ids
    task_try = replace(TRY, task_id=task_id)

    assert spec_with(task_try.run_key()).run_key == task_try.run_key()
    assert SAFE.fullmatch(task_try.submission_id(KEY))


# What a run key was before dots were dropped (commit 569a760): the staging folders of runs in flight
# are named by it, so every key of this form that the spec accepted must stay the same.
GOLDEN_RUN_KEYS = [
    (TRY, "classify-m-1-29d7049939633de0"),
    (
        TaskTry(
            "daily_company_industry",
            "manual__2026-11-21T00:00:00+00:00",
            "group.classify_each_company_in_the_list",
            7,
            3,
        ),
        "group.classify_each_comp-m7-e05aab2639b1f409",
    ),
    (TaskTry("dág", "r", "ünïcödé", -1, 1), "n_c_d-m-1-3926c04ed54d8875"),
]


@pytest.mark.parametrize(("task_try", "run_key"), GOLDEN_RUN_KEYS)
def test_run_keys_of_ordinary_ids_are_unchanged(task_try: TaskTry, run_key: str) -> None:
    assert task_try.run_key() == run_key


def _run_key_before_the_fix(task_try: TaskTry) -> str:
    import hashlib

    exact = "\x1f".join(map(str, (task_try.dag_id, task_try.run_id, task_try.task_id, task_try.map_index)))
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", task_try.task_id).strip("_")[:40]
    return f"{cleaned[:24]}-m{task_try.map_index}-{hashlib.sha256(exact.encode()).hexdigest()[:16]}"


# Airflow's key rule (validate_key: ``^[\w.-]+$`` with Unicode \w, at most 250 characters) for DAG
# and task ids; run ids as its default allowed_run_id_pattern and its generated ids, at most 250.
airflow_keys = st.from_regex(r"[\w.-]{1,250}", fullmatch=True).filter(
    lambda key: validate_key(key) is None and len(key) <= 250
)
dotted_keys = st.builds(
    lambda dots, rest: (dots + rest)[:250], st.text(".", min_size=1, max_size=30), airflow_keys
)
run_ids = st.from_regex(r"[A-Za-z0-9_.~:+-]{1,250}", fullmatch=True).filter(lambda run_id: len(run_id) <= 250)


@settings(max_examples=300, deadline=None)
@given(
    dag_id=st.one_of(airflow_keys, dotted_keys),
    task_id=st.one_of(airflow_keys, dotted_keys, st.just("." * 250), st.just("t" * 250)),
    run_id=st.one_of(run_ids, st.just("r" * 250)),
    map_index=st.integers(min_value=-1, max_value=10**6),
    try_number=st.integers(min_value=0, max_value=10**4),
)
def test_every_id_airflow_accepts_gives_a_valid_run_key_and_submission_id(
    dag_id: str, task_id: str, run_id: str, map_index: int, try_number: int
) -> None:
    task_try = TaskTry(dag_id, run_id, task_id, map_index, try_number)
    run_key = task_try.run_key()

    assert spec_with(run_key).run_key == run_key  # the spec's own rule, not a copy of it
    assert not run_key.startswith(".")
    submission_id = task_try.submission_id(KEY)
    assert SAFE.fullmatch(submission_id) and len(submission_id) <= 200, submission_id
    assert is_submission_id(submission_id), submission_id
    old = _run_key_before_the_fix(task_try)
    try:
        spec_with(old)
    except BatchSpecError:
        return  # never worked: no staged run to resume
    assert run_key == old  # a key that worked is kept, so its staged rows still resume


# -- owns: which Ray jobs belong to this logical run, as only this deployment can say ----------------


def job_of(task_try: TaskTry, key: bytes = KEY) -> tuple[str, dict[str, str]]:
    """The submission id and metadata a deployment with ``key`` gives the job of ``task_try``."""
    return task_try.submission_id(key), task_try.metadata()


@pytest.mark.parametrize("try_number", [1, 2, 10])
def test_owns_the_jobs_of_every_try(try_number: int) -> None:
    assert TRY.owns(*job_of(replace(TRY, try_number=try_number)), KEY)


def test_a_later_attempt_has_an_id_of_its_own_that_is_still_ours() -> None:
    """A re-created scheduled run (same run_after) finds its try-1 id taken by the deleted run's job;
    the next attempt's id is new, and still proves itself this run's."""
    first, second, third = (replace(TRY, attempt=attempt) for attempt in (1, 2, 3))

    assert len({first.submission_id(KEY), second.submission_id(KEY), third.submission_id(KEY)}) == 3
    assert "-t1-a2-" in second.submission_id(KEY) and "-a" not in first.submission_id(KEY).split("-t1-")[1]
    assert TRY.owns(*job_of(second), KEY) and TRY.owns(*job_of(third), KEY)
    assert not TRY.owns(first.submission_id(KEY), second.metadata(), KEY)  # the attempt must match too


def test_the_first_attempt_keeps_the_id_it_had_before_attempts_existed() -> None:
    import hashlib
    import hmac

    exact = "\x1f".join(
        map(str, (TRY.dag_id, TRY.run_id, TRY.task_id, TRY.map_index, TRY.try_number, TRY.run_after))
    )
    mac = hmac.new(KEY, exact.encode(), hashlib.sha256).hexdigest()[:16]
    assert TRY.submission_id(KEY).endswith(f"-m-1-t1-{mac}")


def test_owns_ignores_extra_metadata() -> None:
    job_id, metadata = job_of(TRY)
    assert TRY.owns(job_id, {**metadata, "raybatch_spec_fingerprint": "abc", "team": "ml"}, KEY)


@pytest.mark.parametrize(
    "change",
    [
        {"map_index": 0},
        {"run_id": "scheduled__2026-11-22T00:00:00+00:00"},
        {"task_id": "classify_2"},
        {"dag_id": "other_dag"},
        {"run_after": "2026-11-25T09:14:03.123456+00:00"},
    ],
)
def test_owns_not_the_jobs_of_another_run(change: dict) -> None:
    assert not TRY.owns(*job_of(replace(TRY, **change)), KEY)


def test_owns_not_another_deployments_job_of_the_same_run() -> None:
    """Dev's job of the same DAG, run id and task, on the same cluster, is not prod's."""
    assert not TRY.owns(*job_of(TRY, OTHER_KEY), KEY)


@pytest.mark.parametrize(
    "forged_id",
    [
        "raybatch-daily_company_industry-classify-scheduled__2026-11-21T00_00_00_00_00-m-1-t1-0000000000000000",
        "my-own-job",
        "",
        TRY.submission_id(KEY).upper(),
        TRY.submission_id(KEY)[:-1],
        TRY.submission_id(KEY) + "0",
        replace(TRY, try_number=2).submission_id(KEY),  # a real id of ours, but of another try than it says
    ],
)
def test_owns_not_a_job_whose_id_was_not_made_by_this_deployment(forged_id: str) -> None:
    """Anyone who can submit to the cluster can copy a job's metadata; the id they cannot make."""
    assert not TRY.owns(forged_id, TRY.metadata(), KEY)


@pytest.mark.parametrize("try_number", ["", "x", "-1", "1.0", "9" * 40, " 1", "\u0661"])
def test_owns_not_a_job_with_a_strange_try_number(try_number: str) -> None:
    job_id, metadata = job_of(TRY)
    assert not TRY.owns(job_id, {**metadata, "airflow_try_number": try_number}, KEY)


@pytest.mark.parametrize(
    "missing",
    ["airflow_dag_id", "airflow_run_id", "airflow_task_id", "airflow_map_index", "airflow_run_after"],
)
def test_owns_not_a_job_missing_a_key(missing: str) -> None:
    job_id, metadata = job_of(TRY)
    del metadata[missing]

    assert not TRY.owns(job_id, metadata, KEY)


def test_owns_not_foreign_or_empty_metadata() -> None:
    job_id, _ = job_of(TRY)
    assert not TRY.owns(job_id, {}, KEY)
    assert not TRY.owns(job_id, {"airflow_map_index": "-1"}, KEY)


@settings(max_examples=200, deadline=None)
@given(
    dag_id=airflow_keys,
    task_id=airflow_keys,
    run_id=run_ids,
    map_index=st.integers(min_value=-1, max_value=10**6),
    try_number=st.integers(min_value=1, max_value=10**4),
    run_after=st.datetimes().map(lambda moment: moment.isoformat()),
)
def test_every_run_owns_its_own_jobs_and_no_other_deployments(
    dag_id: str, task_id: str, run_id: str, map_index: int, try_number: int, run_after: str
) -> None:
    task_try = TaskTry(dag_id, run_id, task_id, map_index, try_number, run_after)
    first_try = replace(task_try, try_number=1)

    assert first_try.owns(*job_of(task_try), KEY)
    assert not first_try.owns(*job_of(task_try, OTHER_KEY), KEY)
    assert TaskTry.from_metadata(task_try.metadata()) == task_try
    assert issued_by(*job_of(task_try), KEY) and not issued_by(*job_of(task_try, OTHER_KEY), KEY)


# -- is_submission_id, issued_by: a job id of this deployment's, whatever its run ------------------


@pytest.mark.parametrize(
    "task_try",
    [
        TRY,
        replace(TRY, map_index=None),
        replace(TRY, attempt=20),
        replace(TRY, map_index=7, try_number=999_999),
    ],
)
def test_every_kind_of_id_we_make_has_our_shape_and_reads_back(task_try: TaskTry) -> None:
    assert is_submission_id(task_try.submission_id(KEY))
    assert TaskTry.from_metadata(task_try.metadata()) == task_try
    assert issued_by(*job_of(task_try), KEY)


OURS = TRY.submission_id(KEY)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "my-own-job",
        OURS.upper(),
        OURS[:-1],
        OURS + "0",
        OURS + "\n",
        OURS + "\x00",
        "../" + OURS,
        "raybatch-" + "a" * 5000 + OURS[-20:],
        OURS.replace("classify", "clässify"),
        OURS.replace("-t1-", "-t\u0661-"),
    ],
)
def test_what_we_never_make_has_not_our_shape(text: str) -> None:
    assert not is_submission_id(text)


@pytest.mark.parametrize(
    "change",
    [
        {"airflow_map_index": "x"},
        {"airflow_map_index": "+1"},
        {"airflow_map_index": "1" * 11},
        {"airflow_try_number": "-1"},
        {"raybatch_submission_attempt": ""},
    ],
)
def test_metadata_we_never_write_names_no_try(change: dict) -> None:
    assert TaskTry.from_metadata({**TRY.metadata(), **change}) is None
    assert not issued_by(TRY.submission_id(KEY), {**TRY.metadata(), **change}, KEY)


def test_issued_by_holds_for_any_run_of_ours_and_no_one_elses() -> None:
    """Unlike :meth:`TaskTry.owns`, whatever run the metadata names: the triggerer has no task to compare."""
    other_run = replace(TRY, task_id="summarize", try_number=3)

    assert issued_by(*job_of(other_run), KEY) and not TRY.owns(*job_of(other_run), KEY)
    assert not issued_by(other_run.submission_id(KEY), TRY.metadata(), KEY)  # metadata of another try
    assert not issued_by(*job_of(other_run, OTHER_KEY), KEY)
