"""YAML read as nodes, so every value keeps the line it was written on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvpreflight._internal.fields import BoundedLoader, bound_expansion
from kvpreflight._internal.review.commandline import tokenize
from kvpreflight._internal.review.interface import ReviewError, Token


def load_documents(path: Path, text: str) -> list[Node]:
    """Every YAML document of a file as nodes; an alias bomb or a value nested past MAX_DEPTH is
    refused, not walked."""
    try:
        documents = [d for d in yaml.compose_all(text, Loader=BoundedLoader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ReviewError(f"{where}: not valid YAML ({problem}); fix the file") from None
    bound_expansion(documents, str(path), ReviewError)
    _resolve_merges(documents, path)
    return documents


def _resolve_merges(documents: list[Node], path: Path) -> None:
    """Each mapping's merge keys (`<<: *anchor`, the compose and Kubernetes idiom) resolved in
    place, as a YAML loader resolves them: the merged keys first, the mapping's own after them
    (`get` takes the last). Each node once: an anchor used twice is the same node."""
    flatten = yaml.SafeLoader("").flatten_mapping
    seen: set[int] = set()
    stack: list[Node] = list(documents)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            try:
                flatten(node)
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f"{path}:{mark.line + 1}" if mark else str(path)
                raise ReviewError(f"{where}: {getattr(exc, 'problem', None) or exc}; fix the merge key") from None
            stack.extend(n for pair in node.value for n in pair)
        elif isinstance(node, SequenceNode):
            stack.extend(node.value)


def line(node: Node) -> int:
    return node.start_mark.line + 1


def get(node: Node | None, key: str) -> Node | None:
    if isinstance(node, MappingNode):
        for k, v in reversed(node.value):  # the last of a key wins, as in a loaded mapping (merged keys come first)
            if isinstance(k, ScalarNode) and k.value == key:
                return v
    return None


def scalar(node: Node | None) -> str | None:
    return node.value if isinstance(node, ScalarNode) else None


def items(node: Node | None) -> list[Node]:
    return list(node.value) if isinstance(node, SequenceNode) else []


def command_tokens(node: Node | None) -> list[Token]:
    """A command given as a list (exec form: one word per item) or as one string (shell form)."""
    if isinstance(node, SequenceNode):
        return [Token(str(n.value), line(n)) for n in node.value if isinstance(n, ScalarNode)]
    if isinstance(node, ScalarNode) and node.value:
        return [t for cmd in tokenize(node.value, scalar_first_line(node)) for t in cmd]
    return []


def scalar_first_line(node: ScalarNode) -> int:
    """Line of a scalar's first content line: a block scalar (| or >) starts below its indicator."""
    return line(node) + 1 if node.style in ("|", ">") else line(node)


def span(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.end_mark.line + 1


def env_literals(container: Node) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in items(get(container, "env")):
        name, value = scalar(get(e, "name")), scalar(get(e, "value"))
        if name and value is not None:
            out[name] = value
    env = get(container, "environment")  # compose: mapping or list of NAME=value
    if isinstance(env, MappingNode):
        for k, v in env.value:
            if isinstance(k, ScalarNode) and isinstance(v, ScalarNode):
                out[k.value] = v.value
    for e in items(env):
        if isinstance(e, ScalarNode) and "=" in e.value:
            k, _, v = e.value.partition("=")
            out[k] = v
    return out


def image_of(container: Node) -> dict[str, Any]:
    """The `image` of a container or compose service and its line (CommandSite's image fields)."""
    node = get(container, "image")
    value = scalar(node)
    return {"image": value, "image_line": line(node)} if node is not None and value else {}
