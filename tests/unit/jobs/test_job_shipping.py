"""The task's check of a pre/postprocess module before it ships the job (jobs/job_shipping.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from airflow_provider_raybatch.jobs.job_shipping import top_level_module_path
from airflow_provider_raybatch.shared.exceptions import BatchSpecError


def test_a_misspelled_module_beside_the_dag_names_the_likely_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "raybatch_review_prep.py").write_text("def prepare_review(row):\n    return row\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the DAGs folder, as Airflow puts it on sys.path

    with pytest.raises(BatchSpecError) as raised:
        top_level_module_path("preprocess", "raybatch_reviewprep.prepare_review")

    assert "module 'raybatch_reviewprep' cannot be imported here" in str(raised.value)
    assert "did you mean 'raybatch_review_prep'?" in str(raised.value)


def test_a_module_like_no_other_says_where_to_put_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(BatchSpecError, match="put it beside the DAG file or in the DAGs folder"):
        top_level_module_path("preprocess", "qqzzxxyy_nothing_like_it.prepare")

    assert "qqzzxxyy_nothing_like_it" not in sys.modules
