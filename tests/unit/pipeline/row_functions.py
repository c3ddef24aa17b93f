"""Row functions the row-path tests name by dotted path (tests/unit/pipeline/test_row_steps.py)."""

from __future__ import annotations

from typing import Any


def with_own_params(row: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    """Ray Data LLM's shape: messages and the row's own sampling parameters."""
    return {"messages": [{"role": "user", "content": row["q"]}], "sampling_params": row["params"]}


def explode(row: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    raise RuntimeError("this preprocess always fails")


def picky(row: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    if "hates" in row["q"]:
        raise ValueError("I do not like this row")
    return row


def to_messages(row: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    """Messages only; two user turns in a row where the row asks for it (strict templates reject that)."""
    turns = [{"role": "user", "content": row["q"]}]
    return {"messages": turns * 2 if row.get("twice") else turns}


def choice_on_some_rows(row: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    """A choice constraint on the rows that carry labels; free text on the others."""
    out: dict[str, Any] = {"messages": [{"role": "user", "content": row["q"]}]}
    if row.get("labels"):
        out["sampling_params"] = {"structured_outputs": {"choice": row["labels"]}}
    return out


def answer_only(row: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    """A Ray Data LLM habit: keep only the answer (the token columns go)."""
    return {"answer": row["generated_text"]}
