"""Strategies shared by the property-based tests (tests/unit/test_properties_*.py): any value a YAML or
JSON file can hold, and a valid document with one value anywhere replaced by anything."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

# YAML-shaped values: what safe_load can return.
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a nested value (dict keys, list indices)."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += paths(item, (*prefix, i))
    return out


def replaced(base: Any, path: tuple[Any, ...], new: Any) -> Any:
    data = copy.deepcopy(base)
    target = data
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return data


def mutations(base: Any, *fillers: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The valid base with one value anywhere replaced by anything (so every field is reached):
    any YAML value, or one of `fillers` (values shaped like the real ones, to get deeper)."""
    return st.tuples(st.sampled_from(paths(base)), st.one_of(yaml_values, *fillers)).map(lambda pv: replaced(base, *pv))


