"""A mapped batch task (``partial(...).expand(...)``) in a real DAG file parsed by Airflow's DagBag:
``partial``'s values written as is and each map index the file lists are checked as the DAG is
parsed, an error naming the map index; ``validate_mapped`` validates every map index in a DAG's test
(operators/mapped_tasks.py)."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pendulum
import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.definitions._internal.expandinput import DictOfListsExpandInput

from airflow_provider_raybatch.operators import mapped_tasks
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.exceptions import BatchSpecError

DAY = pendulum.datetime(2026, 11, 20, tz="UTC")


def parse(folder: Path, body: str, schedule: str = "None") -> DagBag:
    """Parse a DAG file whose @dag function holds ``body`` (``files`` is an upstream task)."""
    source = textwrap.dedent(
        """
        from airflow.sdk import dag, task
        from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

        @dag(schedule={schedule}, start_date=__import__("datetime").datetime(2026, 1, 1), catchup=False)
        def mapped_batches():
            @task
            def files():
                return ["s3://b/a.jsonl"]

        {body}

        mapped_batches()
        """
    ).format(schedule=schedule, body=textwrap.indent(textwrap.dedent(body), "    "))
    (folder / "mapped.py").write_text(source)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")  # Airflow 3.2 adds its own examples
        return DagBag(dag_folder=str(folder), safe_mode=False)


def import_error(bag: DagBag) -> str:
    [error] = bag.import_errors.values()
    return error.strip().splitlines()[-1]


PARTIAL = (
    'RayLLMBatchOperator.partial(task_id="classify", model="m", output_uri="s3://b/out", '
    'user_template="{text}"'
)


def test_a_mapped_task_whose_values_are_right_parses(tmp_path: Path) -> None:
    bag = parse(tmp_path, PARTIAL + ').expand(input_uri=["s3://b/a.jsonl", "s3://b/b.jsonl"])')

    assert bag.import_errors == {}
    assert bag.dags["mapped_batches"].get_task("classify").operator_class is RayLLMBatchOperator


def test_a_mapped_value_that_is_wrong_fails_the_parse_naming_its_map_index(tmp_path: Path) -> None:
    bag = parse(tmp_path, PARTIAL + ').expand(input_uri=["s3://b/a.jsonl", "s3://b/b.jsonl.gz"])')

    assert import_error(bag).startswith(
        "airflow_provider_raybatch.exceptions.BatchSpecError: RayLLMBatchOperator (task_id: classify, map "
        "index 1: input_uri='s3://b/b.jsonl.gz'): Invalid batch job spec: input_uri='s3://b/b.jsonl.gz' "
        "names a compressed file (.gz)"
    )


def test_a_wrong_value_given_to_partial_fails_the_parse_though_the_input_is_an_xcom(tmp_path: Path) -> None:
    bag = parse(
        tmp_path,
        'RayLLMBatchOperator.partial(task_id="classify", model="m", output_uri="s3://b/out", '
        'user_template="{text}", concurrency=0).expand(input_uri=files())',
    )

    assert import_error(bag).endswith(
        "RayLLMBatchOperator (task_id: classify): Invalid batch job spec: concurrency=0 must be an int "
        "greater than 0 or a (min, max) pair of ints > 0."
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            PARTIAL + ", keep_warm_second=60).expand(input_uri=files())",
            "TypeError: RayLLMBatchOperator.partial() (task_id: classify) got unknown argument "
            "'keep_warm_second' (did you mean 'keep_warm_seconds'?).",
        ),
        (
            PARTIAL + ").expand(input_uris=files())",
            "TypeError: RayLLMBatchOperator.expand() got unknown argument 'input_uris' "
            "(did you mean 'input_uri'?).",
        ),
    ],
)
def test_a_misspelled_argument_of_partial_or_expand_names_its_likely_spelling(
    tmp_path: Path, body: str, message: str
) -> None:
    assert import_error(parse(tmp_path, body)) == message


def test_the_map_index_named_is_airflows_over_two_mapped_arguments(tmp_path: Path) -> None:
    """expand(a=[...], b=[...]) maps over every pair, the last argument varying fastest."""
    bag = parse(
        tmp_path,
        'RayLLMBatchOperator.partial(task_id="classify", model="m", user_template="{text}").expand(\n'
        '    input_uri=["s3://b/a.jsonl", "s3://b/b.jsonl"],\n'
        '    output_uri=["s3://o/1", "s3://b/b.jsonl", "s3://o/3"],\n'
        ")",
    )

    # Map index 4 is the pair (b.jsonl, b.jsonl): output_uri equal to input_uri.
    assert "(task_id: classify, map index 4: input_uri='s3://b/b.jsonl', output_uri='s3://b/b.jsonl')" in (
        import_error(bag)
    )
    expand_input = DictOfListsExpandInput(
        {
            "input_uri": ["s3://b/a.jsonl", "s3://b/b.jsonl"],
            "output_uri": ["s3://o/1", "s3://b/b.jsonl", "s3://o/3"],
        }
    )
    lengths = {"input_uri": 2, "output_uri": 3}
    assert [
        expand_input._expand_mapped_field(key, expand_input.value[key], 4, lengths) for key in lengths
    ] == [
        "s3://b/b.jsonl",
        "s3://b/b.jsonl",
    ]


def test_expand_kwargs_names_the_dict_that_is_wrong(tmp_path: Path) -> None:
    bag = parse(
        tmp_path,
        'RayLLMBatchOperator.partial(task_id="classify", model="m", user_template="{text}").expand_kwargs([\n'
        '    {"input_uri": "s3://b/a.jsonl", "output_uri": "s3://o/a"},\n'
        '    {"input_uri": "s3://b/b.jsonl", "output_uri": "s3://o/b",\n'
        '     "sampling_params": {"max_token": 8}},\n'
        "])",
    )

    message = import_error(bag)
    assert "(task_id: classify, map index 1: {'input_uri': 's3://b/b.jsonl'" in message
    assert "sampling_params has unknown key 'max_token' (did you mean 'max_tokens'?)" in message


def test_a_templated_mapped_value_waits_for_validate_mapped(tmp_path: Path) -> None:
    bag = parse(
        tmp_path,
        PARTIAL + ").expand(input_uri=[\n"
        '    "s3://b/{{ data_interval_start | ds }}/a.jsonl",\n'
        '    "s3://b/{{ data_interval_start | ds }}/b.jsonl",\n'
        "])",
    )
    assert bag.import_errors == {}
    task = bag.dags["mapped_batches"].get_task("classify")

    specs = RayLLMBatchOperator.validate_mapped(task, {"data_interval_start": DAY})

    assert [spec.input_uri for spec in specs] == ["s3://b/2026-11-20/a.jsonl", "s3://b/2026-11-20/b.jsonl"]


def test_validate_mapped_names_the_map_index_whose_rendered_value_is_wrong(tmp_path: Path) -> None:
    bag = parse(
        tmp_path,
        PARTIAL + ', concurrency="{{ params.replicas }}", params={"replicas": 2})'
        '.expand(input_uri=["s3://b/a.jsonl", "s3://b/b.jsonl"])',
    )
    task = bag.dags["mapped_batches"].get_task("classify")

    with pytest.raises(
        BatchSpecError,
        match=r"\(task_id: classify, map index 0: "
        r"input_uri='s3://b/a.jsonl'\): "
        r"Invalid batch job spec: concurrency='two' must be an int",
    ):
        RayLLMBatchOperator.validate_mapped(task, {"params": {"replicas": "two"}})


def test_validate_mapped_takes_an_xcoms_values_from_the_test(tmp_path: Path) -> None:
    bag = parse(tmp_path, PARTIAL + ").expand(input_uri=files())")
    assert bag.import_errors == {}
    task = bag.dags["mapped_batches"].get_task("classify")

    with pytest.raises(
        BatchSpecError,
        match=r"input_uri is mapped over .* give its values, "
        r"validate_mapped\(task, context, expand=\{'input_uri': \[...\]\}\)",
    ):
        RayLLMBatchOperator.validate_mapped(task)
    with pytest.raises(BatchSpecError, match=r"\(task_id: classify, map index 1: input_uri='s3://b/x.gz'\)"):
        RayLLMBatchOperator.validate_mapped(task, expand={"input_uri": ["s3://b/a.jsonl", "s3://b/x.gz"]})
    specs = RayLLMBatchOperator.validate_mapped(
        task, expand={"input_uri": ["s3://b/a.jsonl", "s3://b/b.csv"]}
    )
    assert [spec.resolved_input_format for spec in specs] == ["jsonl", "csv"]


def test_validate_mapped_refuses_a_task_that_is_not_mapped() -> None:
    task = RayLLMBatchOperator(
        task_id="classify", model="m", input_uri="a.jsonl", output_uri="o", user_template="{t}"
    )
    with pytest.raises(TypeError, match=r"use task.validate\(\)"):
        RayLLMBatchOperator.validate_mapped(task)  # type: ignore[arg-type]


def test_past_the_parse_time_limit_every_listed_value_is_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mapped_tasks, "MAX_PARSE_TIME_INDEXES", 4)
    bag = parse(
        tmp_path,
        'RayLLMBatchOperator.partial(task_id="classify", model="m", user_template="{text}").expand(\n'
        '    input_uri=["s3://b/a.jsonl", "s3://b/b.jsonl", "s3://b/c.jsonl", "s3://b/d.jsonl"],\n'
        '    output_uri=["s3://o/1", "s3://o/2", "s3://b/c.jsonl"],\n'
        ")",
    )  # 12 map indexes: the n-th pairs are (a, 1), (b, 2), (c, c.jsonl), (d, 1)

    assert "(task_id: classify, map index 8: input_uri='s3://b/c.jsonl', output_uri='s3://b/c.jsonl')" in (
        import_error(bag)
    )


def test_a_warning_every_map_index_gives_is_said_once(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = parse(
            tmp_path,
            'RayLLMBatchOperator.partial(task_id="classify", model="m", '
            'input_uri="s3://b/{{ ds }}/in.jsonl", '
            'user_template="{text}").expand(output_uri=["s3://o/1", "s3://o/2", "s3://o/3"])',
            schedule='"@daily"',
        )
    assert bag.import_errors == {}
    said = [str(warning.message) for warning in caught if "reads the run's own date" in str(warning.message)]
    assert len(said) == 1 and said[0].startswith("RayLLMBatchOperator (task_id: classify): input_uri=")
