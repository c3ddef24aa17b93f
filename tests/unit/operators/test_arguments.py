"""A DAG author's mistakes, caught as the DAG is parsed: a misspelled argument or key names its likely
spelling, a literal value is checked when the task is built, a templated one by ``validate()``, and no
message shows pydantic's type names or the whole spec."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_raybatch.operators import arguments
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.exceptions import BatchSpecError

REQUIRED = {"task_id": "classify", "model": "m", "input_uri": "s3://b/in.jsonl", "output_uri": "s3://b/out"}


def build(**kwargs: Any) -> RayLLMBatchOperator:  # Any: operator arguments.
    return RayLLMBatchOperator(**{**REQUIRED, "user_template": "Industry of {Company}?", **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sampling_param": {}}, "got unknown argument 'sampling_param' (did you mean 'sampling_params'?)"),
        ({"retrys": 2}, "got unknown argument 'retrys' (did you mean 'retries'?)"),
        (
            {"concurency": 2, "keep_warm": 60},
            "got unknown arguments 'concurency' (did you mean 'concurrency'?), "
            "'keep_warm' (did you mean 'keep_warm_seconds'?)",
        ),
        ({"zzzzzz": 1}, "got unknown argument 'zzzzzz'"),
        # A notebook's names: where each goes here, not the nearest spelling of something else.
        (
            {"max_num_batched_tokens": 4096},
            "got unknown argument 'max_num_batched_tokens' (a vLLM engine argument: pass it in "
            "engine_kwargs={'max_num_batched_tokens': ...})",
        ),
        (
            {"max_tokens": 8},
            "got unknown argument 'max_tokens' (a vLLM sampling parameter: pass it in "
            "sampling_params={'max_tokens': ...})",
        ),
        (
            {"temprature": 0},
            "got unknown argument 'temprature' (did you mean sampling_params={'temperature': ...}?)",
        ),
        (
            {"apply_chat_template": True},
            "got unknown argument 'apply_chat_template' (a Ray Data LLM setting, of "
            "vLLMEngineProcessorConfig, Ray 2.57 (deprecated); here: Not taken: see chat_template_stage)",
        ),
        (
            {"model_source": "m"},
            "got unknown argument 'model_source' (a Ray Data LLM setting, of vLLMEngineProcessorConfig; "
            "here: model: a Hugging Face id or a folder is passed as is;",
        ),
    ],
)
def test_a_misspelled_argument_names_its_likely_spelling_and_the_task(kwargs: dict, message: str) -> None:
    with pytest.raises(TypeError) as info:
        build(**kwargs)

    assert str(info.value).startswith(f"RayLLMBatchOperator (task_id: classify) {message}")


def test_a_function_passed_as_preprocess_is_refused_with_its_dotted_path_to_use() -> None:
    def clean_company(row: dict) -> dict:
        return row

    with pytest.raises(TypeError) as info:
        build(preprocess=clean_company)

    assert str(info.value).startswith("RayLLMBatchOperator (task_id: classify): preprocess=<function ")
    assert "is a function; pass its dotted path as text, e.g. preprocess='my_rows.clean_company'" in str(
        info.value
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": "two"}, "concurrency='two' must be an int or a (min, max) pair of ints > 0."),
        ({"concurrency": 0}, "concurrency=0 must be an int greater than 0 or a (min, max) pair of ints > 0."),
        ({"concurrency": [1, 2, 3]}, "concurrency=(1, 2, 3) must be an int or a (min, max) pair"),
        ({"image_size": (0, 448)}, "image_size=(0, 448) must be a (width, height) pair of ints > 0."),
        ({"replica_resources": {"GPU": "one"}}, "replica_resources['GPU']='one' must be a number."),
        ({"batch_size": 0}, "batch_size=0 must be greater than 0."),
        ({"batch_size": "x"}, "batch_size='x' must be an int."),
        (
            {"sampling_params": {"max_token": 8}},
            "sampling_params has unknown key 'max_token' (did you mean 'max_tokens'?).",
        ),
        (
            {"sampling_params": {"structured_outputs": {"choise": ["a"]}}},
            "sampling_params['structured_outputs'] has unknown key 'choise' (did you mean 'choice'?).",
        ),
        ({"preprocess": "my module.fn"}, "preprocess='my module.fn' is not a dotted path"),
        (
            {"keep_warm_seconds": 60, "engine_kwargs": {"tensor_parallel_size": 2}},
            "keep_warm_seconds=60 with engine_kwargs {'tensor_parallel_size': 2}: a warm pool holds one-GPU "
            "engines only",
        ),
    ],
)
def test_a_literal_mistake_fails_as_the_task_is_built(kwargs: dict, message: str) -> None:
    with pytest.raises(BatchSpecError) as info:
        build(**kwargs)

    text = str(info.value)
    assert message in text
    pydantic_words = ("constrained-int", "tuple[", "Input should be", "Tuple should")
    for internal in (*pydantic_words, "'model': 'm'", "(got {"):
        assert internal not in text  # no pydantic type names, no copy of the whole spec


def test_an_unknown_key_far_from_any_lists_the_allowed_ones() -> None:
    with pytest.raises(BatchSpecError) as info:
        build(sampling_params={"zzzzzz": 1})

    assert "sampling_params has unknown key 'zzzzzz'; allowed: [" in str(info.value)
    assert "'max_tokens'" in str(info.value)


def test_beside_a_templated_parameter_the_literal_ones_are_checked_alone() -> None:
    # input_uri is rendered at run time; the literal values are checked now, each on its own...
    with pytest.raises(BatchSpecError, match=r"concurrency='two' must be an int"):
        build(input_uri="s3://b/{{ data_interval_start | ds }}/in.jsonl", concurrency="two")
    # ...and a check across parameters, one of them templated, waits for validate() or the run.
    op = build(
        keep_warm_seconds="{{ params.keep_warm }}",
        engine_kwargs={"tensor_parallel_size": 2},
        params={"keep_warm": 60},
    )
    with pytest.raises(BatchSpecError, match="a warm pool holds one-GPU engines only"):
        op.validate()


def test_validate_renders_as_a_run_would_and_leaves_the_task_as_written() -> None:
    op = build(
        input_uri="s3://b/{{ data_interval_start | ds }}/in.jsonl",
        concurrency="{{ params.replicas }}",
        params={"replicas": 2},
    )

    spec = op.validate({"data_interval_start": pendulum.datetime(2026, 11, 20, tz="UTC")})

    assert (spec.input_uri, spec.concurrency) == ("s3://b/2026-11-20/in.jsonl", 2)
    assert op.input_uri == "s3://b/{{ data_interval_start | ds }}/in.jsonl"  # the task is unchanged
    with pytest.raises(BatchSpecError, match="concurrency='two' must be an int"):
        op.validate({"data_interval_start": pendulum.datetime(2026, 11, 20), "params": {"replicas": "two"}})
    with pytest.raises(Exception, match="data_interval_start"):  # Jinja names what the context lacks
        op.validate()


def test_validate_names_a_variable_the_context_lacks_instead_of_rendering_it_empty() -> None:
    """Jinja renders an undefined ``{{ ds }}`` as nothing: a DAG's test passed with s3://b//in.jsonl."""
    op = build(input_uri="s3://b/{{ ds }}/in.jsonl")

    with pytest.raises(BatchSpecError, match="'ds' is undefined. Pass it in validate"):
        op.validate({"params": {}})
    assert op.validate({"ds": "2026-11-20"}).input_uri == "s3://b/2026-11-20/in.jsonl"


def test_validate_takes_a_date_written_as_text() -> None:
    """A DAG's test writes the day as text: it renders as the datetime a run's context holds."""
    op = build(input_uri="s3://b/{{ data_interval_start | ds }}/{{ logical_date.strftime('%H') }}/in.jsonl")

    spec = op.validate({"data_interval_start": "2026-11-20", "logical_date": "2026-11-21T06:00:00+00:00"})

    assert spec.input_uri == "s3://b/2026-11-20/06/in.jsonl"


JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_LEAVES, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=12
)


@given(JSON_VALUES)
def test_plain_data_is_literal_unless_a_string_in_it_holds_a_template(value: object) -> None:
    def strings(v: object) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, dict):
            return [s for item in v.values() for s in strings(item)]
        if isinstance(v, list):
            return [s for item in v for s in strings(item)]
        return []

    templated = any("{{" in s or "{%" in s for s in strings(value))
    assert arguments.is_literal(value) is not templated
    assert arguments.is_literal(["x", {"k": value}]) is not templated


def test_a_value_known_only_at_run_time_is_not_literal() -> None:
    assert not arguments.is_literal(object())
    assert not arguments.is_literal({"k": [object()]})


@pytest.mark.parametrize("interval", [0, -1.0])
def test_a_poll_interval_that_is_not_positive_fails_before_any_job(interval: float) -> None:
    # A deferred task builds its trigger after submitting: checked only there, the job ran on.
    with pytest.raises(ValueError, match=rf"poll_interval_seconds={interval!r} must be > 0"):
        build(poll_interval_seconds=interval, deferrable=True)


DATED = {"input_uri": "s3://b/{{ data_interval_start | ds }}/in.jsonl", "output_uri": "s3://b/out/{{ ds }}"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"image_column": "photo", "keep_columns": ["title", "photo"]},
            "image_column='photo' is in keep_columns",
        ),
        ({"sampling_params": {"n": 3}}, "sampling_params['n']=3 is not supported for rows"),
        ({"user_template": "Summarise {0}"}, "user_template='Summarise {0}' has a positional field {0}"),
        ({"image_size": (448, 448)}, "image_size=(448, 448) needs image_column"),
        (
            {"keep_warm_seconds": 60, "engine_kwargs": {"tensor_parallel_size": 2}},
            "keep_warm_seconds=60 with engine_kwargs {'tensor_parallel_size': 2}",
        ),
        ({"user_template": "{{ params.prompt }}", "image_size": (448, 448)}, "needs image_column"),
    ],
)
def test_checks_across_literal_parameters_run_at_parse_beside_templated_dates(
    kwargs: dict, message: str
) -> None:
    """A daily DAG templates its dates into the URIs: the checks that involve only values written as
    they are still run as the DAG is parsed."""
    with pytest.raises(BatchSpecError, match=re.escape(message)):
        build(**DATED, **kwargs)


def test_a_check_across_a_templated_parameter_waits_for_its_value() -> None:
    build(**DATED, user_template="{{ params.prompt }}", messages_column="messages")  # may render unset


def test_a_text_param_set_to_none_takes_its_default_and_a_required_one_is_refused() -> None:
    operator = build(
        **DATED,
        model="{{ params.model }}",
        system_prompt="{{ params.system }}",
        params={"model": None, "system": None},
    )
    context = {"data_interval_start": pendulum.datetime(2026, 11, 20, tz="UTC"), "ds": "2026-11-20"}

    with pytest.raises(BatchSpecError) as info:
        operator.validate(context)
    assert str(info.value).startswith("RayLLMBatchOperator (task_id: classify): model='None': a required")

    spec = operator.validate({**context, "params": {"model": "m"}})
    assert spec.system_prompt is None  # not the text 'None'


def test_a_template_in_a_parameter_airflow_does_not_render_is_refused() -> None:
    with pytest.raises(
        BatchSpecError, match=r"batch_size='\{\{ params.bs \}\}': batch_size is not templated"
    ):
        build(batch_size="{{ params.bs }}")


def test_the_field_a_doubled_brace_broke_is_named_as_the_dag_is_parsed() -> None:
    """Every run would fail to render it: the DAG's import fails instead (validate() said so before)."""
    with pytest.raises(BatchSpecError) as info:
        build(user_template='Answer as {{"label": "x"}}: {body}')
    assert str(info.value).startswith(
        "RayLLMBatchOperator (task_id: classify): user_template is not a valid Jinja template"
    )
    with pytest.raises(BatchSpecError, match="input_uri is not a valid Jinja template: unexpected '}'"):
        build(input_uri="s3://b/{{ params.day }/in.jsonl")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"sampling_params": {"guided_decoding": {"json": {}}}},
            "unknown key 'guided_decoding' (use structured_outputs",
        ),
        ({"sampling_params": {"guided_choice": ["a"]}}, "(use structured_outputs={'choice': [...]})"),
        # Other APIs' names, where difflib would suggest a wrong key ('min_tokens') or none.
        ({"sampling_params": {"max_completion_tokens": 8}}, "'max_completion_tokens' (use max_tokens)"),
        ({"sampling_params": {"stop_sequences": ["\n"]}}, "'stop_sequences' (use stop)"),
        (
            {"sampling_params": {"json_schema": {"type": "object"}}},
            "'json_schema' (use structured_outputs={'json': <the JSON schema>})",
        ),
        (
            {"sampling_params": {"response_format": {"type": "json_object"}}},
            "'response_format' (use structured_outputs={'json': <the JSON schema>} or {'json_object': True}",
        ),
        (
            {"sampling_params": {"structured_outputs": {"json_schema": {"type": "object"}}}},
            "sampling_params['structured_outputs'] has unknown key 'json_schema' (use 'json': the JSON "
            "schema itself",
        ),
        (
            {"sampling_params": {"structured_outputs": {"type": "json", "json": {}}}},
            "unknown key 'type' (use one key naming the kind, e.g. {'json': <schema>}",
        ),
    ],
)
def test_older_sampling_names_point_to_the_current_ones(kwargs: dict, message: str) -> None:
    with pytest.raises(BatchSpecError, match=re.escape(message)):
        build(**kwargs)


def test_an_input_format_in_capitals_is_taken_and_a_lambda_gets_a_named_example() -> None:
    assert build(input_format="JSONL").build_spec().input_format == "jsonl"
    with pytest.raises(TypeError, match=re.escape("e.g. preprocess='my_rows.my_function'")):
        build(preprocess=lambda row: row)


MISSING = "RayLLMBatchOperator (task_id: classify): missing required argument"


@pytest.mark.parametrize(
    ("kwargs", "left_out", "message"),
    [
        # Ray Data LLM's name for it: where it goes here, with the value given.
        (
            {"model_source": "Qwen/Qwen3-0.6B"},
            "model",
            f"{MISSING} 'model' (you passed model_source='Qwen/Qwen3-0.6B': in this operator it is "
            "model='Qwen/Qwen3-0.6B').",
        ),
        (
            {"modle": "m"},
            "model",
            f"{MISSING} 'model' (you passed modle='m': in this operator it is model='m').",
        ),
        (
            {"input_url": "s3://b/in.jsonl"},
            "input_uri",
            f"{MISSING} 'input_uri' (you passed input_url='s3://b/in.jsonl': in this operator it is "
            "input_uri='s3://b/in.jsonl').",
        ),
        # Nearer to input_asset than to input_uri, but input_uri is the one left out.
        ({"input_path": "/d/in.jsonl"}, "input_uri", "'input_uri' (you passed input_path='/d/in.jsonl': "),
        ({"output_dir": "/d/out"}, "output_uri", "'output_uri' (you passed output_dir='/d/out': "),
        # Nothing given in its place: the task and the argument, no guess.
        ({}, "model", f"{MISSING} 'model'."),
        # A near name that is another parameter's is that one's, not the missing argument's.
        ({"model_cache": "/m"}, "model", f"{MISSING} 'model'. Also unknown: 'model_cache' (did you mean "),
    ],
)
def test_a_missing_required_argument_names_the_task_and_what_was_given_in_its_place(
    kwargs: dict, left_out: str, message: str
) -> None:
    arguments_given = {**REQUIRED, "user_template": "{text}", **kwargs}
    del arguments_given[left_out]

    with pytest.raises(TypeError) as info:
        RayLLMBatchOperator(**arguments_given)

    assert message in str(info.value)
    assert str(info.value).startswith(MISSING)


def test_missing_and_unknown_arguments_are_named_in_one_message() -> None:
    with pytest.raises(TypeError) as info:
        RayLLMBatchOperator(
            task_id="classify", model_source="m", input_uri="s3://b/in.jsonl", outptu="s3://b/out", retrys=2
        )

    assert str(info.value) == (
        f"{MISSING}s 'model' (you passed model_source='m': in this operator it is model='m'), 'output_uri' "
        "(you passed outptu='s3://b/out': in this operator it is output_uri='s3://b/out'). "
        "Also unknown: 'retrys' (did you mean 'retries'?)."
    )


def test_a_long_value_given_in_a_missing_arguments_place_is_shortened() -> None:
    with pytest.raises(TypeError) as info:
        RayLLMBatchOperator(
            task_id="classify", modle="x" * 500, input_uri="s3://b/i.jsonl", output_uri="s3://b/o"
        )

    assert "..." in str(info.value)
    assert len(str(info.value)) < 300


def test_a_required_argument_from_default_args_is_not_missing() -> None:
    from airflow.sdk import DAG

    with DAG("defaults", schedule=None, default_args={"model": "m"}):
        operator = RayLLMBatchOperator(
            task_id="classify", input_uri="s3://b/in.jsonl", output_uri="s3://b/out", user_template="{text}"
        )

    assert operator.model == "m"


def test_other_type_errors_pass_through_unchanged() -> None:
    with pytest.raises(TypeError, match="^Use keyword arguments when initializing operators$"):
        RayLLMBatchOperator("classify")


@pytest.fixture
def row_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A DAG author's row functions beside the DAG (on sys.path, never imported by the checks)."""
    path = tmp_path / "raybatch_arg_rows.py"
    path.write_text(
        "import json\n\ndef clean_company(row):\n    return row\n\ndef tidy(row):\n    return row\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop("raybatch_arg_rows", None)


@pytest.mark.parametrize("field", ["preprocess", "postprocess"])
def test_a_misspelled_function_name_fails_as_the_task_is_built(row_module: Path, field: str) -> None:
    with pytest.raises(BatchSpecError) as info:
        build(**{field: "raybatch_arg_rows.clean_compnay"})

    assert str(info.value) == (
        f"RayLLMBatchOperator (task_id: classify): {field}='raybatch_arg_rows.clean_compnay': module "
        f"'raybatch_arg_rows' ({row_module}) defines no 'clean_compnay' at its top level "
        "(did you mean 'clean_company'?)."
    )
    assert "raybatch_arg_rows" not in sys.modules  # read, not imported


def test_a_function_that_is_there_or_a_module_not_found_here_builds(row_module: Path) -> None:
    build(preprocess="raybatch_arg_rows.clean_company", postprocess="raybatch_arg_rows:tidy")
    build(preprocess="raybatch_arg_elsewhere.clean")  # maybe on the cluster's path only: shipping says
    build(**DATED, preprocess="raybatch_arg_rows.tidy")  # beside templated parameters too


def test_validate_checks_the_function_against_the_module_as_it_is_now(row_module: Path) -> None:
    operator = build(**DATED, preprocess="raybatch_arg_rows.clean_company")
    row_module.write_text("def clean_companies(row):\n    return row\n")  # renamed after the DAG was parsed

    with pytest.raises(BatchSpecError) as info:
        operator.validate(
            {"data_interval_start": pendulum.datetime(2026, 11, 20, tz="UTC"), "ds": "2026-11-20"}
        )

    assert str(info.value).startswith(
        "RayLLMBatchOperator (task_id: classify): preprocess='raybatch_arg_rows.clean_company': module "
    )
    assert "(did you mean 'clean_companies'?)" in str(info.value)


#: A DAG author's layouts of a DAGs folder: (module files, the preprocess the DAG names, the file
#: that defines it). Airflow puts the DAGs folder on sys.path as it parses; a DAG's own test does not.
ROW_FUNCTIONS = "def preprocess(row):\n    return row\n\n\ndef tidy(row):\n    return row\n"
DAG_FOLDER_LAYOUTS = {
    "a module beside the DAG file": (
        {"raybatch_dagdir_rows.py": ROW_FUNCTIONS},
        "raybatch_dagdir_rows.preprocesss",
        "raybatch_dagdir_rows.py",
    ),
    "a package in the DAGs folder": (
        {"raybatch_dagdir_pkg/__init__.py": "", "raybatch_dagdir_pkg/rows.py": ROW_FUNCTIONS},
        "raybatch_dagdir_pkg.rows.preprocesss",
        "raybatch_dagdir_pkg/rows.py",
    ),
}
_LAYOUT_DAG = """
from datetime import datetime

from airflow.sdk import dag

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator


@dag(schedule=None, start_date=datetime(2026, 1, 1))
def raybatch_dagdir():
    RayLLMBatchOperator(
        task_id="classify",
        model="m",
        input_uri="s3://b/in.jsonl",
        output_uri="s3://b/out",
        user_template="{text}",
        {written}
    )
    RayLLMBatchOperator.partial(
        task_id="classify_each", model="m", output_uri="s3://b/each", user_template="{text}", {partial}
    ).expand(input_uri=["s3://b/a.jsonl", "s3://b/b.jsonl"])


raybatch_dagdir()
"""


def _dag_folder(folder: Path, modules: dict[str, str], written: str, partial: str) -> Path:
    for name, source in modules.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(source)
    dag_file = _LAYOUT_DAG.replace("{written}", written).replace("{partial}", partial)
    (folder / "raybatch_dagdir_dag.py").write_text(dag_file)
    return folder


def _parse(folder: Path) -> Any:  # Any: Airflow's DagBag.
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")  # Airflow 3.2 adds its own examples
        return DagBag(dag_folder=str(folder), safe_mode=False)


@pytest.mark.parametrize(("where", "argument"), [("written", "preprocess"), ("partial", "postprocess")])
@pytest.mark.parametrize("layout", DAG_FOLDER_LAYOUTS.values(), ids=DAG_FOLDER_LAYOUTS.keys())
def test_a_misspelled_function_in_the_dags_folder_fails_a_dags_own_test_as_it_parses(
    tmp_path: Path, layout: tuple[dict[str, str], str, str], where: str, argument: str
) -> None:
    """``DagBag(dag_folder="dags/")`` in a DAG's own test, as the README shows: the DAGs folder is not on
    sys.path there, but a module beside the DAG file, or a package in its folder, is found all the same."""
    modules, dotted_path, defined_in = layout
    good = f"{argument}={dotted_path.removesuffix('s')!r},"
    bad = f"{argument}={dotted_path!r},"
    folder = _dag_folder(tmp_path, modules, *((bad, good) if where == "written" else (good, bad)))
    assert str(tmp_path) not in sys.path

    bag = _parse(folder)

    (error,) = bag.import_errors.values()
    assert f"{argument}={dotted_path!r}: module " in error, error
    assert (
        f"({folder / defined_in}) defines no 'preprocesss' at its top level (did you mean 'preprocess'?)."
        in error
    )
    assert not [name for name in sys.modules if name.startswith("raybatch_dagdir_")]  # read, not imported


@pytest.mark.parametrize("layout", DAG_FOLDER_LAYOUTS.values(), ids=DAG_FOLDER_LAYOUTS.keys())
def test_validate_finds_the_function_in_the_dags_folder(
    tmp_path: Path, layout: tuple[dict[str, str], str, str]
) -> None:
    """The function is found where the DAG names it right; validate() reads the module again, so a
    function renamed since the DAG was parsed fails it, naming the module's functions."""
    modules, dotted_path, defined_in = layout
    good = f"preprocess={dotted_path.removesuffix('s')!r},"
    folder = _dag_folder(tmp_path, modules, good, good)
    bag = _parse(folder)
    assert bag.import_errors == {}
    task = bag.dags["raybatch_dagdir"].get_task("classify")
    task.validate()

    (folder / defined_in).write_text("def clean(row):\n    return row\n\ndef tidy(row):\n    return row\n")
    with pytest.raises(
        BatchSpecError, match=r"defines no 'preprocess' at its top level \(its functions: clean, tidy\)"
    ):
        task.validate()


@pytest.mark.parametrize("on_sys_path", [False, True], ids=["a DAG's own test", "Airflow's parse"])
@pytest.mark.parametrize(("where", "argument"), [("written", "preprocess"), ("partial", "postprocess")])
def test_a_misspelled_module_beside_the_dag_file_fails_the_parse_with_the_likely_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, argument: str, on_sys_path: bool
) -> None:
    """'reviewprep.prepare_review' beside review_prep.py: found nowhere, so the job would fail as the
    task ships it; the parse says so, with the module it likely meant, read and not imported."""
    good = f"{argument}='raybatch_dagdir_rows.preprocess',"
    bad = f"{argument}='raybatch_dagdirrows.preprocess',"
    modules = {"raybatch_dagdir_rows.py": ROW_FUNCTIONS}
    folder = _dag_folder(tmp_path, modules, *((bad, good) if where == "written" else (good, bad)))
    if on_sys_path:
        monkeypatch.syspath_prepend(str(folder))  # as Airflow puts the DAGs folder on sys.path

    bag = _parse(folder)

    (error,) = bag.import_errors.values()
    assert (
        f"{argument}='raybatch_dagdirrows.preprocess': no module 'raybatch_dagdirrows' is on sys.path "
        f"or beside the DAG file ({folder}); did you mean 'raybatch_dagdir_rows'?"
    ) in error, error
    assert not [name for name in sys.modules if name.startswith("raybatch_dagdir")]


def test_a_module_like_none_beside_the_dag_file_is_taken_on_trust(tmp_path: Path) -> None:
    """A module found nowhere here and like none beside the DAG file may be on the cluster's path."""
    good = "preprocess='raybatch_dagdir_rows.preprocess',"
    folder = _dag_folder(tmp_path, {"raybatch_dagdir_rows.py": ROW_FUNCTIONS}, good, good)
    dag_file = folder / "raybatch_dagdir_dag.py"
    dag_file.write_text(dag_file.read_text().replace("raybatch_dagdir_rows.", "qqzz_elsewhere_rows.", 1))

    assert _parse(folder).import_errors == {}


@pytest.mark.parametrize("value", ["sometimes", "Flase"])
def test_a_reuse_earlier_result_that_is_no_flag_fails_as_the_task_is_built(value: str) -> None:
    with pytest.raises(
        BatchSpecError,
        match=re.escape(
            f"RayLLMBatchOperator (task_id: classify): reuse_earlier_result={value!r} "
            "is neither true nor false"
        ),
    ):
        build(reuse_earlier_result=value)


def test_validate_checks_a_rendered_reuse_earlier_result() -> None:
    """The way a backfill turns it off: --dag-run-conf '{"reuse_earlier_result": false}'."""
    operator = build(
        reuse_earlier_result="{{ params.reuse_earlier_result }}", params={"reuse_earlier_result": True}
    )

    operator.validate({"params": {"reuse_earlier_result": False}})
    with pytest.raises(BatchSpecError, match=r"reuse_earlier_result='no thanks' is neither true nor false"):
        operator.validate({"params": {"reuse_earlier_result": "no thanks"}})
