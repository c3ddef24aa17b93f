"""One tenant of a shared Ray cluster against another, through warm engine pools (docs/security.md,
"A shared Ray cluster"): pools scoped by deployment, a fair share of a shared replica per job, and
idle pools that never hold resources against a job that does not use them.

Tested beside the code they need: an actor of a replica's name serving another engine gets no row,
and an idle replica ends only for a job it can help (tests/unit/pipeline/test_engine_pool.py); a DAG
cannot set its own scope (tests/unit/operators/test_llm_batch.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from airflow_provider_raybatch.jobs.deployment_secret import engine_pool_scope
from airflow_provider_raybatch.shared.exceptions import RayBatchConfigError

SCOPE = "AIRFLOW__RAYBATCH__ENGINE_POOL_SCOPE"


def test_each_deployment_has_an_engine_pool_scope_of_its_own(
    only_secrets, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SCOPE, "")
    only_secrets(raybatch="prod-secret")
    prod = engine_pool_scope()
    only_secrets(raybatch="dev-secret")
    dev = engine_pool_scope()
    assert prod != dev and len(prod) == len(dev) == 16
    only_secrets(raybatch="prod-secret")
    assert engine_pool_scope() == prod  # stable: a deployment's jobs find its warm pools again


def test_deployments_that_trust_each_other_share_a_configured_scope(
    only_secrets, monkeypatch: pytest.MonkeyPatch
) -> None:
    only_secrets(raybatch="prod-secret")
    monkeypatch.setenv(SCOPE, " analytics-team ")
    assert engine_pool_scope() == "analytics-team"
    only_secrets(raybatch="dev-secret")
    assert engine_pool_scope() == "analytics-team"


@pytest.mark.parametrize("hostile", ["../x", "a b", "x" * 65, "team\nRAYBATCH_X=1", "é"])
def test_a_configured_scope_outside_the_pattern_is_refused(
    hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SCOPE, hostile)
    with pytest.raises(RayBatchConfigError, match=r"\[raybatch\] engine_pool_scope="):
        engine_pool_scope()


def test_each_job_gets_a_share_of_a_replicas_engine_whatever_its_batches() -> None:
    """A job that sends far more rows than the replica's share (2 running batches of vLLM) keeps only
    its share in the engine: a second job's rows go in beside them, not behind all of them."""
    import asyncio

    from airflow_provider_raybatch.pipeline.generate.pool_replica import _max_num_seqs

    inside: dict[str, int] = {"big": 0, "small": 0}
    most: dict[str, int] = {"big": 0, "small": 0}
    order: list[str] = []

    class Engine:  # Ray Data LLM's UDF: each row takes a moment in the engine
        async def _generate_with_error_handling(self, row, batch_uuid):
            job = row["job"]
            inside[job] += 1
            most[job] = max(most[job], inside[job])
            await asyncio.sleep(0.01)
            inside[job] -= 1
            order.append(job)
            return {"generated_text": row["source"], "embeddings": None}

    class Settings:  # the built engine's scheduler config, as vLLM keeps it
        max_num_seqs = 3

    replica = _stub_replica(Engine(), 2 * Settings.max_num_seqs)

    async def main() -> None:
        big = [replica.generate({"source": f"b:{i}", "job": "big"}, "big") for i in range(60)]
        big_tasks = [asyncio.ensure_future(call) for call in big]
        await asyncio.sleep(0.005)  # the big job's rows are all sent first
        small = [replica.generate({"source": f"s:{i}", "job": "small"}, "small") for i in range(6)]
        await asyncio.gather(*big_tasks, *small)

    asyncio.run(main())
    assert most == {"big": 6, "small": 6}
    assert order.index("small") < 12  # within the big job's first two shares, not after its 60 rows
    assert (
        replica._rows_by_job == {"big": 60, "small": 6} and replica._shares == {} and replica._in_flight == {}
    )

    class Built:
        class llm:  # noqa: N801 - Ray Data LLM's wrapper, its AsyncLLM, vLLM's config
            class engine:  # noqa: N801
                class vllm_config:  # noqa: N801
                    scheduler_config = Settings

    assert _max_num_seqs(Built(), {}) == 3
    assert _max_num_seqs(object(), {"engine_kwargs": {"max_num_seqs": 32}}) == 32
    assert _max_num_seqs(object(), {"engine_kwargs": {"max_num_seqs": "lots"}}) == 256


def _stub_replica(engine: object, job_share: int) -> Any:  # Any: an EngineReplica, its actor unbuilt
    """An engine replica's state over a stub engine (Ray Data LLM's UDF), built without Ray or vLLM."""
    from airflow_provider_raybatch.pipeline.generate.pool_replica import EngineReplica

    replica = object.__new__(EngineReplica)
    replica.__dict__.update(
        _engine=engine,
        _in_flight={},
        _rows_by_source={},
        _rows_done=0,
        _rows_by_job={},
        _retiring=False,
        _chat_templates={},
        _job_templates={},
        _last_active=0.0,
        _shares={},
        _job_share=job_share,
    )
    return replica


def _sequence_counting_replica(max_num_seqs: int) -> tuple[Any, dict[str, int], list[list[int]]]:
    """A replica over a stub engine that counts each job's sequences inside it at most (a row's ``n``
    choices, one per input of an embeddings line), and, as each row goes in, its job's rows inside (their
    sequences)."""

    inside: dict[str, int] = {}
    most: dict[str, int] = {}
    rows_inside: dict[str, list[int]] = {}
    crowds: list[list[int]] = []

    class Engine:  # the engine's work grows with its sequences
        async def _generate_with_error_handling(self, row, batch_uuid):
            job, n = row["job"], json.loads(row["sampling_params"]).get("n", 1)
            sequences = n * (1 + len(json.loads(row["extra_inputs"] or "[]")))
            inside[job] = inside.get(job, 0) + sequences
            most[job] = max(most.get(job, 0), inside[job])
            rows_inside.setdefault(job, []).append(sequences)
            crowds.append(sorted(rows_inside[job]))
            await asyncio.sleep(0.002 * sequences)
            inside[job] -= sequences
            rows_inside[job].remove(sequences)
            return {"generated_text": row["source"], "embeddings": None}

    replica = _stub_replica(Engine(), 2 * max_num_seqs)
    return replica, most, crowds


def _engine_row(job: str, index: int, n: int = 1, inputs: int = 1) -> dict[str, Any]:
    """A row as it reaches the replica: sampling parameters and extra inputs as JSON text."""
    extra = json.dumps([f"text {i}" for i in range(inputs - 1)]) if inputs > 1 else None
    return {
        "source": f"{job}:{index}",
        "job": job,
        "sampling_params": json.dumps({"n": n}),
        "extra_inputs": extra,
    }


def test_a_jobs_share_of_a_replica_counts_the_sequences_its_rows_ask_for() -> None:
    """Rows asking for many choices (an OpenAI line's ``n``, up to 128) or embeddings of many inputs
    hold the job's share in sequences, not rows: the job keeps at most two running batches of the
    engine, whatever each row asks for, and the other job's rows go in beside them."""
    replica, most, _ = _sequence_counting_replica(max_num_seqs=8)  # a share of 16 sequences a job

    async def main() -> None:
        wide = [_engine_row("wide", i, n=8) for i in range(12)] + [
            _engine_row("wide", 12 + i, inputs=8) for i in range(4)
        ]
        narrow = [_engine_row("narrow", i) for i in range(16)]
        await asyncio.gather(
            *(replica.generate(row, row["job"]) for pair in zip(wide, narrow, strict=True) for row in pair)
        )

    asyncio.run(main())
    assert most == {"wide": 16, "narrow": 16}  # rows counted: wide had 16 rows of 8 sequences, 128
    assert replica._rows_by_job == {"wide": 16, "narrow": 16} and replica._shares == {}


def test_a_row_larger_than_a_jobs_share_runs_alone_within_it() -> None:
    """A row asking for more sequences than the share still runs (it takes the whole share), with
    none of its job's other rows beside it, and the job's rows behind it wait their turn."""
    replica, most, crowds = _sequence_counting_replica(max_num_seqs=4)  # a share of 8 sequences

    async def main() -> None:
        rows = [_engine_row("job", i, n=2) for i in range(3)]
        rows += [_engine_row("job", 3, n=128), *(_engine_row("job", 4 + i) for i in range(6))]
        await asyncio.gather(*(replica.generate(row, "job") for row in rows))

    asyncio.run(main())
    assert [crowd for crowd in crowds if 128 in crowd] == [[128]]  # nothing of its job beside it
    assert most == {"job": 128} and crowds.index([128]) == 3  # after the rows before it, not those after
    assert replica._rows_by_job == {"job": 10} and replica._shares == {}


def test_rows_cancelled_while_waiting_for_their_jobs_share_hold_no_places() -> None:
    """A job whose lease ends has its rows cancelled, those still waiting for a place too: the places
    they never got, or got just as they were cancelled, go to the rows behind them."""
    replica, most, _ = _sequence_counting_replica(max_num_seqs=2)  # a share of 4 sequences

    async def main() -> list[bool]:
        first = [asyncio.ensure_future(replica.generate(_engine_row("job", i, n=4), "job")) for i in range(3)]
        await asyncio.sleep(0.001)  # the first row is in the engine, the others wait for the share
        first[1].cancel()
        first[2].cancel()
        await asyncio.gather(*first, return_exceptions=True)
        later = [replica.generate(_engine_row("job", 3 + i, n=2), "job") for i in range(4)]
        await asyncio.wait_for(asyncio.gather(*later), 1.0)
        return [task.cancelled() for task in first]

    assert asyncio.run(main()) == [False, True, True]
    assert most == {"job": 4} and replica._rows_by_job == {"job": 5} and replica._shares == {}


def test_a_row_cancelled_just_as_its_places_come_gives_them_back() -> None:
    from airflow_provider_raybatch.pipeline.generate.pool_replica import _JobShare

    share = _JobShare(4)

    async def waiting_row() -> None:
        async with share.held(4):
            await asyncio.sleep(1.0)

    async def main() -> bool:
        first = share.held(4)
        await first.__aenter__()
        second = asyncio.ensure_future(waiting_row())
        await asyncio.sleep(0)  # the second row waits for the share
        await first.__aexit__(None, None, None)  # its places go to the second row ...
        second.cancel()  # ... as its job's lease ends, before it runs
        await asyncio.gather(second, return_exceptions=True)
        async with share.held(4):  # the whole share is free again, at once
            return second.cancelled()

    assert asyncio.run(asyncio.wait_for(main(), 0.5))


@pytest.mark.parametrize(
    ("row", "sequences"),
    [
        ({"sampling_params": '{"n": 128, "temperature": 1.0}'}, 128),
        ({"sampling_params": {"n": 2, "best_of": 5}}, 5),
        ({"sampling_params": '{"n": 3}', "extra_inputs": '["a", "b"]'}, 9),
        ({"sampling_params": None, "extra_inputs": json.dumps(["x"] * 2047)}, 2048),
        ({"sampling_params": '{"n": "many"}'}, 1),
        ({"sampling_params": '{"n": true}'}, 1),
        ({"sampling_params": '{"n": 64.0}'}, 1),
        ({"sampling_params": "not json"}, 1),
        ({"prompt": "no sampling parameters"}, 1),
    ],
)
def test_a_rows_sequences_in_the_engine(row: dict[str, Any], sequences: int) -> None:
    from airflow_provider_raybatch.pipeline.generate.pool_replica import _sequences

    assert _sequences(row) == sequences


def test_a_job_on_engines_of_its_own_ends_idle_pool_replicas_while_its_replicas_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool kept warm for a day must not hold its resources against a job that does not use it."""
    from airflow_provider_raybatch.pipeline.generate import cluster_demand, engine_pool

    waits: list[bool | None] = []  # what Ray's scheduler says in each round (None: it cannot say)
    room_calls: list[tuple] = []

    def actor_waits_for(needs, when_unknown=True):
        answer = waits.pop(0)
        return when_unknown if answer is None else answer

    monkeypatch.setattr(cluster_demand, "actor_waits_for", actor_waits_for)
    monkeypatch.setattr(
        engine_pool, "make_room", lambda *args: room_calls.append(args) or ["raybatch-engine-x-0"]
    )
    keeper = engine_pool.RoomKeeper({"GPU": 1.0, "CPU": 1.0})
    monkeypatch.setattr(engine_pool, "MAKE_ROOM_AFTER_SECONDS", -1.0)
    waits += [False, None, True]
    keeper.round()  # its replicas were placed
    keeper.round()  # Ray cannot say: nothing is ended on a guess
    assert room_calls == []
    keeper.round()  # an actor of its shape waits: idle replicas of every pool may go
    assert room_calls == [({"GPU": 1.0, "CPU": 1.0}, None, engine_pool.LEASE_RENEW_SECONDS)]
    assert keeper.ended == ["raybatch-engine-x-0"]
    monkeypatch.setattr(engine_pool, "MAKE_ROOM_AFTER_SECONDS", 3600.0)
    waits.append(True)
    keeper.round()  # too soon after the job asked for its engines: Ray may still be placing them
    assert len(room_calls) == 1 and waits == [True]


@pytest.mark.parametrize("keep_warm", [float("nan"), float("inf"), 86_400.5, -1.0])
def test_a_replica_refuses_a_keep_warm_window_that_would_keep_it_for_ever(keep_warm: float) -> None:
    """Anyone who can submit to the cluster can call a replica by its name (docs/security.md): the
    replica itself bounds ``keep_warm_seconds`` as the spec does, or NaN would keep it from ever
    ending (NaN compares false with every idle time)."""
    import asyncio

    from airflow_provider_raybatch.pipeline.generate.pool_replica import EngineReplica

    replica = object.__new__(EngineReplica)
    replica.__dict__.update(_retiring=False, _leases={}, _keep_warm_seconds=60.0)
    with pytest.raises(ValueError, match=r"keep_warm_seconds=.* must be from 0 to 86,400"):
        asyncio.run(replica._attach("tenant", keep_warm, None))
    assert replica._leases == {} and replica._keep_warm_seconds == 60.0


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        ({"model": "/their/folder", "trust_remote_code": True}, r"a chat template of model '/their/folder'"),
        ({"model": "/models/m", "trust_remote_code": True}, r"trust_remote_code on a replica whose engine"),
        ({"model": "/models/m", "raybatch_model_copy_root": "/elsewhere"}, r"skips the check of the replica"),
    ],
)
def test_an_attach_may_render_only_with_the_replicas_own_model(
    settings: dict[str, Any], refused: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone who can submit to the cluster can call a replica by its name (docs/security.md): an
    attach naming another model folder with trust_remote_code ran that folder's tokenizer code in the
    process holding every sharing job's rows. The replica loads only its own model's chat template."""
    import asyncio

    from airflow_provider_raybatch.pipeline.generate import pool_replica

    loaded: list[dict[str, Any]] = []
    monkeypatch.setattr(pool_replica, "_chat_template_udf", lambda kwargs: loaded.append(kwargs) or object())
    replica = _stub_replica(object(), 6)
    replica.__dict__["_own_model"] = pool_replica._ModelOfEngine("/models/m", False, None)

    with pytest.raises(ValueError, match=refused):
        asyncio.run(replica._hold_chat_template("tenant", settings))
    asyncio.run(replica._hold_chat_template("job", {"model": "/models/m", "chat_template": "{{ x }}"}))

    assert loaded == [{"model": "/models/m", "chat_template": "{{ x }}"}]
    assert replica._job_templates.keys() == {"job"}


def test_a_row_sent_again_while_its_first_call_runs_takes_that_calls_answer() -> None:
    """A row whose call's answer was lost on the way (its replica unreachable for a moment) is sent
    again; its first call may still run there, and a cancel from the job's side cannot reach it (to
    its caller it had ended). The replica gives the second call the first one's answer: the row is
    generated, and held, once."""
    import asyncio

    calls: list[str] = []

    class Engine:
        async def _generate_with_error_handling(self, row, batch_uuid):
            calls.append(row["source"])
            await asyncio.sleep(0.05)
            return {"generated_text": f"answer {len(calls)}", "embeddings": None}

    replica = _stub_replica(Engine(), 6)

    async def main() -> list[Any]:
        row = {"source": "in.jsonl:7", "sampling_params": "{}", "extra_inputs": None}
        first = asyncio.ensure_future(replica.generate(dict(row), "job"))
        await asyncio.sleep(0.01)
        again = await replica.generate(dict(row), "job")
        other_job = await replica.generate(dict(row), "other job")
        return [await first, again, other_job]

    first, again, other_job = asyncio.run(main())

    assert calls == ["in.jsonl:7", "in.jsonl:7"]  # once for each job
    assert first == again and first["generated_text"] == "answer 1"
    assert other_job["generated_text"] == "answer 2"
    assert replica._rows_by_source == {} and replica._in_flight == {}
