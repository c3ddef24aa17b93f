"""Every shell block of the README and docs/ that is a command runs here, as a reader runs it, and what
it did is read back: tests/unit/test_docs_shell.py checks the blocks' shell and names without running
them, this runs them.

Each block runs in bash (``-e``) in a sandbox: an Airflow home of its own (migrated, the example DAGs
serialized, nothing of this machine's Airflow), the repository's DAGs folder, this virtualenv's
``airflow``, a reader's "y" to a prompt. Then each command's effect is checked from what bash traced
as it ran: a backfill's runs and their conf, a pool, a cleared task; a connection as the provider's
hook reads it, an OpenLineage transport as OpenLineage builds it. A date a command clears ran and
succeeded first, as the page assumes.

A block this test cannot run here is marked in the page's source, in an HTML comment on the line
right above its fence, and the page says why in words:

- ``<!-- not run here: <why> -->``: it needs what this machine lacks (a Kubernetes cluster, a Docker
  engine, a GPU);
- ``<!-- run by: <file>, ... -->``: another test or script runs it, and names each command's program.

An unmarked block with a command this test does not run (another program, an ``airflow`` command it
has no check for) fails it: mark the block, or teach the test the command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from tests.unit.doc_blocks import ROOT, Block, marked_blocks
from tests.unit.test_docs_shell import commands_of

BLOCKS = marked_blocks("bash")
NOT_RUN = "not run here:"
RUN_BY = "run by:"
TO_RUN = [block for block in BLOCKS if block.marker is None]
MARKED = [block for block in BLOCKS if block.marker is not None]
AIRFLOW = Path(sys.executable).parent / "airflow"
#: bash's trace of each command as it ran (PS4), one per line; a value with a newline goes on.
TRACE_MARK = "+docs-run+ "
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")


def _ids(blocks: list[Block]) -> list[str]:
    return [block.where for block in blocks]


def test_the_docs_have_commands_to_run_and_marks_to_read() -> None:
    marks = [block.marker or "" for block in MARKED]
    assert (
        len(TO_RUN) >= 8
        and any(m.startswith(NOT_RUN) for m in marks)
        and any(m.startswith(RUN_BY) for m in marks)
    )


@pytest.mark.parametrize("block", MARKED, ids=_ids(MARKED))
def test_a_marked_block_says_why_or_who_runs_it(block: Block) -> None:
    marker = block.marker or ""
    assert marker.startswith((NOT_RUN, RUN_BY)), (
        f"{block.where}: <!-- {marker} --> is neither '{NOT_RUN} <why>' nor '{RUN_BY} <file>, ...'"
    )
    if marker.startswith(NOT_RUN):
        assert len(marker.removeprefix(NOT_RUN).split()) >= 4, f"{block.where}: say why it cannot run here"
        return
    named = re.findall(r"(?<![\w/.-])((?:\.ci|scripts|tests)/[\w./-]*\w)", marker)
    assert named, f"{block.where}: name the file that runs it"
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert not missing, f"{block.where}: {missing} are not files of this repository"
    texts = "\n".join((ROOT / path).read_text() for path in named)
    for words in commands_of(block.source):
        program = Path(_program(words)[0]).name
        assert program in texts, f"{block.where}: none of {named} runs {program}"


def _program(words: list[str]) -> list[str]:
    """A command's words less the assignments before its program (``A=1 airflow ...``); [] for a
    command that only assigns."""
    rest = list(words)
    while rest and _ASSIGNMENT.match(rest[0]):
        rest.pop(0)
    return rest


# -- what a command did ----------------------------------------------------------------------------


def _traced(trace: str) -> list[list[str]]:
    """The commands bash ran, as their words after expansion, from its trace (``set -x``)."""
    chunks = trace.split(f"\n{TRACE_MARK}")
    chunks[0] = chunks[0].removeprefix(TRACE_MARK)
    return [shlex.split(chunk) for chunk in chunks if chunk.strip()]


def _assignments(commands: list[list[str]]) -> list[tuple[str, str]]:
    """(name, value) of each variable the commands set, in order: ``NAME=value`` or ``export NAME=value``
    (not one set for a program's run alone, ``NAME=value program``)."""
    found = []
    for words in commands:
        if words[:1] == ["export"]:
            words = words[1:]
        elif _program(words):
            continue
        for word in words:
            if _ASSIGNMENT.match(word):
                name, value = word.split("=", 1)
                # bash traces ``export NAME=value`` as the export, then the assignment: one of them.
                if not found or found[-1] != (name, value):
                    found.append((name, value))
    return found


def _check_connection(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``AIRFLOW_CONN_<ID>`` value, as Airflow's environment backend and the provider's hook read it."""
    from airflow_provider_raybatch.hooks.ray import RayHook

    given = json.loads(value)
    conn_id = name.removeprefix("AIRFLOW_CONN_").lower()
    monkeypatch.setenv(name, value)
    settings = RayHook(ray_conn_id=conn_id).settings

    assert given["conn_type"] == "ray"
    host = given["host"] if "://" in given["host"] else f"http://{given['host']}"
    assert settings.base_url == host + (f":{given['port']}" if "port" in given else ""), settings.base_url
    assert settings.headers["Authorization"] == f"Bearer {given['password']}"
    if "verify" in given.get("extra", {}):
        assert settings.verify == given["extra"]["verify"]


def _check_lineage_transport(value: str) -> None:
    """An ``AIRFLOW__OPENLINEAGE__TRANSPORT`` value, built as the OpenLineage provider builds it."""
    transport_module = pytest.importorskip("openlineage.client.transport")
    config = json.loads(value)
    transport = transport_module.get_default_factory().create(config)
    assert transport.kind == config["type"]


#: What a variable a block sets does, by name.
VARIABLE_CHECKS: dict[str, Callable[[str, str, pytest.MonkeyPatch], None]] = {
    "AIRFLOW_CONN_": _check_connection,
    "AIRFLOW__OPENLINEAGE__TRANSPORT": lambda _name, value, _patch: _check_lineage_transport(value),
}


def _rows(home: Path, query: str, *args: object) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
        return db.execute(query, args).fetchall()


def _check_backfill(parsed: argparse.Namespace, home: Path) -> None:
    """``airflow backfill create``: one backfill of the DAG over the dates, a run a day with the conf;
    a dry run creates none."""
    backfills = _rows(
        home,
        "SELECT id, max_active_runs, dag_run_conf FROM backfill WHERE dag_id = ? AND date(from_date) = ? "
        "AND date(to_date) = ?",
        parsed.dag_id,
        parsed.from_date.date().isoformat(),
        parsed.to_date.date().isoformat(),
    )
    if parsed.dry_run:
        return  # a later command of the block may create it: the trace's order is not the check's
    assert len(backfills) == 1, backfills
    backfill_id, max_active_runs, conf = backfills[0]
    expected_conf = json.loads(parsed.dag_run_conf or "{}")
    assert (json.loads(conf) or {}) == expected_conf  # none given: stored as null
    if parsed.max_active_runs is not None:
        assert max_active_runs == parsed.max_active_runs
    runs = _rows(home, "SELECT date(logical_date), conf FROM dag_run WHERE backfill_id = ?", backfill_id)
    days = (parsed.to_date - parsed.from_date).days + 1
    first = parsed.from_date.date()
    assert sorted(day for day, _ in runs) == [(first + timedelta(days=n)).isoformat() for n in range(days)]
    assert all((json.loads(run_conf) or {}) == expected_conf for _, run_conf in runs), runs


def _check_pool(parsed: argparse.Namespace, home: Path) -> None:
    """``airflow pools set``: the pool, its slots, description and deferred tasks' counting."""
    rows = _rows(
        home, "SELECT slots, description, include_deferred FROM slot_pool WHERE pool = ?", parsed.pool
    )
    assert rows == [(parsed.slots, parsed.description, int(parsed.include_deferred))], rows


def _check_cleared(parsed: argparse.Namespace, home: Path) -> None:
    """``airflow tasks clear``: the matching task of the date's run is cleared, its others are not."""
    states = _rows(
        home,
        "SELECT ti.task_id, ti.state FROM task_instance ti JOIN dag_run r ON ti.run_id = r.run_id "
        "AND ti.dag_id = r.dag_id WHERE r.dag_id = ? AND date(r.logical_date) BETWEEN ? AND ?",
        parsed.dag_id,
        parsed.start_date.date().isoformat(),
        parsed.end_date.date().isoformat(),
    )
    assert states, f"no run of {parsed.dag_id} between the dates"
    for task_id, state in states:
        cleared = re.search(parsed.task_regex, task_id) is not None
        assert (state is None) == cleared, (task_id, state)


#: What an ``airflow`` command a block runs does, by its subcommand.
AIRFLOW_CHECKS: dict[tuple[str, str], Callable[[argparse.Namespace, Path], None]] = {
    ("backfill", "create"): _check_backfill,
    ("pools", "set"): _check_pool,
    ("tasks", "clear"): _check_cleared,
}


# -- the sandbox ----------------------------------------------------------------------------------


def _sandbox_env(home: Path) -> dict[str, str]:
    """A reader's shell with an Airflow home of its own: nothing of this machine's Airflow settings."""
    kept = {name: os.environ[name] for name in ("HOME", "LANG", "PYTHONPATH", "TMPDIR") if name in os.environ}
    return {
        **kept,
        "PATH": f"{AIRFLOW.parent}:/usr/local/bin:/usr/bin:/bin",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }


def _airflow(home: Path, *args: str) -> None:
    done = subprocess.run(
        [str(AIRFLOW), *args], env=_sandbox_env(home), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"airflow {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


@pytest.fixture(scope="module")
def migrated_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow home whose database knows the example DAGs; each block gets a copy of it."""
    home = tmp_path_factory.mktemp("airflow-home")
    _airflow(home, "db", "migrate")
    _airflow(home, "dags", "reserialize")
    return home


@pytest.fixture(scope="module")
def airflow_parser() -> argparse.ArgumentParser:
    from airflow.cli import cli_parser

    return cli_parser.get_parser()


def _parsed(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    with contextlib.redirect_stderr(io.StringIO()):
        return parser.parse_args(words[1:])


def _ran_and_succeeded(home: Path, parsed: argparse.Namespace) -> None:
    """The run a ``tasks clear`` acts on: the date's, every task of it succeeded."""
    logical_date = parsed.start_date.date().isoformat()
    _airflow(home, "dags", "trigger", parsed.dag_id, "--logical-date", f"{logical_date}T00:00:00+00:00")
    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db, db:
        db.execute("UPDATE task_instance SET state = 'success' WHERE dag_id = ?", (parsed.dag_id,))
        db.execute("UPDATE dag_run SET state = 'success' WHERE dag_id = ?", (parsed.dag_id,))


@pytest.mark.parametrize("block", TO_RUN, ids=_ids(TO_RUN))
def test_every_command_block_runs_and_does_what_the_page_says(
    block: Block,
    migrated_home: Path,
    airflow_parser: argparse.ArgumentParser,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    commands = commands_of(block.source)
    for words in commands:
        program = _program(words)
        if program[:1] == ["export"]:
            continue
        assert not program or program[0] == "airflow", (
            f"{block.where} runs {program[0]!r}, which this test does not run here: mark the block "
            f"'<!-- {NOT_RUN} <why> -->' (and say why in the page) or '<!-- {RUN_BY} <file> -->'"
        )
        if program:
            subcommand = tuple(program[1:3])
            assert subcommand in AIRFLOW_CHECKS, (
                f"{block.where}: no check for `airflow {' '.join(subcommand)}`: add one to AIRFLOW_CHECKS"
            )
    home = tmp_path / "airflow-home"
    home.mkdir()
    shutil.copy(migrated_home / "airflow.db", home / "airflow.db")
    for words in commands:
        if _program(words)[:3] == ["airflow", "tasks", "clear"]:
            _ran_and_succeeded(home, _parsed(airflow_parser, _program(words)))

    trace = tmp_path / "trace"
    # PS4 set here: bash run as root takes none from its environment.
    script = (
        f"exec {{trace}}>{shlex.quote(str(trace))}\nBASH_XTRACEFD=$trace\nPS4={shlex.quote(TRACE_MARK)}\n"
        f"set -x\n{block.source}"
    )
    ran = subprocess.run(
        ["bash", "-e", "-c", script],
        env=_sandbox_env(home),
        input="y\n" * 10,  # a reader's answer to "Are you sure? [y/n]"
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )

    assert ran.returncode == 0, f"{block.where}:\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
    traced = _traced(trace.read_text())
    ran_airflow = [words for words in traced if words and Path(words[0]).name == "airflow"]
    assert len(ran_airflow) == sum(_program(words)[:1] == ["airflow"] for words in commands), traced
    for words in ran_airflow:
        parsed = _parsed(airflow_parser, words)
        AIRFLOW_CHECKS[(words[1], words[2])](parsed, home)
    assignments = _assignments(traced)
    assert [name for name, _ in assignments] == [name for name, _ in _assignments(commands)], traced
    for name, value in assignments:
        check = next((check for prefix, check in VARIABLE_CHECKS.items() if name.startswith(prefix)), None)
        assert check is not None, f"{block.where} sets {name}: add what it does to VARIABLE_CHECKS"
        check(name, value, monkeypatch)
