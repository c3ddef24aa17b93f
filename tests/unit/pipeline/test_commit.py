"""Tests of airflow_provider_raybatch/pipeline/stage/commit.py: error kinds, staging, resume and publish.

Staging is emulated by hand: each part is written as sink.StagedPartsSink writes it (data files in
``outputs/`` and ``errors/``, then the ``parts/<part>.json`` sidecar last), without importing the sink,
which needs Ray. ``open_staging``, ``write_version`` and ``publish`` then run on local disk.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.prompt.prompts import build_messages, row_id
from airflow_provider_raybatch.pipeline.read.rows import parse_file
from airflow_provider_raybatch.pipeline.reporting import report
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.stage.binding import RunBinding
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter, StagingTakenError
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from tests.unit.pipeline.interleave import interleave

RUN_KEY = "classify-m-1-0123456789abcdef"


def spec_of(**params: Any) -> BatchInferenceSpec:  # Any: spec parameter values.
    defaults = {"model": "m", "input_uri": "in.jsonl", "output_uri": "out", "user_template": "{Company}"}
    return BatchInferenceSpec.build(**{**defaults, **params})


# -- reason_kind --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("malformed JSON: line 6, column 3: Expecting value", "malformed JSON"),
        ("invalid UTF-8: byte 7 of line 2", "invalid UTF-8"),
        ("not a JSON object: line 1 is a JSON list", "not a JSON object"),
        ("unreadable file: not valid parquet: ArrowInvalid: bad magic", "unreadable file"),
        ("missing column: user_template needs column 'Customer Id', which the row lacks", "missing column"),
        ("empty prompt: column 'Company' used by user_template is empty", "empty prompt"),
        ("bad messages: message 0 of column 'messages' needs 'role' and 'content'", "bad messages"),
        ("missing id: id column 'Id' is missing or empty", "missing id"),
        ("duplicate id: 'c-1' first seen at in.jsonl:1", "duplicate id"),
        ("preprocess failed: pkg.fns:clean: KeyError: 'a'", "preprocess failed"),
        ("output not a choice: 'maybe' after 3 tokens; ", "output not a choice"),
        ("inference failed: CUDA error", "inference failed"),
        ("  padded kind  : text", "padded kind"),
        ("no colon at all", "no colon at all"),
        ("", ""),
    ],
)
def test_reason_kind(reason: str, kind: str) -> None:
    assert commit.reason_kind(reason) == kind


def test_reason_kind_is_short() -> None:
    assert commit.reason_kind("x" * 500) == "x" * 80
    assert commit.reason_kind("y" * 500 + ": detail") == "y" * 80


def _reasons_from_rows_and_prompts() -> list[str]:
    """One real reason of every kind rows.py and prompts.py produce."""
    reasons = [
        record["error"]
        for record in [
            *parse_file("in.jsonl", b'{"a": 1,,}\n[1]\n{"a": "\xff"}\n', "jsonl"),
            *parse_file("in.parquet", b"not parquet", "parquet"),
        ]
    ]
    template = spec_of(id_column="Id")
    messages = BatchInferenceSpec.build(
        model="m", input_uri="in.jsonl", output_uri="out", messages_column="m"
    )
    for call in [
        lambda: build_messages(template, {"Other": 1}),
        lambda: build_messages(template, {"Company": " "}),
        lambda: build_messages(template, {"Company": math.nan}),
        lambda: build_messages(messages, {"m": "not json"}),
        lambda: build_messages(messages, {"m": []}),
        lambda: build_messages(messages, {"m": [{"role": "user"}]}),
        lambda: build_messages(messages, {"m": [{"role": "user", "content": ""}]}),
        lambda: row_id(template, {"Id": None}, "in.jsonl:1"),
    ]:
        with pytest.raises(ValueError) as info:
            call()
        reasons.append(str(info.value))
    return reasons


def test_every_row_and_prompt_reason_has_a_stable_kind() -> None:
    """errors_by_reason in the manifest counts by kind: the kinds must not carry row details."""
    kinds = [commit.reason_kind(reason) for reason in _reasons_from_rows_and_prompts()]

    assert kinds == [
        "malformed JSON",
        "not a JSON object",
        "invalid UTF-8",
        "unreadable file",
        "missing column",
        "empty prompt",
        "empty prompt",
        "bad messages",
        "bad messages",
        "bad messages",
        "empty prompt",
        "missing id",
    ]


def test_part_folders() -> None:
    """The sink creates these and write_version moves the first two: the layout both rely on."""
    assert commit.PART_FOLDERS == ("outputs", "errors", "parts")


# -- staging emulated by hand ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _pyarrow() -> None:
    pytest.importorskip("pyarrow.fs")


@pytest.fixture
def layout(tmp_path: Path) -> OutputLayout:
    return OutputLayout(str(tmp_path / "out"), RUN_KEY)


def _jsonl(records: list[dict[str, Any]]) -> str:  # Any: JSON values.
    return "".join(json.dumps(record) + "\n" for record in records)


def stage_part(
    layout: OutputLayout,
    name: str,
    sources: list[str],
    *,
    failed: list[str] = (),  # type: ignore[assignment]
    tokens: tuple[int, int] = (0, 0),
    reasons: dict[str, int] | None = None,
    labels: dict[str, int] | None = None,
    sidecar: bool = True,
    report_fields: dict[str, Any] | None = None,  # Any: JSON values.
) -> dict[str, Path]:
    """Stage one part as StagedPartsSink does: the rows of ``sources`` not in ``failed`` are outputs,
    those in ``failed`` errors; the sidecar is written last (``sidecar=False``: the job died first).
    Without ``report_fields`` the sidecar is one from before the run report (no ``written_at``, no
    ``token_histograms``).

    Returns the part's files by folder.
    """
    if not Path(layout.staged_spec_uri).exists():  # a job opens its staging before it stages a row
        commit.open_staging(layout, spec_of(run_key=layout.run_key))
    staging, data = Path(layout.staging_uri), Path(commit.staged_data_uri(layout))
    outputs = [{"id": source, "generated_text": "x"} for source in sources if source not in failed]
    errors = [{"id": source, "source": source, "error": "empty prompt: e"} for source in failed]
    files: dict[str, Path] = {}
    for folder, records in (("outputs", outputs), ("errors", errors)):
        if records:
            path = data / folder / f"{name}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_jsonl(records))
            files[folder] = path
    if sidecar:
        document: dict[str, Any] = {  # Any: JSON values.
            "sources": list(sources),
            "files": {folder: path.name for folder, path in files.items()},
            "rows_out": len(outputs),
            "rows_failed": len(errors),
            "tokens_in": tokens[0],
            "tokens_out": tokens[1],
            "errors_by_reason": dict(Counter("empty prompt" for _ in errors)) if reasons is None else reasons,
        }
        if labels is not None:
            document["generated_text_counts"] = labels
        document.update(report_fields or {})
        path = staging / "parts" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document))
        files["parts"] = path
    return files


def files_under(uri: str) -> list[str]:
    """Paths under a folder, relative to it, sorted."""
    root = Path(uri)
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


# -- open_staging ---------------------------------------------------------------------------------


def test_open_staging_fresh_records_the_spec(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY)

    assert commit.open_staging(layout, spec) == set()

    pointer = json.loads(storage.read_text(layout.staged_spec_uri))
    # the spec alone given
    binding = {"spec": spec.fingerprint(), "input": "", "code": "", "model": "", "engine": ""}
    assert pointer == {"fingerprint": spec.fingerprint(), "binding": binding, "version": pointer["version"]}
    assert re.fullmatch(rf"\d{{8}}T\d{{6}}-{RUN_KEY[-12:]}-[0-9a-f]{{6}}", pointer["version"])
    assert commit.staged_data_uri(layout) == layout.version_uri(pointer["version"])  # the data goes there
    assert files_under(layout.staging_uri) == ["spec.json"]


def test_open_staging_resumes_the_sources_of_the_sidecars(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    first = stage_part(layout, "part-a", ["in.jsonl:1", "in.jsonl:2"], failed=["in.jsonl:2"])
    second = stage_part(layout, "part-b", ["sub/x.jsonl:1"])

    assert commit.open_staging(layout, spec) == {"in.jsonl:1", "in.jsonl:2", "sub/x.jsonl:1"}

    for path in [*first.values(), *second.values()]:
        assert path.exists(), path  # resuming keeps every committed part


def test_open_staging_resumes_a_file_uri(layout: OutputLayout) -> None:
    """file:// output URIs: the sidecars are found and read through the URI, not a bare path."""
    file_layout = OutputLayout(f"file://{layout.output_uri}", RUN_KEY)
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(file_layout, spec)
    stage_part(layout, "part-a", ["1", "2"])  # the same folder, by its plain path

    assert commit.open_staging(file_layout, spec) == {"1", "2"}


def test_open_staging_resumes_across_keep_versions(layout: OutputLayout) -> None:
    """keep_versions is not part of the fingerprint, so changing it keeps the staged rows."""
    commit.open_staging(layout, spec_of(run_key=RUN_KEY))
    stage_part(layout, "part-a", ["1"])

    assert commit.open_staging(layout, spec_of(run_key=RUN_KEY, keep_versions=True)) == {"1"}


def test_open_staging_discards_another_specs_parts(layout: OutputLayout) -> None:
    commit.open_staging(layout, spec_of(run_key=RUN_KEY))
    staged = stage_part(layout, "part-a", ["1", "2"], failed=["2"])
    changed = spec_of(run_key=RUN_KEY, system_prompt="Answer in French.")

    assert commit.open_staging(layout, changed) == set()

    assert not any(path.exists() for path in staged.values())
    assert files_under(layout.staging_uri) == ["spec.json"]
    assert json.loads(storage.read_text(layout.staged_spec_uri))["fingerprint"] == changed.fingerprint()
    assert (
        not Path(layout.output_uri, "versions").exists()
        or files_under(str(Path(layout.output_uri, "versions"))) == []
    )


def test_open_staging_deletes_the_files_of_parts_without_a_sidecar(layout: OutputLayout) -> None:
    """A part whose sidecar was never written (the job died mid-part) does not count and goes."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    kept = stage_part(layout, "part-a", ["1", "2"], failed=["2"])
    orphan = stage_part(layout, "part-b", ["3", "4"], failed=["4"], sidecar=False)
    assert set(orphan) == {"outputs", "errors"}
    # The sidecar's own temporary file, left by a write that died: not a committed part.
    (Path(layout.staging_uri) / "parts" / "part-b.json.tmp-0123abcd").write_text('{"sources": ["3"')

    assert commit.open_staging(layout, spec) == {"1", "2"}

    assert not any(path.exists() for path in orphan.values())
    assert all(path.exists() for path in kept.values())
    assert files_under(storage.join(commit.staged_data_uri(layout), "outputs")) == ["part-a.jsonl"]
    assert files_under(storage.join(commit.staged_data_uri(layout), "errors")) == ["part-a.jsonl"]


def test_open_staging_leaves_other_runs_alone(tmp_path: Path) -> None:
    mine = OutputLayout(str(tmp_path / "out"), "run-a")
    other = OutputLayout(str(tmp_path / "out"), "run-b")
    commit.open_staging(other, spec_of(run_key="run-b"))
    others = stage_part(other, "part-x", ["x", "y"], failed=["y"])
    others_orphan = stage_part(other, "part-y", ["z"], sidecar=False)
    commit.open_staging(mine, spec_of(run_key="run-a"))
    stage_part(mine, "part-m", ["m"])
    stage_part(mine, "part-n", ["n"], sidecar=False)

    # run-a's staging is discarded (another spec) and, separately, cleaned of orphans.
    assert commit.open_staging(mine, spec_of(run_key="run-a", system_prompt="changed")) == set()
    stage_part(mine, "part-o", ["o"], sidecar=False)
    assert commit.open_staging(mine, spec_of(run_key="run-a", system_prompt="changed")) == set()

    assert all(path.exists() for path in [*others.values(), *others_orphan.values()])
    assert (
        json.loads(storage.read_text(other.staged_spec_uri))["fingerprint"]
        == spec_of(run_key="run-b").fingerprint()
    )
    assert commit.open_staging(other, spec_of(run_key="run-b")) == {"x", "y"}


# -- _drop_repeated_rows ------------------------------------------------------------------------


@pytest.mark.parametrize("repeated", [["1", "2"], ["2", "1"], ["2"]], ids=["same", "reordered", "subset"])
def test_a_part_repeating_earlier_rows_is_dropped_with_its_files(
    layout: OutputLayout, repeated: list[str]
) -> None:
    """A retried Ray write task stages the same rows again under another part name."""
    first = stage_part(layout, "part-a", ["1", "2"], failed=["2"])
    again = stage_part(layout, "part-b", repeated, failed=["2"])
    other = stage_part(layout, "part-c", ["3"])

    kept = commit._drop_repeated_rows(layout, commit._sidecars(layout))

    assert [part.name for part in kept] == ["part-a", "part-c"]
    assert not again["errors"].exists()
    assert "outputs" not in again or not again["outputs"].exists()
    assert all(path.exists() for path in [*first.values(), *other.values()])


def test_parts_without_repeats_are_all_kept(layout: OutputLayout) -> None:
    stage_part(layout, "part-b", ["2"])
    stage_part(layout, "part-a", ["1"])

    kept = commit._drop_repeated_rows(layout, commit._sidecars(layout))

    assert [part.name for part in kept] == ["part-a", "part-b"]


def test_a_part_repeating_rows_only_partly_raises_without_a_rewriter(layout: OutputLayout) -> None:
    first = stage_part(layout, "part-a", ["1", "2"])
    partial = stage_part(layout, "part-b", ["2", "3"])

    with pytest.raises(commit.InvariantError, match="part-b"):
        commit._drop_repeated_rows(layout, commit._sidecars(layout))

    assert all(path.exists() for path in [*first.values(), *partial.values()])


def test_a_part_from_before_file_order_repeating_rows_partly_raises(layout: OutputLayout) -> None:
    """Its sidecar does not say which file line is which source: nothing can be taken out safely."""
    stage_part(layout, "part-a", ["1", "2"])
    stage_part(layout, "part-b", ["2", "3"])  # the hand-made sidecar has no sources_in_file_order

    with pytest.raises(commit.InvariantError, match="part-b"):
        commit._drop_repeated_rows(
            layout, commit._sidecars(layout), PartWriter(layout.staging_uri, "jsonl", False)
        )


def _result_rows(
    sources: list[str], failed: tuple[str, ...] = ()
) -> list[dict[str, Any]]:  # Any: row values.
    """Rows as the replicas stage them: an output record per good source, an error record per failed one."""
    rows = []
    for source in sources:
        if source in failed:
            record = {"id": source, "source": source, "error": "inference failed: boom", "input": "{}"}
        else:
            record = {
                "id": source,
                "generated_text": f"text of {source}",
                "num_input_tokens": 3,
                "num_generated_tokens": 2,
            }
        rows.append({"source": source, "ok": source not in failed, "record": json.dumps(record)})
    return rows


@pytest.mark.parametrize("output_format", ["jsonl", "parquet"])
def test_a_part_repeating_rows_partly_is_staged_again_without_them(
    layout: OutputLayout, output_format: str
) -> None:
    """A retried batch's rows staged again, mixed with another batch's: each row is kept once, and
    the counts of the part staged again are its own rows' counts."""
    writer = PartWriter(layout.staging_uri, output_format, count_labels=False)
    writer.create_folders()
    first = writer.write_part(_result_rows(["a:1", "a:2", "a:3"], failed=("a:2",)))
    # Another replica staged a:2 and a:3 again (failed and ok) with b:1 (ok) and b:2 (failed).
    mixed = writer.write_part(_result_rows(["b:1", "a:3", "a:2", "b:2"], failed=("a:2", "b:2")))
    parts = sorted([first, mixed], key=lambda part: part.name)

    kept = commit._drop_repeated_rows(layout, commit._sidecars(layout), writer)

    rows = [row for part in kept for row in writer.read_part(part)]
    assert sorted(row["source"] for row in rows) == ["a:1", "a:2", "a:3", "b:1", "b:2"]
    by_source = {row["source"]: json.loads(row["record"]) for row in rows}
    assert by_source["b:1"]["generated_text"] == "text of b:1" and by_source["b:2"]["error"].startswith(
        "inference"
    )
    assert sum(part.sidecar["rows_out"] for part in kept) == 3  # a:1, a:3, b:1
    assert sum(part.sidecar["rows_failed"] for part in kept) == 2  # a:2, b:2
    assert sum(part.sidecar["tokens_out"] for part in kept) == 6
    assert {part.name for part in kept} & {part.name for part in parts} == {parts[0].name}
    staged_names = {path.stem for path in Path(layout.staging_uri, "parts").iterdir()}
    assert staged_names == {part.name for part in kept}  # the partly repeating part's files are gone
    assert {path.name.split(".")[0] for path in Path(layout.staging_uri, "outputs").iterdir()} <= staged_names


def test_a_commit_that_died_after_staging_again_drops_the_leftover(layout: OutputLayout) -> None:
    """The part staged again exists beside the one it replaces (the commit died in between): the
    next commit still keeps each row once, whichever of the two sorts first."""
    writer = PartWriter(layout.staging_uri, "jsonl", count_labels=False)
    writer.create_folders()
    writer.write_part(_result_rows(["a:1", "a:2"]))
    repeating = writer.write_part(_result_rows(["a:2", "b:1", "b:2"]))
    writer.write_part([row for row in writer.read_part(repeating) if row["source"] != "a:2"])  # the copy

    kept = commit._drop_repeated_rows(layout, commit._sidecars(layout), writer)

    sources = [row["source"] for part in kept for row in writer.read_part(part)]
    assert sorted(sources) == ["a:1", "a:2", "b:1", "b:2"]


def _answer(source: str, label: str | None, record: dict[str, Any]) -> dict[str, Any]:  # Any: row values
    """A staged row as row_steps stages an engine's answer: ``label`` is the choice it was held to."""
    return {"source": source, "ok": True, "record": json.dumps(record), "tokens": [1, 1], "label": label}


@pytest.mark.parametrize("output_format", ["jsonl", "parquet"])
def test_rows_staged_again_keep_their_labels_so_the_counts_hold_only_labels(
    layout: OutputLayout, output_format: str
) -> None:
    """A batch retried after its replica died repeats a row of another part, so commit stages one of
    the two parts again without it. Whichever it is, its rows keep what made them labels: free text
    (a row with no choice) stays out of generated_text_counts, and a row held to a choice counts its
    label, though a postprocess wrote it under another column."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    writer = PartWriter(
        layout.staging_uri, output_format, count_labels=True, data_uri=commit.staged_data_uri(layout)
    )
    writer.create_folders()
    free = {"id": "2", "generated_text": "Once upon a time"}
    writer.write_part([_answer("a:1", "yes", {"id": "1", "answer": "yes"}), _answer("a:2", None, free)])
    writer.write_part(
        [
            _answer("a:2", None, free),  # the retried batch's copy
            _answer("a:3", None, {"id": "3", "generated_text": "A free answer"}),
            _answer("a:4", "no", {"id": "4", "answer": "no"}),
        ]
    )

    run = commit.write_version(layout, spec, rows_in=4, rewriter=writer)

    assert (run.rows_out, run.rows_failed) == (4, 0)
    assert run.generated_text_counts == {"no": 1, "yes": 1}


@pytest.mark.parametrize("output_format", ["jsonl", "parquet"])
def test_rows_staged_again_keep_the_engine_s_token_counts(layout: OutputLayout, output_format: str) -> None:
    """A postprocess that drops the token columns leaves the engine's counts in the sidecar only: a
    part commit stages again without a repeated row keeps them for the rows it keeps."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    writer = PartWriter(
        layout.staging_uri, output_format, count_labels=False, data_uri=commit.staged_data_uri(layout)
    )
    writer.create_folders()

    def answer(source: str, tokens: list[int]) -> dict[str, Any]:  # Any: row values
        return {"source": source, "ok": True, "record": json.dumps({"id": source}), "tokens": tokens}

    writer.write_part([answer("a:1", [3, 5]), answer("a:2", [4, 6])])
    writer.write_part([answer("a:2", [4, 6]), answer("a:3", [7, 11]), answer("a:4", [2, 13])])

    run = commit.write_version(layout, spec, rows_in=4, rewriter=writer)

    assert (run.rows_out, run.tokens_in, run.tokens_out) == (4, 3 + 4 + 7 + 2, 5 + 6 + 11 + 13)


def test_read_part_refuses_a_part_whose_files_and_sidecar_disagree(layout: OutputLayout) -> None:
    writer = PartWriter(layout.staging_uri, "jsonl", count_labels=False)
    writer.create_folders()
    part = writer.write_part(_result_rows(["a:1", "a:2"]))
    Path(layout.staging_uri, "outputs", part.sidecar["files"]["outputs"]).write_text(
        json.dumps({"id": "a:1"}) + "\n"
    )

    with pytest.raises(ValueError, match="1 rows in its files, 2 in its sidecar"):
        writer.read_part(part)


# -- write_version --------------------------------------------------------------------------------


CHOICES = {"max_tokens": 4, "structured_outputs": {"choice": ["yes", "no"]}}


def test_write_version_adds_up_the_parts_and_moves_them(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY, sampling_params=CHOICES)
    commit.open_staging(layout, spec)
    first = stage_part(
        layout,
        "part-a",
        ["1", "2", "3"],
        failed=["3"],
        tokens=(10, 2),
        reasons={"empty prompt": 1},
        labels={"yes": 1, "no": 1},
    )
    second = stage_part(
        layout,
        "part-b",
        ["4", "5", "6"],
        failed=["5", "6"],
        tokens=(7, 1),
        reasons={"output not a choice": 1, "empty prompt": 1},
        labels={"yes": 1},
    )
    contents = {
        (folder, path.name): path.read_text()
        for part in (first, second)
        for folder, path in part.items()
        if folder != "parts"
    }

    run = commit.write_version(layout, spec, rows_in=6)

    assert re.fullmatch(rf"\d{{8}}T\d{{6}}-{RUN_KEY[-12:]}-[0-9a-f]{{6}}", run.version)
    assert run.outputs_uri == f"{layout.output_uri}/versions/{run.version}/outputs"
    assert run.errors_uri == f"{layout.output_uri}/versions/{run.version}/errors"
    assert (run.rows_out, run.rows_failed) == (3, 3)
    assert (run.tokens_in, run.tokens_out) == (17, 3)
    assert run.errors_by_reason == {"empty prompt": 2, "output not a choice": 1}
    assert list(run.errors_by_reason) == sorted(run.errors_by_reason)
    assert run.generated_text_counts == {"no": 1, "yes": 2}
    assert files_under(run.outputs_uri) == ["part-a.jsonl", "part-b.jsonl"]
    assert files_under(run.errors_uri) == ["part-a.jsonl", "part-b.jsonl"]
    for (folder, name), text in contents.items():
        assert (Path(layout.version_uri(run.version)) / folder / name).read_text() == text
    assert not Path(layout.staging_uri, "outputs").exists()
    assert not Path(layout.staging_uri, "errors").exists()
    assert not Path(layout.manifest_uri).exists()  # invisible until publish


def test_write_version_without_choices_or_labels_counts_none(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY)
    stage_part(layout, "part-a", ["1"], labels={})

    run = commit.write_version(layout, spec, rows_in=1)

    assert run.generated_text_counts is None
    assert run.errors_by_reason == {}


def test_write_version_counts_the_labels_of_rows_with_their_own_choice(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY)  # no choice in the operator's sampling_params; a preprocess set one
    stage_part(layout, "part-a", ["1"], labels={"yes": 1})

    run = commit.write_version(layout, spec, rows_in=1)

    assert run.generated_text_counts == {"yes": 1}


def test_write_version_of_choices_without_outputs_has_empty_label_counts(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY, sampling_params=CHOICES)
    stage_part(layout, "part-a", ["1"], failed=["1"], labels={})

    run = commit.write_version(layout, spec, rows_in=1)

    assert run.generated_text_counts == {}


def test_write_version_counts_a_repeated_part_once(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY)
    stage_part(layout, "part-a", ["1", "2"], tokens=(5, 5))
    stage_part(layout, "part-b", ["1", "2"], tokens=(5, 5))

    run = commit.write_version(layout, spec, rows_in=2)

    assert (run.rows_out, run.tokens_in) == (2, 5)
    assert files_under(run.outputs_uri) == ["part-a.jsonl"]


def test_write_version_leaves_out_parts_without_a_sidecar(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY)
    stage_part(layout, "part-a", ["1"])
    stage_part(layout, "part-b", ["2"], failed=["2"], sidecar=False)

    run = commit.write_version(layout, spec, rows_in=1)

    assert files_under(run.outputs_uri) == ["part-a.jsonl"]
    assert files_under(run.errors_uri) == []


@pytest.mark.parametrize("rows_in", [2, 4], ids=["rows-doubled", "rows-lost"])
def test_write_version_refuses_counts_that_do_not_add_up(layout: OutputLayout, rows_in: int) -> None:
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    staged = [stage_part(layout, "part-a", ["1", "2"], failed=["2"]), stage_part(layout, "part-b", ["3"])]

    with pytest.raises(commit.InvariantError, match=rf"rows in {rows_in} != rows out 2 \+ rows failed 1"):
        commit.write_version(layout, spec, rows_in=rows_in)

    assert all(path.exists() for part in staged for path in part.values())  # kept for inspection
    assert not list(Path(layout.output_uri, "versions").rglob("report.html"))
    assert not Path(layout.manifest_uri).exists()


@pytest.mark.parametrize(
    ("failed", "present", "empty"),
    [(["1"], "errors", "outputs"), ([], "outputs", "errors")],
    ids=["no-outputs", "no-errors"],
)
def test_write_version_creates_an_empty_folder_for_a_kind_without_rows(
    layout: OutputLayout, failed: list[str], present: str, empty: str
) -> None:
    stage_part(layout, "part-a", ["1"], failed=failed)

    run = commit.write_version(layout, spec_of(run_key=RUN_KEY), rows_in=1)

    version = Path(layout.version_uri(run.version))
    assert files_under(str(version / present)) == ["part-a.jsonl"]
    assert (version / empty).is_dir()
    assert list((version / empty).iterdir()) == []


def test_write_version_of_no_rows_creates_both_folders(layout: OutputLayout) -> None:
    commit.open_staging(layout, spec_of(run_key=RUN_KEY))

    run = commit.write_version(layout, spec_of(run_key=RUN_KEY), rows_in=0)

    assert (run.rows_out, run.rows_failed) == (0, 0)
    assert Path(run.outputs_uri).is_dir() and list(Path(run.outputs_uri).iterdir()) == []
    assert Path(run.errors_uri).is_dir() and list(Path(run.errors_uri).iterdir()) == []


# -- the run report --------------------------------------------------------------------------------


STARTED_AT = datetime(2026, 11, 21, 8, 0, tzinfo=UTC)


def report_fields(tokens: list[tuple[int, int]], seconds: float) -> dict[str, Any]:  # Any: JSON values.
    """What the sink adds for the report to a part whose output rows have these (in, out) tokens."""
    outputs = [{"num_input_tokens": n_in, "num_generated_tokens": n_out} for n_in, n_out in tokens]
    return report.part_report_fields(outputs, written_at=STARTED_AT + timedelta(seconds=seconds))


def chart_values(page: str, chart_id: str) -> list[int]:
    chart = re.search(rf'<svg id="{chart_id}".*?</svg>', page, re.S)
    assert chart, f"no chart {chart_id}"
    return [int(value) for value in re.findall(r'data-value="(\d+)"', chart.group(0))]


@pytest.mark.parametrize("scheme", ["", "file://"], ids=["path", "file-uri"])
def test_write_version_writes_the_report_into_the_version_folder(tmp_path: Path, scheme: str) -> None:
    layout = OutputLayout(f"{scheme}{tmp_path / 'out'}", RUN_KEY)
    staged = OutputLayout(str(tmp_path / "out"), RUN_KEY)  # the same folder, by its plain path
    spec = spec_of(run_key=RUN_KEY, model="org/<model>")
    commit.open_staging(layout, spec)
    stage_part(
        staged,
        "part-a",
        ["1", "2", "3"],
        failed=["3"],
        tokens=(30, 9),
        reasons={"duplicate id": 1},
        report_fields=report_fields([(10, 1), (20, 8)], seconds=4),
    )
    stage_part(
        staged,
        "part-b",
        ["4", "5", "6"],
        failed=["6"],
        tokens=(1100, 3),
        reasons={"<script>x</script>": 1},
        report_fields=report_fields([(100, 1), (1000, 2)], seconds=65),
    )

    versions = {"ray": "2.60.0", "vllm": "0.32.0"}
    run = commit.write_version(
        layout, spec, rows_in=6, rows_resumed=3, started_at=STARTED_AT, versions=versions
    )

    assert run.report_uri == f"{layout.output_uri}/versions/{run.version}/report.html"
    version = tmp_path / "out" / "versions" / run.version
    assert files_under(str(version)) == [
        "errors/part-a.jsonl",
        "errors/part-b.jsonl",
        "outputs/part-a.jsonl",
        "outputs/part-b.jsonl",
        "report.html",
    ]
    page = storage.read_text(run.report_uri)
    assert (version / "report.html").read_text() == page
    for key, shown in [
        ("rows_in", "6"),
        ("rows_out", "4"),
        ("rows_failed", "2"),
        ("rows_duplicate", "1"),
        ("rows_resumed", "3"),
        ("tokens_in", "1,130"),
        ("tokens_out", "12"),
    ]:
        assert f'<dd id="{key}">{shown}</dd>' in page
    assert "org/&lt;model&gt;" in page and "2.60.0" in page and run.version in page
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert sum(chart_values(page, "hist-input")) == sum(chart_values(page, "hist-generated")) == run.rows_out
    rows = chart_values(page, "throughput-rows")  # parts at 4 s and 65 s after the start: 2 s buckets
    assert (len(rows), rows[2], rows[-1], sum(rows)) == (33, 3, 3, 6)
    assert "per 2 s" in page
    assert not Path(staged.manifest_uri).exists()  # still invisible until publish


def test_write_version_of_old_sidecars_commits_with_what_the_report_can_show(layout: OutputLayout) -> None:
    """Parts staged before the upgrade that added the report (a resumed run) still commit."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    stage_part(layout, "part-a", ["1", "2", "3"], failed=["3"], tokens=(30, 9))  # no report fields
    new_fields = report_fields([(9, 1), (11, 1)], seconds=3)
    stage_part(layout, "part-b", ["4", "5"], tokens=(20, 2), report_fields=new_fields)

    run = commit.write_version(layout, spec, rows_in=5)

    assert (run.rows_out, run.rows_failed, run.tokens_in) == (4, 1, 50)
    assert files_under(run.outputs_uri) == ["part-a.jsonl", "part-b.jsonl"]
    page = Path(run.report_uri).read_text()
    assert '<dd id="rows_in">5</dd>' in page and '<dd id="rows_resumed">—</dd>' in page
    assert sum(chart_values(page, "hist-input")) == 2
    assert "2 output rows are not shown" in page
    assert sum(chart_values(page, "throughput-rows")) == 2
    assert "3 rows are not shown" in page


def test_write_version_of_only_old_sidecars_and_of_no_rows_writes_a_report(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY)
    stage_part(layout, "part-a", ["1"])

    old = commit.write_version(layout, spec, rows_in=1)
    commit.publish(layout, {"version": old.version}, keep_versions=True)
    commit.open_staging(layout, spec)
    empty = commit.write_version(layout, spec, rows_in=0)

    assert "<svg" not in Path(old.report_uri).read_text()
    assert '<dd id="rows_out">1</dd>' in Path(old.report_uri).read_text()
    assert '<dd id="rows_in">0</dd>' in Path(empty.report_uri).read_text()


def test_write_version_commits_without_a_report_it_cannot_render(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The report is a view of the run: a bug in it must not fail (or endlessly retry) a sound commit."""

    def broken(*args: Any, **kwargs: Any) -> str:  # Any: whatever render_report gets.
        raise ZeroDivisionError("a chart bug")

    monkeypatch.setattr(report, "render_report", broken)
    spec = spec_of(run_key=RUN_KEY)
    stage_part(layout, "part-a", ["1", "2"], failed=["2"], report_fields=report_fields([(5, 5)], 1))

    with caplog.at_level(logging.ERROR, logger="airflow_provider_raybatch.pipeline"):
        run = commit.write_version(layout, spec, rows_in=2)

    assert run.report_uri is None
    assert (run.rows_out, run.rows_failed) == (1, 1)
    assert files_under(layout.version_uri(run.version)) == ["errors/part-a.jsonl", "outputs/part-a.jsonl"]
    assert "Could not render the run report" in caplog.text and "a chart bug" in caplog.text


def test_a_retry_after_a_crash_before_publish_resumes_every_row(layout: OutputLayout) -> None:
    """The job dies after write_version but before publish wrote the manifest: the parts are where
    they were staged (the version folder), so the retry redoes nothing and commits that version."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    stage_part(layout, "part-a", ["1", "2"])
    first = commit.write_version(layout, spec, rows_in=2)  # ... and the job dies here.

    assert commit.open_staging(layout, spec) == {"1", "2"}  # the retry resumes both rows
    run = commit.write_version(layout, spec, rows_in=2)
    assert (run.version, run.rows_out) == (first.version, 2)
    assert files_under(run.outputs_uri) == ["part-a.jsonl"]


def test_a_staging_that_recorded_nothing_it_was_made_from_is_discarded(layout: OutputLayout) -> None:
    """A staging an older pipeline left (its spec.json names no binding, and no version: its data files
    under the staging folder) was made by other code: a retry starts afresh, deleting it."""
    spec = spec_of(run_key=RUN_KEY)
    Path(layout.staged_spec_uri).parent.mkdir(parents=True, exist_ok=True)
    Path(layout.staged_spec_uri).write_text(json.dumps({"fingerprint": spec.fingerprint()}))
    stage_part(layout, "part-a", ["1", "2"], failed=["2"])

    assert commit.open_staging(layout, spec) == set()
    assert files_under(layout.staging_uri) == ["spec.json"]
    assert commit.staged_data_uri(layout) != layout.staging_uri  # a version folder, as every staging now


def test_a_committed_staging_left_behind_is_not_resumed(layout: OutputLayout) -> None:
    """Published, then died before deleting the sidecars: a new job of the same run starts afresh in a
    new version folder, and the committed version's files stay as they are."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    stage_part(layout, "part-a", ["1"])
    run = commit.write_version(layout, spec, rows_in=1)
    Path(layout.manifest_uri).write_text(json.dumps({"version": run.version}))  # publish, minus its cleanup

    assert commit.open_staging(layout, spec) == set()
    assert commit.staged_data_uri(layout) != layout.version_uri(run.version)
    assert files_under(run.outputs_uri) == ["part-a.jsonl"]


def test_discarding_another_specs_staging_keeps_the_committed_version(layout: OutputLayout) -> None:
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    stage_part(layout, "part-a", ["1"])
    run = commit.write_version(layout, spec, rows_in=1)
    Path(layout.manifest_uri).write_text(json.dumps({"version": run.version}))
    pointer = json.loads(storage.read_text(layout.staged_spec_uri))
    Path(layout.staged_spec_uri).write_text(json.dumps({**pointer, "fingerprint": "another spec"}))

    assert commit.open_staging(layout, spec) == set()
    assert files_under(run.outputs_uri) == ["part-a.jsonl"]  # committed: never deleted by a discard


def test_commit_reads_sidecars_in_parallel_and_lists_instead_of_probing(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commit's cost on an object store is its round trips: one GET per sidecar, at SIDECAR_READERS at
    once, and one listing per folder, never a per-file existence check or copy."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    for i in range(200):
        stage_part(layout, f"part-{i:03d}", [str(i)])
    threads: set[str] = set()
    read_bytes = storage.read_bytes

    def reading(uri: str, *args: Any) -> bytes:
        import threading

        threads.add(threading.current_thread().name)
        return read_bytes(uri, *args)

    monkeypatch.setattr(storage, "read_bytes", reading)
    monkeypatch.setattr(storage, "exists", _counting(storage.exists, calls := []))

    run = commit.write_version(layout, spec, rows_in=200)

    assert run.rows_out == 200 and len(files_under(run.outputs_uri)) == 200
    assert len({name for name in threads if name.startswith("raybatch-sidecars")}) > 1
    assert len(calls) < 10  # the pointer, the manifest, the folders: not one per part


def _counting(function: Any, calls: list[Any]) -> Any:  # Any: a function and its arguments
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return function(*args, **kwargs)

    return counted


def test_a_retry_after_a_repeated_part_was_dropped_commits(layout: OutputLayout) -> None:
    """write_version dropped a repeated part, then the job died before publish: the retry must
    commit, not fail on the dropped part's already-deleted files (every retry would fail alike)."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    stage_part(layout, "part-a", ["1"])
    stage_part(layout, "part-b", ["1"])
    commit._drop_repeated_rows(layout, commit._sidecars(layout))  # ... and the job dies here.

    assert commit.open_staging(layout, spec) == {"1"}
    run = commit.write_version(layout, spec, rows_in=1)

    assert run.rows_out == 1
    assert files_under(run.outputs_uri) == ["part-a.jsonl"]


# -- publish --------------------------------------------------------------------------------------


def version_folder(layout: OutputLayout, version: str) -> Path:
    folder = Path(layout.version_uri(version)) / "outputs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-0.parquet").write_text("rows")
    return folder.parent


def test_publish_writes_the_manifest_and_clears_staging(layout: OutputLayout) -> None:
    commit.open_staging(layout, spec_of(run_key=RUN_KEY))
    stage_part(layout, "part-a", ["1"])
    first = version_folder(layout, "v1")

    commit.publish(layout, {"version": "v1", "rows_in": 1}, keep_versions=False)

    assert json.loads(storage.read_text(layout.manifest_uri)) == {
        "version": "v1",
        "rows_in": 1,
        "replaced_version": None,
    }
    assert not storage.exists(layout.staging_uri)
    assert first.exists()


@pytest.mark.parametrize("manifest", [{"rows_in": 1}, {"version": None, "rows_in": 1}])
def test_publish_of_a_manifest_that_names_no_version_refuses_and_writes_nothing(
    layout: OutputLayout, manifest: dict
) -> None:
    """A manifest with no version (missing or null) is a bug of the caller: made current, it would name
    no outputs, and the next publish would take it for no version at all. The run refuses to commit."""
    commit.publish(layout, {"version": "v1"}, keep_versions=False)

    with pytest.raises(commit.InvariantError, match="names no version"):
        commit.publish(layout, dict(manifest), keep_versions=False)

    assert json.loads(storage.read_text(layout.manifest_uri))["version"] == "v1"


def test_publish_leaves_other_runs_staging_alone(tmp_path: Path) -> None:
    mine = OutputLayout(str(tmp_path / "out"), "run-a")
    other = OutputLayout(str(tmp_path / "out"), "run-b")
    staged = stage_part(other, "part-x", ["x"])
    stage_part(mine, "part-m", ["m"])

    commit.publish(mine, {"version": "v1"}, keep_versions=False)

    assert not storage.exists(mine.staging_uri)
    assert all(path.exists() for path in staged.values())


@pytest.mark.parametrize(("keep_versions", "kept"), [(False, False), (True, True)])
def test_publish_deletes_the_previous_version_unless_kept(
    layout: OutputLayout, keep_versions: bool, kept: bool
) -> None:
    first = version_folder(layout, "v1")
    commit.publish(layout, {"version": "v1"}, keep_versions=keep_versions)
    second = version_folder(layout, "v2")

    commit.publish(layout, {"version": "v2"}, keep_versions=keep_versions)

    assert json.loads(storage.read_text(layout.manifest_uri)) == {"version": "v2", "replaced_version": "v1"}
    assert second.exists()
    assert first.exists() is kept


def test_publishes_that_died_after_their_manifest_leave_nothing_behind_once_one_finishes(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tries in a row die between writing their manifest and listing their version for collection;
    the third publish removes both replaced versions. (Listed only after each one's own manifest, the
    first was never listed: a version folder left for good.)"""
    listed = commit._list_published

    def dies_after_its_manifest(version: str) -> Callable[..., None]:
        def list_published(layout: OutputLayout, listed_version: str, run_key: str | None) -> None:
            if listed_version == version:
                raise RuntimeError("the driver died here")
            listed(layout, listed_version, run_key)

        return list_published

    for version in ("v1", "v2"):
        version_folder(layout, version)
        monkeypatch.setattr(commit, "_list_published", dies_after_its_manifest(version))
        with pytest.raises(RuntimeError, match="died here"):
            commit.publish(layout, {"version": version}, keep_versions=False)
        assert commit.current_version(layout) == version
    monkeypatch.setattr(commit, "_list_published", listed)
    version_folder(layout, "v3")

    commit.publish(layout, {"version": "v3"}, keep_versions=False)

    assert sorted(path.name for path in Path(layout.output_uri, "versions").iterdir()) == ["v3"]


@pytest.mark.parametrize("moved_on", ["started afresh", "committed"])
def test_a_writer_whose_staging_moved_on_writes_nothing_more(layout: OutputLayout, moved_on: str) -> None:
    """A replica of a job that ended (cut off from Ray, not from the store) stages late: after a newer
    try started the staging afresh, or committed its version, nothing of it lands in a version folder."""
    spec = spec_of(run_key=layout.run_key)
    late = _staging_writer(layout, spec)
    late.write_part([{"source": "in.jsonl:1", "ok": True, "record": json.dumps({"id": "a"})}])  # its own
    version = Path(late.data_uri).name
    if moved_on == "started afresh":
        commit.open_staging_parts(layout, spec, RunBinding(spec=spec.fingerprint(), input="rewritten"))
    else:
        storage.write_text(layout.manifest_uri, json.dumps({"version": version}))
    before = sorted(str(path) for path in Path(layout.output_uri).rglob("*") if path.is_file())

    with pytest.raises(StagingTakenError, match=rf"was {moved_on}.*version {version} is no longer its"):
        late.write_part([{"source": "in.jsonl:2", "ok": True, "record": json.dumps({"id": "b"})}])

    assert sorted(str(path) for path in Path(layout.output_uri).rglob("*") if path.is_file()) == before


def _row(source: str, row_id: str) -> dict[str, object]:
    return {"source": source, "ok": True, "record": json.dumps({"id": row_id})}


def _version_files(layout: OutputLayout, version: str) -> list[str]:
    """The data files of a version's folders (not its report, nor its parts list)."""
    folder = Path(layout.version_uri(version))
    return sorted(path.name for name in ("outputs", "errors") for path in (folder / name).glob("*"))


def _staging_writer(layout: OutputLayout, spec: BatchInferenceSpec) -> PartWriter:
    """A writer of the run's staging as a replica gets it (opened first where it is not yet)."""
    if not Path(layout.staged_spec_uri).exists():
        commit.open_staging(layout, spec)
    writer = PartWriter(
        layout.staging_uri, "jsonl", count_labels=False, data_uri=commit.staged_data_uri(layout)
    )
    writer.create_folders()
    return writer


def test_a_part_written_across_the_commits_listing_never_lands_in_the_version(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead job's replica checks its staging, the live try's commit lists the parts and seals, then
    the replica writes: its second check finds the seal, and it removes what it wrote."""
    spec = spec_of(run_key=layout.run_key)
    live = _staging_writer(layout, spec)
    committed_part = live.write_part([_row("in.jsonl:1", "a")])
    late = PartWriter(
        layout.staging_uri, "jsonl", count_labels=False, data_uri=commit.staged_data_uri(layout)
    )
    checks = 0
    original_check = PartWriter.check_still_staging

    def commit_right_after_the_first_check(writer: PartWriter) -> None:
        nonlocal checks
        original_check(writer)  # passes: nothing is sealed yet
        checks += 1
        if checks == 1:  # the live try commits between the late writer's check and its write
            run = commit.write_version(layout, spec, rows_in=1, rewriter=live)
            commit.seal(layout, run)

    monkeypatch.setattr(PartWriter, "check_still_staging", commit_right_after_the_first_check)
    with pytest.raises(StagingTakenError, match="was sealed for its commit"):
        late.write_part([_row("in.jsonl:2", "b")])
    monkeypatch.setattr(PartWriter, "check_still_staging", original_check)

    version = Path(late.data_uri).name
    assert _version_files(layout, version) == [f"{committed_part.name}.jsonl"]
    assert sorted(path.name for path in Path(layout.staging_uri, "parts").iterdir()) == [
        f"{committed_part.name}.json"
    ]
    commit.publish(layout, {"version": version}, keep_versions=False)
    outputs = Path(layout.version_uri(version), "outputs")
    rows = [json.loads(line) for path in outputs.iterdir() for line in path.read_text().splitlines()]
    assert rows == [{"id": "a"}]


def test_the_seal_removes_a_part_written_between_the_listing_and_the_seal(layout: OutputLayout) -> None:
    """A late writer that wrote its data file after the listing and died before its second check."""
    spec = spec_of(run_key=layout.run_key)
    live = _staging_writer(layout, spec)
    kept = live.write_part([_row("in.jsonl:1", "a")])
    run = commit.write_version(layout, spec, rows_in=1, rewriter=live)
    Path(layout.version_uri(run.version), "outputs", "part-late.jsonl").write_text('{"id": "b"}\n')

    commit.seal(layout, run)

    assert _version_files(layout, run.version) == [f"{kept.name}.jsonl"]
    with pytest.raises(StagingTakenError, match="was sealed for its commit"):
        live.write_part([_row("in.jsonl:2", "b")])
    assert _version_files(layout, run.version) == [f"{kept.name}.jsonl"]


def test_a_part_written_after_the_seals_sweep_by_a_writer_that_died_goes_at_publish(
    layout: OutputLayout,
) -> None:
    """A late writer checked before the seal, wrote after its sweep and died before its second check:
    publish removes the part's files once its manifest names the version."""
    spec = spec_of(run_key=layout.run_key)
    live = _staging_writer(layout, spec)
    kept = live.write_part([_row("in.jsonl:1", "a")])
    run = commit.write_version(layout, spec, rows_in=1, rewriter=live)
    commit.seal(layout, run)
    Path(layout.version_uri(run.version), "outputs", "part-dead.jsonl").write_text('{"id": "b"}\n')

    commit.publish(layout, {"version": run.version}, keep_versions=False, committed_parts=run.part_names)

    assert _version_files(layout, run.version) == [f"{kept.name}.jsonl"]
    assert json.loads(Path(commit.parts_uri(layout, run.version)).read_text()) == [kept.name]


def test_a_part_a_dead_writer_left_after_the_publish_goes_as_the_next_try_starts(
    layout: OutputLayout,
) -> None:
    """A late writer stalled through the whole publish, wrote, and died: its part sits in the committed
    version, outside the parts list, until the next try of the output sweeps it (run._bind)."""
    spec = spec_of(run_key=layout.run_key)
    live = _staging_writer(layout, spec)
    kept = live.write_part([_row("in.jsonl:1", "a")])
    run = commit.write_version(layout, spec, rows_in=1, rewriter=live)
    commit.seal(layout, run)
    commit.publish(layout, {"version": run.version}, keep_versions=False, committed_parts=run.part_names)
    Path(layout.version_uri(run.version), "errors", "part-dead.jsonl").write_text('{"id": "b"}\n')

    assert commit.sweep_current_version(layout) == 1
    assert _version_files(layout, run.version) == [f"{kept.name}.jsonl"]
    assert commit.sweep_current_version(layout) == 0


@pytest.mark.parametrize("second_check", ["staging deleted by a publish", "store error"])
def test_a_writer_whose_second_check_fails_takes_its_part_back(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch, second_check: str
) -> None:
    """The staging goes between the writer's write and its second check (a publish deletes it), or the
    check itself fails (the store answers 503): either way the writer removes what it wrote."""
    spec = spec_of(run_key=layout.run_key)
    late = _staging_writer(layout, spec)
    version = Path(late.data_uri).name
    before = sorted(str(path) for path in Path(layout.output_uri).rglob("*") if path.is_file())
    read_text, reads = storage.read_text, []

    def read_then_fail(uri: str, within: str | None = None) -> str:
        reads.append(uri)
        if len(reads) == 1:  # the first check passes
            return read_text(uri, within)
        if second_check == "store error":
            raise OSError("503 Slow Down")
        storage.delete_tree(layout.staging_uri)  # the live try's publish, just before the read
        return read_text(uri, within)

    monkeypatch.setattr(storage, "read_text", read_then_fail)
    expected = OSError if second_check == "store error" else StagingTakenError
    with pytest.raises(expected):
        late.write_part([_row("in.jsonl:1", "a")])
    monkeypatch.setattr(storage, "read_text", read_text)

    assert _version_files(layout, version) == []
    left = sorted(str(path) for path in Path(layout.output_uri).rglob("*") if path.is_file())
    assert set(left) <= set(before)


def test_a_retry_lifts_the_seal_of_a_commit_that_did_not_publish(layout: OutputLayout) -> None:
    spec = spec_of(run_key=layout.run_key)
    first = _staging_writer(layout, spec)
    first.write_part([_row("in.jsonl:1", "a"), _row("in.jsonl:2", "b")])
    commit.seal(layout, commit.write_version(layout, spec, rows_in=2, rewriter=first))
    with pytest.raises(StagingTakenError, match="sealed"):
        first.check_still_staging()

    resumed = commit.open_staging(layout, spec)  # its commit died before publishing: a retry

    assert resumed == {"in.jsonl:1", "in.jsonl:2"}
    retry = PartWriter(
        layout.staging_uri, "jsonl", count_labels=False, data_uri=commit.staged_data_uri(layout)
    )
    retry.check_still_staging()  # the retry's replicas may stage again
    run = commit.write_version(layout, spec, rows_in=2, rewriter=retry)
    commit.seal(layout, run)
    commit.publish(layout, {"version": run.version}, keep_versions=False)
    assert (commit.current_version(layout), run.rows_out) == (run.version, 2)


def test_publish_of_the_same_version_again_keeps_it(layout: OutputLayout) -> None:
    folder = version_folder(layout, "v1")
    commit.publish(layout, {"version": "v1"}, keep_versions=False)

    commit.publish(layout, {"version": "v1", "again": True}, keep_versions=False)

    assert folder.exists()
    assert json.loads(storage.read_text(layout.manifest_uri)) == {
        "version": "v1",
        "again": True,
        "replaced_version": None,
    }


def _alternately() -> Callable[[list[str]], str]:
    """Each in turn, one storage call at a time: both runs read the manifest before either writes one."""
    chosen: list[str] = []

    def choose(waiting: list[str]) -> str:
        chosen.append(next((name for name in waiting if not chosen or name != chosen[-1]), waiting[0]))
        return chosen[-1]

    return choose


@pytest.mark.parametrize("keep_versions", [False, True])
def test_two_runs_of_a_date_publishing_at_once_leave_one_current_version(
    tmp_path: Path, keep_versions: bool
) -> None:
    """A scheduled and a manual run of one date publish at the same moment, storage call by storage
    call in turn: both read the same previous version, and the manifest written last wins. The other
    run's version is deleted as the previous one is (its task then fails, naming the commit that
    replaced it), not left behind for good; with keep_versions, every version stays."""
    scheduled, manual = (OutputLayout(str(tmp_path / "out"), key) for key in ("scheduled-1", "manual-1"))
    _, first = _commit_good_date(tmp_path)
    manifests = {}
    for layout in (scheduled, manual):
        spec = spec_of(run_key=layout.run_key)
        commit.open_staging(layout, spec)
        stage_part(layout, "part-a", ["1", "2"])
        run = commit.write_version(layout, spec, rows_in=2)
        manifests[layout.run_key] = {"version": run.version, "outputs_uri": run.outputs_uri}

    publishes = {
        layout.run_key: (
            lambda layout=layout: commit.publish(layout, manifests[layout.run_key], keep_versions)
        )
        for layout in (scheduled, manual)
    }
    interleave(publishes, choose=_alternately())

    current = commit.current_version(scheduled)
    published = {manifest["version"] for manifest in manifests.values()}
    assert current in published
    left = {path.name for path in Path(tmp_path / "out" / "versions").iterdir()}
    assert left == ({first.version, *published} if keep_versions else {current})
    assert not storage.exists(scheduled.staging_uri) and not storage.exists(manual.staging_uri)
    # Each of the two saw the first version as the one it replaced.
    assert {manifest["replaced_version"] for manifest in manifests.values()} == {first.version}


def test_a_replaced_version_whose_staging_a_retry_resumes_is_kept_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's job died after its manifest was written, before it deleted its staging; another run then
    published. The collection leaves the first run's version alone while its staging names it: its
    retry resumes every row from there and publishes the version again, whole."""
    died, other = (OutputLayout(str(tmp_path / "out"), key) for key in ("scheduled-1", "manual-1"))
    spec = spec_of(run_key=died.run_key)
    commit.open_staging(died, spec)
    stage_part(died, "part-a", ["1", "2"])
    first = commit.write_version(died, spec, rows_in=2)
    delete_tree = storage.delete_tree

    def dies_at_the_staging(uri: str, within: str | None = None) -> None:
        if uri == died.staging_uri:
            raise OSError("the job's node was lost")
        delete_tree(uri, within)

    monkeypatch.setattr(storage, "delete_tree", dies_at_the_staging)
    with pytest.raises(OSError, match="node was lost"):
        commit.publish(died, {"version": first.version}, keep_versions=False)
    monkeypatch.setattr(storage, "delete_tree", delete_tree)
    stage_part(other, "part-b", ["1", "2"])
    replacing = commit.write_version(other, spec_of(run_key=other.run_key), rows_in=2)
    commit.publish(other, {"version": replacing.version}, keep_versions=False)

    assert Path(died.version_uri(first.version)).exists()  # its staging still writes into it
    resumed = commit.open_staging(died, spec)  # the retry
    assert resumed == {"1", "2"}
    again = commit.write_version(died, spec, rows_in=2)
    commit.publish(died, {"version": again.version}, keep_versions=False)
    assert again.version == first.version == commit.current_version(died)
    assert files_under(again.outputs_uri) == ["part-a.jsonl"]
    assert {path.name for path in Path(tmp_path / "out" / "versions").iterdir()} == {first.version}


def test_publish_over_a_manifest_of_the_old_layout(layout: OutputLayout) -> None:
    """A manifest from before versions existed has no "version": nothing to delete, no error."""
    storage.write_text(layout.manifest_uri, json.dumps({"status": "complete", "outputs_uri": "x/outputs"}))
    version_folder(layout, "v1")

    commit.publish(layout, {"version": "v1"}, keep_versions=False)

    assert json.loads(storage.read_text(layout.manifest_uri)) == {"version": "v1", "replaced_version": None}


def test_write_version_then_publish_replaces_the_previous_run(layout: OutputLayout) -> None:
    """Two runs of the same output end to end: readers following the manifest see the second."""
    spec = spec_of(run_key=RUN_KEY)
    stage_part(layout, "part-a", ["1"])
    first = commit.write_version(layout, spec, rows_in=1)
    commit.publish(layout, {"version": first.version, "outputs_uri": first.outputs_uri}, keep_versions=False)
    commit.open_staging(layout, spec)
    stage_part(layout, "part-b", ["1", "2"])

    second = commit.write_version(layout, spec, rows_in=2)
    new_manifest = {"version": second.version, "outputs_uri": second.outputs_uri}
    commit.publish(layout, new_manifest, keep_versions=False)

    manifest = json.loads(storage.read_text(layout.manifest_uri))
    assert manifest["version"] == second.version != first.version
    assert files_under(manifest["outputs_uri"]) == ["part-b.jsonl"]
    assert not Path(layout.version_uri(first.version)).exists()
    assert not storage.exists(layout.staging_uri)
    assert sorted(p.name for p in Path(layout.output_uri, "versions").iterdir()) == [second.version]


def test_commit_reads_back_only_the_sidecars_nobody_reported(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replicas report the parts they staged with their batches (and resume read the earlier
    try's): commit takes those as they are, and reads back only the rest (a replica that died before
    reporting, say), so an object store sees a GET per unreported part, not per part."""
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    for i in range(10):
        stage_part(layout, f"part-{i}", [str(i)], tokens=(i, 1))
    everything = commit._sidecars(layout)
    reported = [part for part in everything if part.name not in ("part-3", "part-7")]
    read_bytes = storage.read_bytes
    reads: list[str] = []
    monkeypatch.setattr(storage, "read_bytes", lambda uri, *args: reads.append(uri) or read_bytes(uri, *args))

    run = commit.write_version(layout, spec, rows_in=10, known_parts=reported)

    sidecar_reads = sorted(Path(uri).name for uri in reads if "/parts/" in uri)
    assert sidecar_reads == ["part-3.json", "part-7.json"]
    assert (run.rows_out, run.tokens_in) == (10, sum(range(10)))


# -- hold: a run whose failed rows fail it replaces nothing ---------------------------------------------


def _commit_good_date(tmp_path: Path) -> tuple[OutputLayout, commit.CommittedRun]:
    """The date's first run: every row answered, committed as pipeline/run.py commits it."""
    good = OutputLayout(str(tmp_path / "out"), "daily-run-1")
    spec = spec_of(run_key=good.run_key)
    commit.open_staging(good, spec)
    stage_part(good, "part-good", ["1", "2", "3"])
    run = commit.write_version(good, spec, rows_in=3)
    assert not run.held
    commit.publish(good, {"version": run.version, "outputs_uri": run.outputs_uri}, keep_versions=False)
    return good, run


DIGEST = "input-files-as-they-were"


def _binding(spec: Any, digest: str = DIGEST) -> RunBinding:  # Any: a BatchInferenceSpec
    return RunBinding(spec=spec.fingerprint(), input=digest, code="code-1", model="m-1")


def _held_rerun(
    tmp_path: Path, **params: Any
) -> tuple[OutputLayout, commit.CommittedRun]:  # Any: spec values.
    """A re-run of the date (another run key, as a backfill's) whose rows mostly fail: held, with the
    manifest pipeline/run.py holds (its counts, spec fingerprint and input digest)."""
    rerun = OutputLayout(str(tmp_path / "out"), "backfill-run-2")
    spec = spec_of(run_key=rerun.run_key, **params)
    commit.open_staging(rerun, spec)
    stage_part(rerun, "part-bad", ["1", "2", "3"], failed=["1", "2"])
    run = commit.write_version(rerun, spec, rows_in=3)
    assert run.held
    held = {
        "status": "held",
        "version": run.version,
        "spec_fingerprint": spec.fingerprint(),
        "input_digest": DIGEST,
        "binding": _binding(spec).as_dict(),
        "rows_in": 3,
        "rows_out": run.rows_out,
        "rows_failed": run.rows_failed,
        "job_id": "raybatch-held-try",
        "timings": {"generating_s": 41.5, "gpu_seconds_held": 60.2},
        "engine_pool": {"warm_replicas": 1, "replicas": 1},
    }
    commit.hold(rerun, held)
    return rerun, run


def test_the_failed_fraction_is_of_distinct_rows_so_duplicates_do_not_dilute_it(tmp_path: Path) -> None:
    """100 rows, 50 of them a repeated id: 15 of the 50 distinct rows failed, 30% (not 15 of 100)."""
    layout = OutputLayout(str(tmp_path / "out"), RUN_KEY)
    spec = spec_of(run_key=RUN_KEY, max_failed_fraction=0.2)
    commit.open_staging(layout, spec)
    sources = [str(n) for n in range(100)]
    stage_part(
        layout, "part-a", sources, failed=sources[35:], reasons={"duplicate id": 50, "empty prompt": 15}
    )

    run = commit.write_version(layout, spec, rows_in=100)

    assert run.held
    assert run.failed_rows_message is not None
    assert run.failed_rows_message.startswith(
        "15 of 50 rows failed (30.0%, duplicate ids not counted), over max_failed_fraction=0.2."
    )
    looser = commit.write_version(layout, spec_of(run_key=RUN_KEY, max_failed_fraction=0.3), rows_in=100)
    assert not looser.held  # exactly at the threshold passes, as 15 of 50 is 0.3


def _held_files(layout: OutputLayout) -> bool:
    return storage.exists(commit.held_manifest_uri(layout))


def test_a_run_whose_rows_fail_is_held_and_the_dates_good_version_stays(tmp_path: Path) -> None:
    """A re-run with a wrong column failed every row, committed a 0-row version and
    deleted the date's good one. Held instead: the good version stays current and whole."""
    good, first = _commit_good_date(tmp_path)

    rerun, held = _held_rerun(tmp_path)

    assert json.loads(storage.read_text(good.manifest_uri))["version"] == first.version  # still current
    assert files_under(first.outputs_uri) == ["part-good.jsonl"]
    assert files_under(held.errors_uri) == ["part-bad.jsonl"]  # kept for a look
    assert _held_files(rerun) and not _held_files(good)
    assert held.failed_rows_message is not None
    assert (
        f"Nothing was committed: {good.output_uri} is as it was (version {first.version} stays current)."
        in (held.failed_rows_message)
    )
    assert (
        f"outputs and errors are kept until its next try, for a look at {held.outputs_uri}, "
        f"{held.errors_uri}, its report at" in held.failed_rows_message
    )
    assert "with looser max_failed_fraction / max_failed_rows (and the same input and parameters)" in (
        held.failed_rows_message
    )


def test_the_first_run_of_a_date_held_leaves_no_manifest(tmp_path: Path) -> None:
    rerun, held = _held_rerun(tmp_path)

    assert not storage.exists(rerun.manifest_uri)
    assert held.failed_rows_message is not None
    assert "is as it was (it has no version yet)." in held.failed_rows_message


def test_a_held_run_retried_with_looser_thresholds_commits_its_staged_rows(tmp_path: Path) -> None:
    """The thresholds are not in the fingerprint: the retry takes every held row and commits them."""
    good, first = _commit_good_date(tmp_path)
    rerun, held = _held_rerun(tmp_path)
    looser = spec_of(run_key=rerun.run_key, max_failed_fraction=0.9)

    taken = commit.take_held(rerun, looser, _binding(looser))
    assert taken is not None and taken.passes
    assert commit.open_staging(rerun, looser) == {"1", "2", "3"}
    # The committing job starts no engine; the manifest says what the rows cost, and where.
    assert commit.held_try(taken.manifest) == {
        "job_id": "raybatch-held-try",
        "version": held.version,
        "timings": {"generating_s": 41.5, "gpu_seconds_held": 60.2},
        "engine_pool": {"warm_replicas": 1, "replicas": 1},
    }
    run = commit.write_version(rerun, looser, rows_in=3, held_try=commit.held_try(taken.manifest))
    assert not run.held
    page = Path(run.report_uri or "").read_text()
    assert "What generating these rows took" in page and "raybatch-held-try" in page
    assert "<td class=num>41.5 s</td>" in page  # the held try's generating: this run had none
    commit.publish(rerun, {"version": run.version, "outputs_uri": run.outputs_uri}, keep_versions=False)

    assert run.version == held.version
    assert json.loads(storage.read_text(good.manifest_uri))["version"] == held.version
    assert not Path(good.version_uri(first.version)).exists()  # replaced, as any commit replaces
    assert not _held_files(rerun) and not storage.exists(rerun.staging_uri)


def test_a_held_run_retried_as_it_was_is_held_again_without_generating(tmp_path: Path) -> None:
    """An automatic retry (the same thresholds, input, code and model) would generate, pay for and
    hold the same rows again: it takes them as they are and is held again; they stay for the next."""
    good, first = _commit_good_date(tmp_path)
    rerun, held = _held_rerun(tmp_path)
    retry = spec_of(run_key=rerun.run_key)

    taken = commit.take_held(rerun, retry, _binding(retry))

    assert taken is not None and not taken.passes and taken.manifest["version"] == held.version
    assert _held_files(rerun) and files_under(held.errors_uri) == ["part-bad.jsonl"]  # kept
    assert json.loads(storage.read_text(good.manifest_uri))["version"] == first.version


def test_a_try_held_again_names_the_held_try_s_cost_as_that_try_s_not_its_own(tmp_path: Path) -> None:
    """The try held again generated nothing: the rows' timings and pool are the held try's, under
    ``held_try``; its own are none (else a retry reads as a second run paid for)."""
    rerun, _ = _held_rerun(tmp_path)
    retry = spec_of(run_key=rerun.run_key)
    taken = commit.take_held(rerun, retry, _binding(retry))
    assert taken is not None
    held = {**taken.manifest, "timings": {"generating_s": 41.5}, "engine_pool": {"replicas": 2}}

    again = commit.held_again(held, "raybatch-try-3")

    assert (again["job_id"], again["timings"], again["engine_pool"]) == ("raybatch-try-3", None, None)
    assert again["held_try"] == {
        "job_id": held["job_id"],
        "version": held["version"],
        "timings": {"generating_s": 41.5},
        "engine_pool": {"replicas": 2},
    }
    assert (again["status"], again["version"], again["rows_in"]) == (
        held["status"],
        held["version"],
        held["rows_in"],
    )
    assert held["timings"] == {"generating_s": 41.5}  # the held manifest is left as it was


@pytest.mark.parametrize(
    ("params", "digest", "changed"),
    [
        ({"max_failed_fraction": 0.9}, "the-file-fixed-in-place", "the input files"),
        ({"user_template": "{Name}"}, DIGEST, "the job's parameters"),  # the column fixed
    ],
)
def test_a_held_run_retried_otherwise_starts_afresh_and_the_good_version_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, params: dict[str, Any], digest: str, changed: str
) -> None:
    """A file fixed in place (or a fixed preprocess behind the same name) must not keep the held rows,
    each retry held again: the rows are discarded and the run starts afresh."""
    good, first = _commit_good_date(tmp_path)
    rerun, held = _held_rerun(tmp_path)
    retry = spec_of(run_key=rerun.run_key, **params)

    with caplog.at_level(logging.INFO, logger="airflow_provider_raybatch.pipeline"):
        assert commit.take_held(rerun, retry, _binding(retry, digest)) is None

    assert f"changed since: {changed}" in caplog.text
    assert commit.open_staging(rerun, retry) == set()
    assert not Path(good.version_uri(held.version)).exists() and not _held_files(rerun)
    assert json.loads(storage.read_text(good.manifest_uri))["version"] == first.version
    assert files_under(first.outputs_uri) == ["part-good.jsonl"]


def test_a_held_run_retried_with_fixed_code_starts_afresh(tmp_path: Path) -> None:
    """A preprocess fixed under the same dotted path: the spec is the same, the shipped code is not."""
    rerun, _ = _held_rerun(tmp_path)
    retry = spec_of(run_key=rerun.run_key, max_failed_fraction=0.9)
    fixed = RunBinding(spec=retry.fingerprint(), input=DIGEST, code="code-2", model="m-1")

    assert commit.take_held(rerun, retry, fixed) is None
    assert not _held_files(rerun)


def test_a_held_run_without_its_report_does_not_name_one(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "render_report", lambda *_: 1 / 0)
    spec = spec_of(run_key=RUN_KEY)
    commit.open_staging(layout, spec)
    stage_part(layout, "part-a", ["1", "2"], failed=["1"])

    run = commit.write_version(layout, spec, rows_in=2)

    assert run.held and run.report_uri is None and run.failed_rows_message is not None
    assert "report" not in run.failed_rows_message
