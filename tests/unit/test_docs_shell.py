"""The shell a reader copies from the README and docs/: every ```bash block is bash, every `airflow`
command in it is one Airflow's own command line takes (its subcommand and flags, parsed by Airflow's
parser, nothing run), every JSON it passes (a connection, a run's conf) is JSON, and every file of
this repository it names is there. Commands of other tools (docker, kubectl, pip) are checked for
bash syntax and the repository paths they name only. tests/unit/test_docs_commands.py runs the blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import subprocess
from typing import Any

import pytest

from tests.unit.doc_blocks import ROOT, fenced_blocks

#: Folders of this repository a command may name a file in.
REPO_FOLDERS = ("scripts", "docker", "deploy", "dags", "docs", "bench", "tests")


def commands_of(source: str) -> list[list[str]]:
    """Each command of a block as its words: continuation lines joined, and a line whose quote closes
    on a later line (a JSON value written over two lines) joined with those; comments dropped."""
    joined = re.sub(r"\\\n", " ", source)
    commands = []
    pending = ""
    for line in joined.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        pending = ""
        if words:
            commands.append(words)
    assert not pending, f"a quote never closes: {pending!r}"
    return commands


def _airflow_command(words: list[str]) -> list[str] | None:
    """The ``airflow ...`` words of a command: the whole of it, or what ``docker compose exec
    <service>`` runs; None for another tool's."""
    if words[0] == "airflow":
        return words
    if "exec" in words and "airflow" in words[words.index("exec") :]:
        return words[words.index("airflow", words.index("exec")) :]
    return None


BLOCKS = fenced_blocks("bash")
AIRFLOW_COMMANDS = [
    (where, command)
    for where, source in BLOCKS
    for words in commands_of(source)
    if (command := _airflow_command(words)) is not None
]


def test_the_docs_have_shell_to_check() -> None:
    assert len(BLOCKS) >= 20 and len(AIRFLOW_COMMANDS) >= 6, (len(BLOCKS), len(AIRFLOW_COMMANDS))


@pytest.mark.parametrize(("where", "source"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_every_bash_block_is_bash(where: str, source: str) -> None:
    checked = subprocess.run(["bash", "-n"], input=source, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, f"{where}: {checked.stderr}"


@pytest.mark.parametrize(("where", "source"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_every_repository_file_a_block_names_is_there(where: str, source: str) -> None:
    named = re.findall(rf"(?<![\w/.-])((?:{'|'.join(REPO_FOLDERS)})/[\w./-]*\w)", source)
    missing = [path for path in named if not (ROOT / path).exists()]
    assert not missing, f"{where}: {missing}"


def _json_arguments(words: list[str]) -> list[str]:
    """The values given as JSON: a connection in AIRFLOW_CONN_*, an OpenLineage transport, a --conf or
    --dag-run-conf."""
    values = [
        word.split("=", 1)[1]
        for word in words
        if re.match(r"AIRFLOW_CONN_\w+=|AIRFLOW__OPENLINEAGE__TRANSPORT=", word)
    ]
    values += [
        after for flag, after in zip(words, words[1:], strict=False) if flag in ("--conf", "--dag-run-conf")
    ]
    return values


@pytest.mark.parametrize(("where", "source"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_every_json_a_block_passes_is_json(where: str, source: str) -> None:
    for words in commands_of(source):
        for value in _json_arguments(words):
            try:
                json.loads(value)
            except json.JSONDecodeError as err:
                raise AssertionError(f"{where}: {value!r} is not JSON: {err}") from err


@pytest.fixture(scope="module")
def airflow_parser() -> argparse.ArgumentParser:
    from airflow.cli import cli_parser

    return cli_parser.get_parser()


@pytest.mark.parametrize(
    ("where", "words"),
    AIRFLOW_COMMANDS,
    ids=[f"{where} {' '.join(words[:3])}" for where, words in AIRFLOW_COMMANDS],
)
def test_every_airflow_command_is_one_airflow_takes(where: str, words: list[str], airflow_parser) -> None:  # noqa: ANN001
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            airflow_parser.parse_args(words[1:])
    except SystemExit as exit_:
        assert exit_.code == 0, f"{where}: {' '.join(words)}\n{errors.getvalue()}"


@pytest.fixture(scope="module")
def example_dags() -> dict[str, Any]:  # Any: Airflow's DAG objects, by id.
    """The repository's DAGs folder, as the commands in the docs run against it."""
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")  # Airflow 3.2 adds its own examples
        bag = DagBag(dag_folder=str(ROOT / "dags"), safe_mode=False)
    return dict(bag.dags)


@pytest.mark.parametrize(
    ("where", "words"),
    AIRFLOW_COMMANDS,
    ids=[f"{where} {' '.join(words[:3])}" for where, words in AIRFLOW_COMMANDS],
)
def test_every_dag_task_and_conf_key_a_command_names_is_the_examples(
    where: str,
    words: list[str],
    airflow_parser: argparse.ArgumentParser,
    example_dags: dict[str, Any],  # Any: DAGs.
) -> None:
    """The DAG a command runs is an example DAG, the task it clears is one of that DAG's, and each key of
    the conf it passes is one of that DAG's Params (a key that is none would be refused or ignored)."""
    with contextlib.redirect_stderr(io.StringIO()):
        parsed = airflow_parser.parse_args(words[1:])
    dag_id = getattr(parsed, "dag_id", None)
    if dag_id is None:
        return  # a command about no DAG (pools, connections)
    assert dag_id in example_dags, f"{where}: no example DAG {dag_id!r} (there are {sorted(example_dags)})"
    dag = example_dags[dag_id]
    task_regex = getattr(parsed, "task_regex", None)
    if task_regex:
        assert any(re.search(task_regex, task_id) for task_id in dag.task_ids), f"{where}: {task_regex!r}"
    for flag in ("conf", "dag_run_conf"):
        if text := getattr(parsed, flag, None):
            unknown = set(json.loads(text)) - set(dag.params)
            assert not unknown, (
                f"{where}: {sorted(unknown)} are not Params of {dag_id} ({sorted(dag.params)})"
            )
