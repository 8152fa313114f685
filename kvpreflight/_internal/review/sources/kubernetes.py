"""Kubernetes manifests (Deployment, StatefulSet, LeaderWorkerSet, Pod, Job, any multi-document
YAML): every pod template's containers, their `command` + `args`, their literal `env`, and the
pod's `nvidia.com/gpu.product` node selector or required node affinity."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvpreflight._internal.review.interface import CommandSite
from kvpreflight._internal.review.sources.yamlnodes import command_tokens, env_literals, get, image_of, items, line, scalar, span

GPU_LABEL = "nvidia.com/gpu.product"


def sites(path: Path, docs: list[Node]) -> list[CommandSite]:
    out: list[CommandSite] = []
    for doc in docs:
        kind = scalar(get(doc, "kind")) or "document"
        name = scalar(get(get(doc, "metadata"), "name")) or "?"
        for trail, pod in _pod_specs(doc, ()):
            gpu, gpu_line = _gpu_product(pod)
            for c in items(get(pod, "containers")) + items(get(pod, "initContainers")):
                tokens = command_tokens(get(c, "command")) + command_tokens(get(c, "args"))
                if not tokens:
                    continue
                where = f"{kind}/{name}" + "".join(f" {t}" for t in trail) + f" container {scalar(get(c, 'name')) or '?'}"
                out.append(CommandSite(
                    file=str(path), where=where, tokens=tuple(tokens), gpu_product=gpu, gpu_product_line=gpu_line,
                    search_lines=span(c), env=env_literals(c), **image_of(c),
                ))
    return out


def _pod_specs(node: Node, trail: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], MappingNode]]:
    """Every mapping that has a `containers` list, with the keys that lead to it (leaderTemplate...)."""
    if isinstance(node, MappingNode):
        if isinstance(get(node, "containers"), SequenceNode):
            yield trail, node
            return
        for k, v in node.value:
            key = k.value if k.value in ("leaderTemplate", "workerTemplate") else None
            yield from _pod_specs(v, trail + ((key,) if key else ()))
    elif isinstance(node, SequenceNode):
        for v in node.value:
            yield from _pod_specs(v, trail)


def _gpu_product(pod: Node) -> tuple[str | None, int | None]:
    sel = get(get(pod, "nodeSelector"), GPU_LABEL)
    if isinstance(sel, ScalarNode) and sel.value:
        return sel.value, line(sel)
    terms = get(get(get(get(pod, "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution"), "nodeSelectorTerms")
    for term in items(terms):
        for expr in items(get(term, "matchExpressions")):
            if scalar(get(expr, "key")) == GPU_LABEL and scalar(get(expr, "operator")) == "In":
                values = items(get(expr, "values"))
                if values and scalar(values[0]):
                    return scalar(values[0]), line(values[0])
    return None, None
