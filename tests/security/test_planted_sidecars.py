"""A sidecar the commit reads back from a run's staging is bounded and of the shape our writer makes.

Whoever can write the output can write a run's staging (docs/security.md). A planted
``parts/<part>.json`` of ``{"files": {"x": "y"}}`` crashed the commit with a bare ``KeyError``; one of
130 MB listing ten million sources grew it by 450 MiB before ``MemoryError``; one whose counts did not
add up made a run that should be held commit with no failed rows. Each now fails the commit naming the
part and what to do (pipeline/sidecars.py). A well-formed forgery stays possible: whoever can write
the output can change what it commits (Known limits).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline import sidecars
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from tests.unit.pipeline.test_commit import RUN_KEY, spec_of, stage_part


@pytest.fixture
def layout(tmp_path: Path) -> OutputLayout:
    layout = OutputLayout(str(tmp_path / "out"), RUN_KEY)
    commit.open_staging(layout, spec_of(run_key=RUN_KEY))
    stage_part(layout, "part-a", ["in.jsonl:1", "in.jsonl:2"], failed=["in.jsonl:2"])
    return layout


def _plant(layout: OutputLayout, document: object | str) -> None:
    text = document if isinstance(document, str) else json.dumps(document)
    Path(layout.staging_uri, "parts", "part-0.json").write_text(text)


_GOOD = {
    "sources": ["in.jsonl:3"],
    "files": {},
    "rows_out": 1,
    "rows_failed": 0,
    "tokens_in": 0,
    "tokens_out": 0,
    "errors_by_reason": {},
}


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"files": {"x": "y"}}, "its files are not a map of outputs and errors"),
        ({**_GOOD, "files": {"outputs": "../../manifest.json"}}, "not names of files in its folders"),
        ({**_GOOD, "rows_out": 5, "rows_failed": -4}, "its counts"),
        ({**_GOOD, "rows_out": 0, "rows_failed": 0}, "it counts 0 rows out and 0 failed for 1 sources"),
        ({**_GOOD, "rows_out": 0, "rows_failed": 1}, "its errors_by_reason counts 0 rows, not its 1 failed"),
        ({**_GOOD, "rewriting": 5}, "its rewriting is not a list of its folders"),
        (
            {**_GOOD, "columns": {"outputs": ["x"]}},
            "its columns are not a map of its folders to column types",
        ),
        ({**_GOOD, "staged_columns": {"outputs": "x"}}, "its staged_columns are not a map of its folders"),
        ("not JSON", "it is not JSON"),
        ([1, 2], "it is a JSON list, not an object"),
    ],
)
def test_a_planted_sidecar_no_writer_of_ours_makes_fails_the_commit_naming_it(
    layout: OutputLayout, document: object, problem: str
) -> None:
    _plant(layout, document)

    with pytest.raises(
        sidecars.ForeignSidecarError, match="staged part part-0's sidecar is not one"
    ) as raised:
        commit.write_version(layout, spec_of(run_key=RUN_KEY), rows_in=3)

    assert problem in str(raised.value) and "delete parts/part-0.json" in str(raised.value)
    assert not Path(layout.manifest_uri).exists()


def test_a_planted_sidecar_past_the_bound_is_refused_unread(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sidecars, "MAX_SIDECAR_BYTES", 1_000)
    _plant(layout, {**_GOOD, "sources": [f"in.jsonl:{n}" for n in range(200)], "rows_out": 200})

    with pytest.raises(sidecars.ForeignSidecarError, match=r"it is [\d,]+ bytes, over the 1,000"):
        commit.write_version(layout, spec_of(run_key=RUN_KEY), rows_in=201)


def test_sidecars_our_writer_makes_still_commit(layout: OutputLayout) -> None:
    _plant(layout, _GOOD)

    run = commit.write_version(layout, spec_of(run_key=RUN_KEY), rows_in=3)

    assert (run.rows_out, run.rows_failed) == (2, 1)
