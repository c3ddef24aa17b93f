"""Values a batch task may take that are most likely not what was meant, warned of as the DAG is parsed
and by validate(): a misspelled engine argument, resource or runtime_env field, and a preprocess
whose prompt the template silently replaces (operators/likely_mistakes.py)."""

from __future__ import annotations

import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.dag_processing.dagbag import DagBag

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.user_functions import keys_set_by

REQUIRED = {"task_id": "classify", "model": "m", "input_uri": "s3://b/in.jsonl", "output_uri": "s3://b/out"}
MODULE = "raybatch_lm_rows"


def warned(**kwargs: Any) -> list[str]:  # Any: operator arguments.
    """What building the task warns of."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RayLLMBatchOperator(**{**REQUIRED, **kwargs})
    return [str(warning.message) for warning in caught]


@pytest.fixture
def rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A DAG author's row functions beside the DAG: read for the keys they set, never imported."""
    (tmp_path / f"{MODULE}.py").write_text(
        textwrap.dedent(
            """
            def to_messages(row):
                return {**row, "messages": [{"role": "user", "content": row["text"]}]}

            def to_prompt(row):
                row["prompt"] = "Summarise: " + row["text"]
                return row

            def to_both(row):
                return dict(row, messages=[], prompt="x")

            def clean(row):
                row.update(Company=row["Company"].strip())
                return {**row, "Domain": "example.com"}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(MODULE, None)


@pytest.mark.parametrize(
    ("function", "keys"),
    [
        ("to_messages", {"messages", "role", "content"}),
        ("to_prompt", {"prompt"}),
        ("to_both", {"messages", "prompt"}),
        ("clean", {"Company", "Domain"}),
        ("missing", None),
    ],
)
def test_the_keys_a_row_function_sets_are_read_from_its_source(
    rows: Path, function: str, keys: set | None
) -> None:
    found = keys_set_by(f"{MODULE}.{function}")
    assert found == (frozenset(keys) if keys is not None else None)
    assert MODULE not in sys.modules


def test_a_module_not_found_here_tells_nothing() -> None:
    assert keys_set_by("raybatch_lm_elsewhere.to_messages") is None


def test_a_preprocess_returning_messages_beside_user_template_is_warned_of(rows: Path) -> None:
    [message] = warned(preprocess=f"{MODULE}.to_messages", user_template="{text}", system_prompt="Be brief.")

    assert message == (
        f"RayLLMBatchOperator (task_id: classify): preprocess='{MODULE}.to_messages' returns 'messages', but "
        "each row's prompt is built from user_template (with system_prompt): the model never sees the "
        "'messages' preprocess returns. To prompt with it, leave user_template and system_prompt unset; to "
        "use the template, have preprocess return the columns it reads instead."
    )


@pytest.mark.parametrize(
    ("kwargs", "returned", "used"),
    [
        ({"preprocess": f"{MODULE}.to_prompt", "user_template": "{text}"}, "'prompt'", "user_template"),
        (
            {"preprocess": f"{MODULE}.to_both", "messages_column": "messages"},
            "'prompt'",
            "messages_column='messages'",
        ),
        (
            {"preprocess": f"{MODULE}.to_messages", "messages_column": "chat"},
            "'messages'",
            "messages_column='chat'",
        ),
    ],
)
def test_a_preprocess_prompt_the_spec_never_uses_is_warned_of(
    rows: Path, kwargs: dict[str, str], returned: str, used: str
) -> None:
    [message] = warned(**kwargs)
    assert f"returns {returned}, but each row's prompt is built from {used}" in message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"preprocess": f"{MODULE}.to_messages"},  # its messages are the prompt: Ray Data LLM's way
        {"preprocess": f"{MODULE}.to_messages", "messages_column": "messages"},  # read from that column
        {"preprocess": f"{MODULE}.clean", "user_template": "{Company} ({Domain})"},
        {"preprocess": "raybatch_lm_elsewhere.to_messages", "user_template": "{text}"},  # source not here
    ],
)
def test_a_preprocess_whose_prompt_is_used_or_unknown_is_not_warned_of(rows: Path, kwargs: dict) -> None:
    assert warned(**kwargs) == []


def test_the_combinations_no_spec_can_use_are_errors() -> None:
    """The template beside the messages column, or a system prompt without a template: never used."""
    with pytest.raises(BatchSpecError, match="messages_column and user_template are exclusive"):
        RayLLMBatchOperator(**REQUIRED, messages_column="messages", user_template="{text}")
    with pytest.raises(BatchSpecError, match="system_prompt is only used with user_template"):
        RayLLMBatchOperator(**REQUIRED, messages_column="messages", system_prompt="Be brief.")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"engine_kwargs": {"max_model_length": 4096}},
            "engine_kwargs['max_model_length'] reads like vLLM's engine argument 'max_model_len': did you "
            "mean 'max_model_len'?",
        ),
        (
            {"engine_kwargs": {"gpu_memory_utilisation": 0.5}},
            "did you mean 'gpu_memory_utilization'?",
        ),
        (
            {"replica_resources": {"gpu": 1}},
            "replica_resources['gpu']: Ray's resource names are case-sensitive, and 'gpu' is not one of "
            "them (did you mean 'GPU'?)",
        ),
        ({"replica_resources": {"CPUs": 1}}, "(did you mean 'CPU'?)"),
        ({"entrypoint_resources": {"cpu": 1}}, "entrypoint_resources['cpu']: Ray's resource names"),
        (
            {"runtime_env": {"env_var": {"A": "1"}}},
            "runtime_env['env_var'] is not a field of Ray's runtime_env (did you mean 'env_vars'?)",
        ),
    ],
)
def test_a_misspelled_key_of_a_dict_parameter_is_warned_of(kwargs: dict, message: str) -> None:
    [said] = warned(user_template="{text}", **kwargs)
    assert said.startswith("RayLLMBatchOperator (task_id: classify): ") and message in said


@pytest.mark.parametrize(
    "kwargs",
    [
        # vLLM engine arguments missing from the common list: not taken for misspellings.
        {"engine_kwargs": {"max_cpu_loras": 2, "data_parallel_size": 2, "max_num_scheduled_tokens": 8}},
        {"replica_resources": {"CPU": 1, "accelerator_type:H100": 0.01, "head": 1}},
        {"runtime_env": {"env_vars": {"A": "1"}, "pip": ["x"], "my_plugin": {}}},
    ],
)
def test_keys_that_are_right_or_far_from_any_known_one_are_not_warned_of(kwargs: dict) -> None:
    assert warned(user_template="{text}", **kwargs) == []


def test_validate_warns_of_a_rendered_value() -> None:
    operator = RayLLMBatchOperator(
        **REQUIRED,
        user_template="{text}",
        engine_kwargs="{{ params.engine | tojson }}",
        params={"engine": {}},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        operator.validate({"params": {"engine": {"tensor_parallel": 2}}})
    [said] = [str(warning.message) for warning in caught]
    assert "engine_kwargs['tensor_parallel'] reads like vLLM's engine argument 'tensor_parallel_size'" in said


def test_a_dag_file_parsed_by_airflow_shows_the_warning(rows: Path) -> None:
    (rows / "summaries.py").write_text(
        textwrap.dedent(
            f"""
            from airflow.sdk import dag
            from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

            @dag(schedule=None)
            def summaries():
                RayLLMBatchOperator(
                    task_id="summarise", model="m", input_uri="s3://b/in.jsonl", output_uri="s3://b/out",
                    preprocess="{MODULE}.to_messages", user_template="Summarise: {{text}}",
                )

            summaries()
            """
        )
    )
    with warnings.catch_warnings(record=True) as caught, pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("always")
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        bag = DagBag(dag_folder=str(rows / "summaries.py"), safe_mode=False)

    assert bag.import_errors == {}
    said = [str(warning.message) for warning in caught if "preprocess=" in str(warning.message)]
    assert said and said[0].startswith(
        f"RayLLMBatchOperator (task_id: summarise): preprocess='{MODULE}.to_messages' returns 'messages'"
    )
