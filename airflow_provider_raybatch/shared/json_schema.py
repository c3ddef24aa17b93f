"""Misspellings in a JSON schema given for structured outputs (``{'json': schema}``), found before a run.

JSON Schema ignores a keyword it does not know, so ``"requried": ["industry"]`` or
``"additional_properties": false`` is valid and says nothing: the model's output is simply not held to
it, and every row succeeds with answers the schema was meant to refuse. A ``type`` that is no JSON type
(``"str"``, ``"int"``) is refused by the engine for every row. Pure Python (no jsonschema), so both the
operator and the cluster run the same check with the spec.
"""

from __future__ import annotations

import difflib
import json
import reprlib
from collections.abc import Iterator

from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue

#: JSON Schema's keywords that shape what is valid (drafts 7 to 2020-12).
_CONSTRAINING = frozenset(
    """
    type enum const properties required additionalProperties patternProperties propertyNames minProperties
    maxProperties dependentRequired dependentSchemas dependencies items prefixItems additionalItems contains
    minContains maxContains minItems maxItems uniqueItems unevaluatedItems unevaluatedProperties minimum
    maximum exclusiveMinimum exclusiveMaximum multipleOf minLength maxLength pattern format allOf anyOf oneOf
    not if then else $ref $defs definitions $schema $id $anchor $dynamicRef $dynamicAnchor $vocabulary
    contentEncoding contentMediaType contentSchema
    """.split()
)
#: Keywords that only annotate: a near miss of one (OpenAPI's ``example``) changes nothing, so it is
#: neither refused nor offered as the likely spelling.
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment"}
)
_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
#: Python's and other languages' type names, as a schema written from a dataclass may have them.
_TYPE_NAMES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
    "none": "null",
    "double": "number",
    "long": "integer",
}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = tuple(
    """
    items additionalProperties additionalItems not contains if then else propertyNames unevaluatedItems
    unevaluatedProperties contentSchema
    """.split()
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
#: Deeper than this the schema is not walked (a real one is a few levels deep).
_MAX_DEPTH = 64
_CUTOFF = 0.8


def schema_problem(schema: JsonValue, where: str) -> str | None:
    """The first misspelled keyword, JSON type or required property name in ``schema`` (a dict, or
    its JSON text, as vLLM takes either), said with the likely spelling; or what ``schema`` is instead
    of a schema; or None.

    :param where: how the schema is named to the reader, e.g.
        ``sampling_params['structured_outputs']['json']``.
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as err:
            return f"{where} is text but not JSON: {err.msg}; give the schema as a dict."
    if not isinstance(schema, dict):
        shown = reprlib.repr(schema)
        return f"{where}={shown} must be a JSON schema: a dict, e.g. {{'type': 'object'}}."
    for path, node in _schemas(schema, "", 0):
        problem = _node_problem(node)
        if problem is not None:
            return f"{where}{path}: {problem}"
    return None


def _schemas(node: JsonValue, path: str, depth: int) -> Iterator[tuple[str, JsonObject]]:
    """Each (sub)schema of ``node`` that is an object, with its path from the top."""
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return
    yield path, node
    for keyword in _SCHEMA_MAPS:
        if isinstance(node.get(keyword), dict):
            for name, sub in node[keyword].items():
                yield from _schemas(sub, f"{path}[{keyword!r}][{name!r}]", depth + 1)
    for keyword in _SCHEMA_ONE:
        yield from _schemas(node.get(keyword), f"{path}[{keyword!r}]", depth + 1)
    for keyword in _SCHEMA_LISTS:
        if isinstance(node.get(keyword), list):
            for index, sub in enumerate(node[keyword]):
                yield from _schemas(sub, f"{path}[{keyword!r}][{index}]", depth + 1)


def _node_problem(node: JsonObject) -> str | None:
    for key in node:
        if not isinstance(key, str) or key in _CONSTRAINING or key in _ANNOTATIONS:
            continue
        close = difflib.get_close_matches(key, sorted(_CONSTRAINING), n=1, cutoff=_CUTOFF)
        if close:
            return (
                f"unknown keyword {key!r} (did you mean {close[0]!r}?): JSON Schema ignores a keyword it "
                "does not know, so the output would not be held to it."
            )
    types = node.get("type")
    for type_name in types if isinstance(types, list) else [types]:
        if isinstance(type_name, str) and type_name not in _TYPES:
            meant = _TYPE_NAMES.get(type_name.lower()) or next(
                iter(difflib.get_close_matches(type_name.lower(), _TYPES, n=1, cutoff=0.6)), None
            )
            hint = f" (did you mean {meant!r}?)" if meant else ""
            return f"type {type_name!r} is not a JSON type{hint}; use one of {list(_TYPES)}."
    properties, required = node.get("properties"), node.get("required")
    if isinstance(properties, dict) and isinstance(required, list):
        for name in required:
            if isinstance(name, str) and name not in properties:
                close = difflib.get_close_matches(name, [str(p) for p in properties], n=1, cutoff=_CUTOFF)
                if close:
                    return (
                        f"required names {name!r}, which is not among its properties (did you mean "
                        f"{close[0]!r}?): the model would have to add a property {name!r} of any value."
                    )
    return None
