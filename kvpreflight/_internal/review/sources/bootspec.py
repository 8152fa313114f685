"""kvpreflight boot specs (`engines: [{name, role, command, ...}]`, top-level `context_length`):
the same file `kvpreflight check --boot` starts, read here without starting anything."""

from __future__ import annotations

from pathlib import Path

from yaml.nodes import Node, ScalarNode

from kvpreflight._internal.review.interface import CommandSite, ReviewError
from kvpreflight._internal.review.sources.yamlnodes import command_tokens, env_literals, get, items, line, scalar, span


def sites(path: Path, docs: list[Node]) -> list[CommandSite]:
    out: list[CommandSite] = []
    for doc in docs:
        ctx_node = get(doc, "context_length")
        context = None
        if isinstance(ctx_node, ScalarNode):
            try:
                context = int(ctx_node.value or "")
            except ValueError:
                context = 0
            if context <= 0:
                raise ReviewError(f"{path}:{line(ctx_node)}: context_length {ctx_node.value!r:.60} is not a positive integer")
        for i, eng in enumerate(items(get(doc, "engines"))):
            role = scalar(get(eng, "role"))
            if role == "router":
                continue
            tokens = command_tokens(get(eng, "command"))
            if tokens:
                out.append(CommandSite(
                    file=str(path), where=f"engine {scalar(get(eng, 'name')) or f'engines[{i}]'}", tokens=tuple(tokens),
                    role=role, context_length=context, search_lines=span(eng), env=env_literals(eng),
                ))
    return out
