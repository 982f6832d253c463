"""Hypothesis strategies for values that fit a JSON Schema: the subset msgspec emits.

``hypothesis-jsonschema`` would do this, but its object generation relies on Hypothesis
internals that current Hypothesis releases no longer have (``'many' object has no attribute
'more'``), so the API's fuzz carries this small converter instead. It covers what
``msgspec.json.schema_components`` writes for the request bodies: ``type`` (one or a list),
``enum``, ``const``, ``anyOf``/``oneOf``, object ``properties``/``required``/
``additionalProperties``, array ``items``/``minItems``/``maxItems``, string
``minLength``/``maxLength``, numeric ``minimum``/``maximum`` (and the exclusive ones).
``$ref`` s must be inlined first (:func:`inline`).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
"""Arbitrary text (no lone surrogates)."""
ITEMS_DRAWN_MAX = 5
"""Most items drawn for an array, whatever ``maxItems`` allows (batches allow 10,000)."""

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)


def inline(node: Any, components: dict[str, Any]) -> Any:
    """``node`` with every ``#/components/schemas/...`` reference replaced by its schema
    (sibling keywords such as ``default`` are kept)."""
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            siblings = {key: value for key, value in node.items() if key != "$ref"}
            return {**inline(components[name], components), **siblings}
        return {key: inline(value, components) for key, value in node.items()}
    if isinstance(node, list):
        return [inline(value, components) for value in node]
    return node


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that validate against ``schema``."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            return st.one_of([from_schema(option) for option in schema[keyword]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": one}) for one in kind])
    if kind is None:
        return ANY_JSON
    return _TYPED[kind](schema)


def _object(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    fixed = st.fixed_dictionaries(
        {name: from_schema(sub) for name, sub in properties.items() if name in required},
        optional={
            name: from_schema(sub) for name, sub in properties.items() if name not in required
        },
    )
    if schema.get("additionalProperties", True) is False or properties:
        return fixed
    return st.dictionaries(TEXT, ANY_JSON, max_size=4)


def _array(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    low = schema.get("minItems", 0)
    high = min(schema.get("maxItems", ITEMS_DRAWN_MAX), max(low, ITEMS_DRAWN_MAX))
    return st.lists(from_schema(schema.get("items", {})), min_size=low, max_size=high)


def _string(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    low = schema.get("minLength", 0)
    high = schema.get("maxLength")
    alphabet = st.characters(blacklist_categories=("Cs",))
    if high is None:
        return st.text(alphabet, min_size=low, max_size=max(low, 30))
    return st.one_of(
        st.text(alphabet, min_size=low, max_size=min(high, max(low, 30))),
        st.just("x" * high),
    )


def _integer(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    low = schema.get("minimum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + 1
    high = schema.get("maximum")
    if "exclusiveMaximum" in schema:
        high = schema["exclusiveMaximum"] - 1
    return st.integers(min_value=low, max_value=high)


def _number(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        _integer(schema),
        st.floats(
            min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
            max_value=schema.get("maximum", schema.get("exclusiveMaximum")),
            exclude_min="exclusiveMinimum" in schema,
            exclude_max="exclusiveMaximum" in schema,
            allow_nan=False,
            allow_infinity=False,
        ),
    )


_TYPED = {
    "object": _object,
    "array": _array,
    "string": _string,
    "integer": _integer,
    "number": _number,
    "boolean": lambda schema: st.booleans(),
    "null": lambda schema: st.none(),
}
