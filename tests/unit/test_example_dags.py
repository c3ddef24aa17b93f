"""The example DAGs and the README's DAGs, parsed as Airflow parses a DAGs folder: each defines its DAG
with no import error, and each daily example's run reads the day before it (the scheduler's run at
midnight, a backfill's dates, a manual run of a date). The README's first screen holds a whole DAG.
tests/integration/test_airflow_ui.py runs one of them on the real scheduler."""

from __future__ import annotations

import ast
import copy
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.definitions.dag import DAG
from airflow.serialization.serialized_objects import DagSerialization
from airflow.timetables.base import TimeRestriction, Timetable

from airflow_provider_raybatch.operators.spec_params import rendered_flag

ROOT = Path(__file__).resolve().parents[2]
#: The daily examples: (DAG id, task id, input folder, output folder).
DAILY = [
    ("daily_review_sentiment", "label_reviews", "reviews", "review_sentiment"),
    ("daily_company_industry", "classify_industry", "customers", "company_industry"),
    ("daily_support_ticket_summary", "summarise_tickets", "tickets", "ticket_summaries"),
    ("daily_image_captions", "caption_images", "images", "image_captions"),
]


def _parsed(folder: Path) -> DagBag:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")  # Airflow 3.2 adds its own examples
        bag = DagBag(dag_folder=str(folder), safe_mode=False)
    assert not bag.import_errors, bag.import_errors
    return bag


@pytest.fixture(scope="module")
def example_dags() -> DagBag:
    return _parsed(ROOT / "dags")


def test_every_example_dag_parses(example_dags: DagBag) -> None:
    assert {dag_id for dag_id, *_ in DAILY} <= set(example_dags.dag_ids)


def _scheduler_timetable(dag: DAG) -> Timetable:
    """The DAG's timetable as the scheduler holds it: from the DAG serialized as the DAG processor
    stores it (the DAG file's own is a definition without the scheduling logic)."""
    return DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable


def _paths_read(dag: DAG, task_id: str, data_interval_start: datetime) -> tuple[str, str]:
    """The task's (input_uri, output_uri) rendered as a run of that interval renders them."""
    task = copy.copy(dag.get_task(task_id))  # rendered in place: the module's DAGs stay as written
    params = {**{name: dag.params[name] for name in dag.params}, "data_root": "s3://bucket/root"}
    context = {"params": params, "data_interval_start": data_interval_start}
    task.render_template_fields(context)
    return task.input_uri, task.output_uri


@pytest.mark.parametrize(("dag_id", "task_id", "inputs", "outputs"), DAILY)
def test_a_daily_example_reads_the_day_before_its_run(
    example_dags: DagBag, dag_id: str, task_id: str, inputs: str, outputs: str
) -> None:
    dag = example_dags.dags[dag_id]
    midnight = datetime(2026, 11, 21, tzinfo=UTC)
    # A manual run of 2026-11-21 covers the day before; the scheduler's next run starts at the next
    # midnight and covers 2026-11-21.
    timetable = _scheduler_timetable(dag)
    interval = timetable.infer_manual_data_interval(run_after=midnight)
    assert (interval.start, interval.end) == (datetime(2026, 11, 20, tzinfo=UTC), midnight)
    next_run = timetable.next_dagrun_info(
        last_automated_data_interval=interval,
        restriction=TimeRestriction(earliest=None, latest=None, catchup=True),
    )
    assert next_run is not None
    assert (next_run.data_interval.start, next_run.run_after) == (
        midnight,
        datetime(2026, 11, 22, tzinfo=UTC),
    )
    input_uri, output_uri = _paths_read(dag, task_id, interval.start)
    assert f"/{inputs}/2026-11-20/" in input_uri, input_uri
    assert output_uri == f"s3://bucket/root/{outputs}/2026-11-20"


@pytest.mark.parametrize(("conf", "reuse"), [({}, True), ({"reuse_earlier_result": False}, False)])
def test_a_runs_conf_turns_reuse_earlier_result_off_without_editing_the_dag(
    example_dags: DagBag, conf: dict[str, bool], reuse: bool
) -> None:
    """A backfill of dates whose input came late: --dag-run-conf '{"reuse_earlier_result": false}'
    (docs/howto-backfill.md) makes a reprocessed date run again instead of taking its old result."""
    dag = example_dags.dags["daily_company_industry"]
    task = copy.copy(dag.get_task("classify_industry"))
    params = {**{name: dag.params[name] for name in dag.params}, **conf}
    task.render_template_fields({"params": params, "data_interval_start": datetime(2026, 11, 20, tzinfo=UTC)})

    assert rendered_flag("reuse_earlier_result", task.reuse_earlier_result, default=True) is reuse


#: The README's DAGs, in its order: the first screen's, then the fuller one.
README_DAGS = ["daily_review_sentiment", "daily_company_industry"]
#: How many lines of the README a reader sees first: what it is, the pip install line, the ``ray``
#: connection and the first DAG, whole, are within them.
FIRST_SCREEN_LINES = 70


def _readme_dags() -> dict[str, str]:
    """The README's ```python blocks that define a DAG, as a user copies them, by their @dag function."""
    readme = (ROOT / "README.md").read_text()
    blocks = [block for block in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "@dag(" in block]
    return {re.findall(r"^def (\w+)\(", block, flags=re.M)[-1]: block for block in blocks}


def _without_module_docstring(source: str) -> str:
    docstring = ast.parse(source).body[0]
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant), "no docstring"
    return "".join(source.splitlines(keepends=True)[docstring.end_lineno :]).lstrip("\n")


def test_the_readme_shows_its_dags_in_order() -> None:
    assert list(_readme_dags()) == README_DAGS


@pytest.mark.parametrize("name", README_DAGS)
def test_a_readme_dag_is_its_example_file(name: str) -> None:
    """The README shows dags/<name>.py without its module docstring, so the DAG a user copies is the one
    these tests parse and the integration tests run: the two cannot drift."""
    example = (ROOT / "dags" / f"{name}.py").read_text()
    assert _readme_dags()[name] == _without_module_docstring(example), (
        f"README.md's DAG {name} differs from dags/{name}.py (less its docstring): paste the file into "
        "the README's ```python block again."
    )


def test_the_readmes_first_screen_has_the_install_the_connection_and_a_whole_dag() -> None:
    """A reader's first screen: what it is, `pip install`, the `ray` connection, and a complete DAG."""
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN_LINES])
    assert "Ray Data + vLLM" in first_screen
    assert "\npip install airflow-provider-raybatch" in first_screen
    assert '\nexport AIRFLOW_CONN_RAY_DEFAULT=\'{"conn_type": "ray"' in first_screen
    assert f"```python\n{_readme_dags()[README_DAGS[0]]}```" in first_screen, (
        f"the README's first DAG does not end within its first {FIRST_SCREEN_LINES} lines"
    )


@pytest.mark.parametrize(("dag_id", "task_id", "inputs", "outputs"), DAILY[:2])
def test_a_readme_dag_parses_and_reads_the_day_before(
    tmp_path: Path, dag_id: str, task_id: str, inputs: str, outputs: str
) -> None:
    """The README's DAG, as a user pastes it into a DAGs folder."""
    (tmp_path / "readme_dag.py").write_text(_readme_dags()[dag_id])
    bag = _parsed(tmp_path)
    assert [dag_id for dag_id, dag in bag.dags.items() if Path(dag.fileloc).parent == tmp_path] == [dag_id]
    dag = bag.dags[dag_id]
    interval = _scheduler_timetable(dag).infer_manual_data_interval(
        run_after=datetime(2026, 11, 21, tzinfo=UTC)
    )
    input_uri, output_uri = _paths_read(dag, task_id, interval.start)
    assert input_uri.startswith(f"s3://bucket/root/{inputs}/2026-11-20/")
    assert output_uri == f"s3://bucket/root/{outputs}/2026-11-20"


def test_the_readmes_validate_example_checks_the_readme_dag(tmp_path: Path) -> None:
    """The README's ``validate()`` snippet, run as written against the README's DAG: it renders the day
    and returns the spec; a bad templated value fails it naming the parameter."""
    import pendulum

    from airflow_provider_raybatch.shared.exceptions import BatchSpecError

    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "readme_dag.py").write_text(_readme_dags()[README_DAGS[0]])
    snippet = next(
        block
        for block in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
        if ".validate(" in block
    )
    scope: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)  # the snippet reads dags/, as from a project's root
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")  # Airflow 3.2 adds its own examples
        exec(snippet, scope)  # noqa: S102 - the README's own example, imports and all

    dag = scope["dag"]
    spec = scope["spec"]
    assert spec.model == "my-model"
    assert spec.input_uri.endswith("/reviews/2026-11-20/reviews.jsonl")
    with pytest.raises(BatchSpecError, match="model"):
        dag.get_task("label_reviews").validate(
            {"data_interval_start": pendulum.datetime(2026, 11, 20, tz="UTC"), "params": {"model": ""}}
        )
