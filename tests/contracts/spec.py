"""The published API specs under ``specs/`` as JSON Schemas the tests can validate and generate.

Each spec is a trimmed, otherwise unmodified copy (see SOURCES.md). OpenAPI schemas are JSON
Schema with two differences handled here: ``$ref``s point into the document's components
(inlined, none of the rerank schemas is recursive), and OpenAPI 3.0's ``nullable: true``
(TEI) means "or null" (rewritten to a ``type`` list). Everything is checked with Draft 2020-12,
which OpenAPI 3.1 (Cohere, Voyage, Infinity, Mixedbread) uses and 3.0 keywords survive.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from hypothesis import strategies as st

SPECS = Path(__file__).parent / "specs"

# provider -> (spec file, rerank path). vLLM and the sidecar publish no static spec.
RERANK_PATHS = {
    "tei": "/rerank",
    "cohere": "/v2/rerank",
    "jina": "/v1/rerank",
    "voyage": "/rerank",
    "infinity": "/rerank",
    "mixedbread": "/v1/reranking",
}


@cache
def document(provider: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SPECS / f"{provider}.json").read_text(encoding="utf-8"))
    return data


def _pointer(root: dict[str, Any], ref: str) -> Any:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _resolve(node: Any, root: dict[str, Any], openapi_30: bool) -> Any:
    if isinstance(node, list):
        return [_resolve(v, root, openapi_30) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _resolve(_pointer(root, node["$ref"]), root, openapi_30)
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **_resolve(siblings, root, openapi_30)} if siblings else target
    out = {k: _resolve(v, root, openapi_30) for k, v in node.items()}
    if openapi_30 and out.pop("nullable", False) is True:
        if "type" in out:
            kinds = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = [*kinds, "null"]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    # Annotation-only keywords whose OpenAPI values are not valid JSON Schema ("example" as
    # a string for an integer, TEI's "default": "false") are dropped; they constrain nothing.
    for key in ("example", "examples", "default"):
        out.pop(key, None)
    return out


def resolved(provider: str, node: Any) -> Any:
    root = document(provider)
    return _resolve(copy.deepcopy(node), root, str(root["openapi"]).startswith("3.0"))


def operation(provider: str) -> dict[str, Any]:
    op: dict[str, Any] = document(provider)["paths"][RERANK_PATHS[provider]]["post"]
    return op


def request_schema(provider: str) -> dict[str, Any]:
    body = operation(provider)["requestBody"]["content"]["application/json"]["schema"]
    schema: dict[str, Any] = resolved(provider, body)
    return schema


def response_schema(provider: str, status: str = "200") -> dict[str, Any]:
    response = resolved(provider, operation(provider)["responses"][status])
    schema: dict[str, Any] = response["content"]["application/json"]["schema"]
    return schema


def error_statuses(provider: str) -> list[str]:
    """Every non-2xx response the operation documents (``4XX`` ranges included)."""
    return [s for s in operation(provider)["responses"] if not s.startswith("2")]


def validate(schema: dict[str, Any], instance: Any) -> None:
    """Raise jsonschema.ValidationError (with the failing path) if `instance` is invalid."""
    jsonschema.Draft202012Validator(schema).validate(instance)


def strategy(schema: Any) -> st.SearchStrategy[Any]:
    """Values of a resolved schema, for the keywords the rerank specs use.

    hypothesis-jsonschema (0.23.1, the newest) cannot generate objects with the installed
    Hypothesis (its object strategy calls ``many.more()``, which Hypothesis 6.1xx removed),
    so this small generator stands in; every value is re-validated against the spec by the
    tests, so a generator mistake fails loudly instead of passing silently.
    """
    if not isinstance(schema, dict) or not schema:
        return st.one_of(st.none(), st.booleans(), st.integers(-9, 9), st.text(max_size=5))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([strategy(s) for s in schema[key]])
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(part)
        return strategy(merged)
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([strategy({**schema, "type": k}) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**31)), schema.get("maximum", 2**31))
    if kind == "number":
        low, high = schema.get("minimum", -1e9), schema.get("maximum", 1e9)
        return st.one_of(st.floats(low, high), st.integers(int(low), int(high)))
    if kind == "string":
        return st.text(
            min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 8), 8)
        )
    if kind == "array":
        return st.lists(
            strategy(schema.get("items", {})),
            min_size=schema.get("minItems", 0),
            max_size=schema.get("maxItems", 4),
        )
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    return st.fixed_dictionaries(
        {k: strategy(v) for k, v in properties.items() if k in required},
        optional={k: strategy(v) for k, v in properties.items() if k not in required},
    )
