"""pipeline/generate/rows_gate.py: a dataset started before its rows, fed through a bounded Ray queue.

On a local Ray in the cluster's environment; an actor-pool stage stands in for the engine stage (Ray
Data asks for its actors when the dataset starts).
"""

from __future__ import annotations

from tests.unit.pipeline.ray_env import run_in_ray_env

_ON_RAY = """
import json, threading, time
import numpy as np
import ray
ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="ERROR")
from airflow_provider_raybatch.pipeline.generate.rows_gate import RowsGate

BUILT = f"/tmp/rows-gate-built-{time.time_ns()}"

class Engine:  # an actor pool, as the engine stage is: its actor exists once the dataset starts
    def __init__(self):
        self.built_at = time.time()
        open(BUILT, "w").close()
    def __call__(self, batch):
        if FAIL_AT is not None and int(batch["id"].max()) >= FAIL_AT:
            raise RuntimeError("the engine stage failed")
        time.sleep(SLOW)
        batch["built_at"] = np.full(len(batch["id"]), self.built_at)
        return batch

def run(gate, rows, out):
    ds = gate.dataset().repartition(target_num_rows_per_block=8).map_batches(
        Engine, compute=ray.data.ActorPoolStrategy(size=1), batch_format="numpy")
    try:
        out["rows"] = ds.take_all()
    except Exception as err:
        out["error"] = type(err).__name__

def attempt(rows, blocks_queued, wait_for_engine):
    import os
    gate, out = RowsGate(blocks_queued=blocks_queued), {}
    thread = threading.Thread(target=run, args=(gate, rows, out))
    thread.start()
    # The driver reads and prepares meanwhile: here, until the engine's actor is up (a minute at most).
    deadline = time.monotonic() + 60
    while wait_for_engine and not os.path.exists(BUILT) and time.monotonic() < deadline:
        time.sleep(0.1)
    fed_at = time.time()
    running = thread.is_alive
    fed = gate.feed(rows, running)
    gate.close(running)
    thread.join(timeout=120)
    gate.shut()
    got = sorted(int(r["id"]) for r in out.get("rows", []))
    return {"fed": fed, "ended": not thread.is_alive(), "error": out.get("error"), "ids": got,
            "built_before_fed": bool(out.get("rows")) and max(r["built_at"] for r in out["rows"]) < fed_at}
"""


def test_rows_fed_after_the_engine_stage_started_each_come_out_once() -> None:
    """The engine's actor is made before any row is fed; many small blocks, more than the queue holds
    (the end marks wait behind them for room), each row once; and a gate fed nothing ends its dataset."""
    report = run_in_ray_env(
        _ON_RAY
        + """
FAIL_AT, SLOW = None, 0.01
# 60 blocks of 5 rows through a queue of 4; a lazily mapped dataset, made as the gate takes it.
rows = ray.data.range(300, override_num_blocks=60).materialize().map_batches(lambda b: b)
many = attempt(rows, blocks_queued=4, wait_for_engine=True)
empty = attempt(ray.data.range(0), blocks_queued=4, wait_for_engine=False)
print(json.dumps({"many": many, "empty": empty}))
"""
    )
    many, empty = report["many"], report["empty"]
    assert (many["fed"], many["ended"], many["error"]) == (300, True, None), many
    assert many["ids"] == list(range(300))
    assert many["built_before_fed"] is True
    assert (empty["fed"], empty["ended"], empty["error"], empty["ids"]) == (0, True, None, [])


def test_a_feed_stops_once_the_engine_stage_ended() -> None:
    """An engine dataset that failed takes no block again: a feed after it puts none, and a feed into a
    full queue that nothing takes stops once the engine dataset is seen ended; closing then returns."""
    report = run_in_ray_env(
        _ON_RAY
        + """
FAIL_AT, SLOW = 0, 0.0
rows = ray.data.range(1000, override_num_blocks=100).materialize()
failed = attempt(rows, blocks_queued=2, wait_for_engine=False)  # fails on its first batch
# A gate that nothing takes from (no dataset on it): full after two blocks; the engine "ends" at 3 s.
gate, clock = RowsGate(blocks_queued=2), time.monotonic()
def running():
    return time.monotonic() - clock < 3
stuck = {"fed": gate.feed(rows, running)}
gate.close(running)
stuck["seconds"] = time.monotonic() - clock
gate.shut()
print(json.dumps({"failed": failed, "stuck": stuck}))
"""
    )
    failed, stuck = report["failed"], report["stuck"]
    assert failed["ended"] is True and failed["error"] is not None and failed["ids"] == [], failed
    assert stuck["fed"] == 20 and stuck["seconds"] < 10, stuck  # two blocks of 10 rows, then no room
