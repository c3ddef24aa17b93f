"""Tests of airflow_provider_raybatch/pipeline/prompt/prompts.py: a row's chat messages, or why
there are none."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline.prompt.prompts import build_messages, load_callable, row_id
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec


def spec_of(**params: Any) -> BatchInferenceSpec:  # Any: spec parameter values.
    return BatchInferenceSpec.build(model="m", input_uri="in.jsonl", output_uri="out", **params)


TEMPLATE_SPEC = spec_of(
    system_prompt="Answer with one word.", user_template="Industry of {Company} ({Customer Id})?"
)
MESSAGES_SPEC = spec_of(messages_column="messages")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


# -- user_template ------------------------------------------------------------------------------


def test_template_with_system_prompt() -> None:
    row = {"Company": "Acme", "Customer Id": 7, "unused": None}

    assert build_messages(TEMPLATE_SPEC, row) == [
        {"role": "system", "content": "Answer with one word."},
        {"role": "user", "content": "Industry of Acme (7)?"},
    ]


def test_template_without_system_prompt_is_one_user_message() -> None:
    spec = spec_of(user_template="{a}-{b}")

    assert build_messages(spec, {"a": 0, "b": False}) == [{"role": "user", "content": "0-False"}]


def test_row_values_with_braces_are_not_reformatted() -> None:
    spec = spec_of(user_template="Q: {q}")

    assert build_messages(spec, {"q": "{Company} {0}"})[-1]["content"] == "Q: {Company} {0}"


def test_missing_column_names_the_column() -> None:
    with pytest.raises(
        ValueError, match="^missing column: user_template needs column 'Customer Id', which the row lacks$"
    ):
        build_messages(TEMPLATE_SPEC, {"Company": "Acme"})


@pytest.mark.parametrize("value", ["", "   ", None, float("nan"), math.nan])
def test_empty_column_names_the_column(value: Any) -> None:  # Any: a cell value.
    with pytest.raises(ValueError, match="^empty prompt: column 'Company' used by user_template is empty$"):
        build_messages(TEMPLATE_SPEC, {"Company": value, "Customer Id": 1})


# -- messages_column ----------------------------------------------------------------------------


def test_messages_list_is_passed_through() -> None:
    assert build_messages(MESSAGES_SPEC, {"messages": CHAT, "other": 1}) == CHAT


def test_messages_json_text_is_parsed() -> None:
    assert build_messages(MESSAGES_SPEC, {"messages": json.dumps(CHAT)}) == CHAT


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (
            "not json [",
            "bad messages: column 'messages' is text but not JSON: Expecting value; it must hold a ",
        ),
        ("", "bad messages: column 'messages' is text but not JSON: "),
        ([], "bad messages: column 'messages' must hold a non-empty list"),
        ("[]", "bad messages: column 'messages' must hold a non-empty list"),
        ({"role": "user", "content": "Hi"}, "bad messages: column 'messages' must hold a non-empty list"),
        (None, "bad messages: column 'messages' must hold a non-empty list"),
        ([{"role": "user"}], "bad messages: message 0 of column 'messages' needs 'role' and 'content'"),
        (
            [{"role": "user", "content": "a"}, "plain text"],
            "bad messages: message 1 of column 'messages' needs",
        ),
        (
            [{"role": "user", "content": "  "}, {"role": "system", "content": ""}],
            "empty prompt: every message of column 'messages' is empty",
        ),
    ],
)
def test_invalid_messages_name_the_column(value: Any, reason: str) -> None:  # Any: a cell value.
    with pytest.raises(ValueError) as info:
        build_messages(MESSAGES_SPEC, {"messages": value})

    assert str(info.value).startswith(reason)
    assert "'messages'" in str(info.value)


def test_missing_messages_column() -> None:
    with pytest.raises(ValueError, match="^bad messages: column 'messages' must hold a non-empty list"):
        build_messages(MESSAGES_SPEC, {"text": "hi"})


# -- row ids ------------------------------------------------------------------------------------


def test_row_id_without_id_column_is_the_source() -> None:
    assert row_id(TEMPLATE_SPEC, {"Company": "Acme"}, "in.jsonl:3") == "in.jsonl:3"


@pytest.mark.parametrize(("value", "expected"), [(42, "42"), ("c-1", "c-1"), (0, "0"), (1.5, "1.5")])
def test_row_id_from_id_column(value: Any, expected: str) -> None:  # Any: a cell value.
    spec = spec_of(user_template="{x}", id_column="Id")

    assert row_id(spec, {"Id": value}, "in.jsonl:3") == expected


@pytest.mark.parametrize("row", [{}, {"Id": None}, {"Id": ""}, {"Id": float("nan")}])
def test_row_id_missing_or_empty_names_the_id_column(row: dict) -> None:
    spec = spec_of(user_template="{x}", id_column="Id")

    with pytest.raises(ValueError, match="^missing id: id column 'Id' is missing or empty$"):
        row_id(spec, row, "in.jsonl:3")


# -- load_callable ------------------------------------------------------------------------------


@pytest.mark.parametrize("dotted_path", ["json:dumps", "json.dumps"])
def test_load_callable_both_syntaxes(dotted_path: str) -> None:
    assert load_callable(dotted_path) is json.dumps


def test_load_callable_nested_module() -> None:
    import os.path

    assert load_callable("os.path:join") is os.path.join
    assert load_callable("os.path.join") is os.path.join


@pytest.mark.parametrize(
    "dotted_path", ["string.ascii_letters", "string:ascii_letters", "json.no_such_function"]
)
def test_load_callable_non_callable_raises_import_error(dotted_path: str) -> None:
    with pytest.raises(ImportError, match="has no callable"):
        load_callable(dotted_path)


def test_load_callable_unknown_module() -> None:
    with pytest.raises(ImportError):
        load_callable("no_such_module_for_raybatch.fn")


# -- image_column ---------------------------------------------------------------------------------

IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def test_image_part_goes_before_the_text_and_all_content_is_parts() -> None:
    spec = spec_of(system_prompt="Caption images.", user_template="Describe {name}.", image_column="image")

    messages = build_messages(spec, {"name": "the beach", "image": "ignored here"}, IMAGE_PART)

    assert messages == [
        {"role": "system", "content": [{"type": "text", "text": "Caption images."}]},
        {"role": "user", "content": [IMAGE_PART, {"type": "text", "text": "Describe the beach."}]},
    ]


def test_image_messages_without_system_prompt() -> None:
    spec = spec_of(user_template="Describe it.", image_column="image")

    assert build_messages(spec, {}, IMAGE_PART) == [
        {"role": "user", "content": [IMAGE_PART, {"type": "text", "text": "Describe it."}]}
    ]


def test_image_messages_still_check_the_template_columns() -> None:
    spec = spec_of(user_template="Describe {name}.", image_column="image")

    with pytest.raises(ValueError, match="^missing column: "):
        build_messages(spec, {"image": "x.png"}, IMAGE_PART)
