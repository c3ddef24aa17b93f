"""One tenant of a shared Ray cluster against another, through warm engine pools (docs/security.md,
"A shared Ray cluster"): pools scoped by deployment, a fair share of a shared replica per job, and
idle pools that never hold resources against a job that does not use them.

Tested beside the code they need: an actor of a replica's name serving another engine gets no row,
and an idle replica ends only for a job it can help (tests/unit/pipeline/test_engine_pool.py); a DAG
cannot set its own scope (tests/unit/operators/test_llm_batch.py).
"""

from __future__ import annotations

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

    from airflow_provider_raybatch.pipeline.generate.pool_replica import EngineReplica, _max_num_seqs

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

    replica = object.__new__(EngineReplica)
    replica.__dict__.update(
        _engine=Engine(),
        _in_flight={},
        _rows_done=0,
        _rows_by_job={},
        _retiring=False,
        _chat_templates={},
        _job_templates={},
        _last_active=0.0,
        _shares={},
        _job_share=2 * Settings.max_num_seqs,
    )

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
