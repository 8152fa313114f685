"""docker-compose files: each service's `entrypoint` + `command` (list or string) and its
literal `environment`."""

from __future__ import annotations

from pathlib import Path

from yaml.nodes import MappingNode, Node

from kvpreflight._internal.review.interface import CommandSite
from kvpreflight._internal.review.sources.yamlnodes import command_tokens, env_literals, get, image_of, span


def sites(path: Path, docs: list[Node]) -> list[CommandSite]:
    out: list[CommandSite] = []
    for doc in docs:
        services = get(doc, "services")
        if not isinstance(services, MappingNode):
            continue
        for key, svc in services.value:
            tokens = command_tokens(get(svc, "entrypoint")) + command_tokens(get(svc, "command"))
            if tokens:
                out.append(CommandSite(
                    file=str(path), where=f"service {key.value}", tokens=tuple(tokens),
                    search_lines=span(svc), env=env_literals(svc), **image_of(svc),
                ))
    return out
