"""One module per input kind. Each has `sites(path, text) -> list[CommandSite]`; `read_sites`
picks the kind from the file's name and content."""

from __future__ import annotations

from pathlib import Path

from kvpreflight._internal.files import FileKind, read_text
from kvpreflight._internal.review.interface import CommandSite, ReviewError


def read_sites(path: Path) -> list[CommandSite]:
    text = read_text(path, FileKind.REVIEW_INPUT, ReviewError,
                     missing=f"{path}: no such file; pass the deployment files to review")
    if path.suffix in (".yaml", ".yml", ".json"):
        from kvpreflight._internal.review.sources import bootspec, compose, kubernetes
        from kvpreflight._internal.review.sources.yamlnodes import get, load_documents

        docs = load_documents(path, text)
        if any(get(d, "engines") is not None for d in docs):
            return bootspec.sites(path, docs)
        if any(get(d, "services") is not None for d in docs):
            return compose.sites(path, docs)
        return kubernetes.sites(path, docs)
    from kvpreflight._internal.review.sources import shell

    return shell.sites(path, text)
