"""The rerank APIs' documented contracts (``schemas/``) as JSON Schemas to validate and generate.

Each ``schemas/<provider>.json`` is written here, in our own structure, from what the
provider documents (sources in SOURCES.md): the endpoint, and JSON Schema (Draft 2020-12) for
the request body, the 200 response body and the body of each documented error status, plus any
other endpoint the client reads (TEI's ``GET /info``). A ``$ref`` points into the file's own
``$defs`` and is inlined on reading (none is recursive); keys starting with ``$`` outside a
schema are comments.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from hypothesis import strategies as st

SCHEMAS = Path(__file__).parent / "schemas"

# vLLM and the sidecar document no static contract: none is written for them.
DOCUMENTED = sorted(p.stem for p in SCHEMAS.glob("*.json"))


@cache
def _document(provider: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCHEMAS / f"{provider}.json").read_text(encoding="utf-8"))
    return data


def _resolve(node: Any, root: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(v, root) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **siblings}, root)
    return {k: _resolve(v, root) for k, v in node.items()}


def part(provider: str, *path: str) -> Any:
    """A fresh, ``$ref``-free copy of the node at `path` in `provider`'s contract."""
    root = _document(provider)
    node: Any = root
    for key in path:
        node = node[key]
    return _resolve(copy.deepcopy(node), root)


def endpoint(provider: str) -> tuple[str, str]:
    """The documented method and path of the rerank call, e.g. ``("POST", "/v2/rerank")``."""
    method, path = _document(provider)["endpoint"].split(" ")
    return method, path


def request_schema(provider: str) -> dict[str, Any]:
    schema: dict[str, Any] = part(provider, "request")
    return schema


def response_schema(provider: str) -> dict[str, Any]:
    schema: dict[str, Any] = part(provider, "response")
    return schema


def other_response_schema(provider: str, call: str) -> dict[str, Any]:
    """The response of another documented endpoint, e.g. ``other_response_schema("tei",
    "GET /info")``."""
    schema: dict[str, Any] = part(provider, "other_endpoints", call, "response")
    return schema


def error_statuses(provider: str) -> list[str]:
    """Every documented error status, as written (``"4XX"``-style ranges included)."""
    return [s for s in _document(provider)["errors"] if not s.startswith("$")]


def error(provider: str, status: str) -> dict[str, Any]:
    """The documented error: its ``body`` schema and its ``example`` body, where given."""
    entry: dict[str, Any] = part(provider, "errors", status)
    return entry


def schemas(provider: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, schema) for every schema the contract holds, for checking them as schemas."""
    found = [("request", request_schema(provider)), ("response", response_schema(provider))]
    found += [
        (f"errors.{s}", body)
        for s in error_statuses(provider)
        if (body := error(provider, s).get("body"))
    ]
    for call in _document(provider).get("other_endpoints", {}):
        found.append((call, other_response_schema(provider, call)))
    return found


def validate(schema: dict[str, Any], instance: Any) -> None:
    """Raise jsonschema.ValidationError (with the failing path) if `instance` is invalid."""
    jsonschema.Draft202012Validator(schema).validate(instance)


def check_schema(schema: dict[str, Any]) -> None:
    """Raise jsonschema.SchemaError if `schema` is not a valid Draft 2020-12 schema."""
    jsonschema.Draft202012Validator.check_schema(schema)


def strategy(schema: Any) -> st.SearchStrategy[Any]:
    """Values of a resolved schema, for the keywords the rerank contracts use.

    hypothesis-jsonschema (0.23.1, the newest) cannot generate objects with the installed
    Hypothesis (its object strategy calls ``many.more()``, which Hypothesis 6.1xx removed),
    so this small generator stands in; every value is re-validated against the contract by
    the tests, so a generator mistake fails loudly instead of passing silently.
    """
    if not isinstance(schema, dict) or not {k for k in schema if not k.startswith("$")}:
        return st.one_of(st.none(), st.booleans(), st.integers(-9, 9), st.text(max_size=5))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([strategy(s) for s in schema[key]])
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
