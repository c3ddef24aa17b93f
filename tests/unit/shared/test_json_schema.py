"""A JSON schema for structured outputs, misspelled: JSON Schema ignores a keyword it does not know,
so the misspelling would pass and the output not be held to it; checked with the spec."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.json_schema import schema_problem
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

WHERE = "sampling_params['structured_outputs']['json']"
PROFILE = {
    "type": "object",
    "properties": {
        "industry": {"type": "string", "enum": ["Retail", "Other"]},
        "employees": {"type": "integer"},
    },
    "required": ["industry", "employees"],
    "additionalProperties": False,
}


def spec(schema: Any) -> BatchInferenceSpec:  # Any: the schema as a DAG writes it.
    return BatchInferenceSpec.build(
        model="m",
        input_uri="in.jsonl",
        output_uri="out",
        user_template="{text}",
        sampling_params={"structured_outputs": {"json": schema}},
    )


def with_(path: list[str], key: str, value: object) -> dict[str, Any]:  # Any: JSON.
    """PROFILE with ``key: value`` set in the subschema at ``path``."""
    schema: dict[str, Any] = {
        **PROFILE,
        "properties": {name: {**sub} for name, sub in PROFILE["properties"].items()},
    }
    node = schema
    for step in path:
        node = node[step]
    node[key] = value
    return schema


def test_a_right_schema_passes_and_its_text_too() -> None:
    assert spec(PROFILE).sampling_params["structured_outputs"]["json"] == PROFILE
    import json

    spec(json.dumps(PROFILE))


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            {**{k: v for k, v in PROFILE.items() if k != "required"}, "requried": ["industry"]},
            f"{WHERE}: unknown keyword 'requried' (did you mean 'required'?)",
        ),
        (
            {
                **{k: v for k, v in PROFILE.items() if k != "additionalProperties"},
                "additional_properties": False,
            },
            f"{WHERE}: unknown keyword 'additional_properties' (did you mean 'additionalProperties'?)",
        ),
        (
            with_(["properties", "industry"], "enums", ["a"]),
            f"{WHERE}['properties']['industry']: unknown keyword 'enums' (did you mean 'enum'?)",
        ),
        (
            with_(["properties", "employees"], "type", "int"),
            f"{WHERE}['properties']['employees']: type 'int' is not a JSON type (did you mean 'integer'?)",
        ),
        (
            {"type": "array", "items": {"type": "str"}},
            f"{WHERE}['items']: type 'str' is not a JSON type (did you mean 'string'?)",
        ),
        (
            {**PROFILE, "required": ["industy"]},
            f"{WHERE}: required names 'industy', which is not among its properties "
            "(did you mean 'industry'?)",
        ),
        (
            {"anyOf": [{"type": "string"}, {"type": "nul"}]},
            f"{WHERE}['anyOf'][1]: type 'nul' is not a JSON type (did you mean 'null'?)",
        ),
        ("{not json", f"{WHERE} is text but not JSON"),
        (["type", "object"], f"{WHERE}=['type', 'object'] must be a JSON schema: a dict"),
    ],
)
def test_a_misspelled_schema_is_refused_naming_where_and_the_likely_spelling(
    schema: Any, message: str
) -> None:
    with pytest.raises(BatchSpecError) as refused:
        spec(schema)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "schema",
    [
        # Annotations and extension keywords change nothing: left alone, even near a known one.
        {**PROFILE, "example": {"industry": "Retail"}, "x-owner": "data", "descripton": "typo, harmless"},
        # A required name far from every property is a choice, not a typo.
        {**PROFILE, "required": ["industry", "employees", "country"]},
        {"type": ["string", "null"]},
        {"$defs": {"label": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/label"}}},
    ],
)
def test_what_json_schema_allows_and_no_misspelling_explains_passes(schema: dict[str, Any]) -> None:
    assert schema_problem(schema, WHERE) is None


def test_a_deep_schema_is_walked_only_so_far() -> None:
    schema: dict[str, Any] = {"type": "strin"}
    for _ in range(200):
        schema = {"type": "array", "items": schema}
    assert schema_problem(schema, WHERE) is None  # no RecursionError; a real schema is a few levels deep
