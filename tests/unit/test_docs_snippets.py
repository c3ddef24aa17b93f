"""The Python a reader copies from the README and docs/ runs: every block is Python, every
``RayLLMBatchOperator(...)`` call in it builds (its argument names exist, its literal values pass the
checks made as a DAG is parsed), and every block that defines a DAG parses as Airflow parses a DAGs
folder, its batch tasks validating for a day.

A call's ``...`` stands for the arguments the snippet leaves out: the test fills the required ones.
A value the snippet names (``LABELS``, ``PROFILE_SCHEMA``) is not evaluated: its argument's name is
still checked. The README's own DAG and validate() snippet are tests/unit/test_example_dags.py's.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.dag_processing.dagbag import DagBag

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from tests.unit.doc_blocks import fenced_blocks

#: What a snippet's ``...`` leaves out, where the call does not say it.
REQUIRED = {"task_id": "snippet", "model": "m", "input_uri": "s3://b/in.jsonl", "output_uri": "s3://b/out"}
PROMPT_SOURCES = {"user_template", "messages_column", "openai_endpoint", "preprocess"}


BLOCKS = fenced_blocks("python")
DAG_BLOCKS = [(where, source) for where, source in BLOCKS if "@dag(" in source]
CALLS = [
    (f"{where} (call at block line {call.lineno})", call)
    for where, source in BLOCKS
    if "@dag(" not in source
    for call in ast.walk(ast.parse(source))
    if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "RayLLMBatchOperator"
]


def test_the_docs_have_snippets_to_check() -> None:
    assert len(BLOCKS) >= 15 and len(DAG_BLOCKS) >= 2 and len(CALLS) >= 7, (len(BLOCKS), len(CALLS))


@pytest.mark.parametrize(("where", "source"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_every_python_block_is_python(where: str, source: str) -> None:
    compile(source, where, "exec")


def _arguments(call: ast.Call) -> dict[str, Any]:  # Any: the snippet's literal values.
    """The call's keyword arguments: literal values as written; a value the snippet computes or names
    as a template of its argument where that argument is templated (its name is still checked)."""
    arguments: dict[str, Any] = {}
    for keyword in call.keywords:
        assert keyword.arg is not None, "a **mapping in a snippet: write the arguments out"
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            if keyword.arg in RayLLMBatchOperator.template_fields:
                arguments[keyword.arg] = f"{{{{ params.{keyword.arg} }}}}"
            elif keyword.arg not in RayLLMBatchOperator.__init__.__code__.co_varnames:
                arguments[keyword.arg] = None  # unknown: the operator refuses it by name
    return arguments


@pytest.mark.parametrize(("where", "call"), CALLS, ids=[where for where, _ in CALLS])
def test_every_operator_call_in_the_docs_builds(where: str, call: ast.Call) -> None:
    arguments = {**REQUIRED, **_arguments(call)}
    if not PROMPT_SOURCES & set(arguments):
        arguments["user_template"] = "{text}"
    RayLLMBatchOperator(**arguments)


@pytest.mark.parametrize(("where", "source"), DAG_BLOCKS, ids=[where for where, _ in DAG_BLOCKS])
def test_every_dag_in_the_docs_parses_and_its_batch_tasks_validate(
    where: str, source: str, tmp_path: Path
) -> None:
    (tmp_path / "snippet_dag.py").write_text(source)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")  # Airflow 3.2 adds its own examples
        bag = DagBag(dag_folder=str(tmp_path), safe_mode=False)

    assert bag.import_errors == {}, f"{where}: {bag.import_errors}"
    assert bag.dags, f"{where} defines no DAG (is its @dag function called?)"
    day = pendulum.datetime(2026, 11, 20, tz="UTC")
    for dag in bag.dags.values():
        for task in dag.tasks:
            if isinstance(task, RayLLMBatchOperator):
                spec = task.validate({"data_interval_start": day, "ds": "2026-11-20", "params": {}})
                templated = "{{" in str(task.input_uri)
                assert "2026-11-20" in spec.input_uri or not templated, (where, spec.input_uri)


#: The modules a page shows as files of the DAGs folder (a block starting ``# dags/<name>.py``).
MODULE_BLOCKS = [(where, source) for where, source in BLOCKS if source.startswith("# dags/")]
#: The test recipes a page gives a DAG author: blocks that define pytest test functions.
RECIPE_BLOCKS = [
    (where, source)
    for where, source in BLOCKS
    if any(
        isinstance(node, ast.FunctionDef) and node.name.startswith("test_") for node in ast.parse(source).body
    )
]


def test_the_docs_have_recipes_to_run() -> None:
    assert MODULE_BLOCKS and RECIPE_BLOCKS, (len(MODULE_BLOCKS), len(RECIPE_BLOCKS))


@pytest.mark.parametrize(("where", "source"), RECIPE_BLOCKS, ids=[where for where, _ in RECIPE_BLOCKS])
def test_every_test_recipe_in_the_docs_passes_on_the_docs_own_modules(
    where: str, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as the page says: the DAGs folder (the page's modules) on the path, each test_ function."""
    names = []
    for _, module in MODULE_BLOCKS:
        name = module.splitlines()[0].removeprefix("# dags/").strip()
        (tmp_path / name).write_text(module)
        names.append(name.removesuffix(".py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict[str, Any] = {"__name__": "docs_recipe"}  # Any: what the recipe defines.
    try:
        exec(compile(source, where, "exec"), namespace)  # noqa: S102 - the docs' own code, as a reader runs it
        tests = [value for key, value in namespace.items() if key.startswith("test_") and callable(value)]
        assert tests, f"{where} defines no test"
        for test in tests:
            test()
    finally:
        for name in names:
            sys.modules.pop(name, None)
