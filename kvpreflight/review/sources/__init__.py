"""One module per input kind. Each has `sites(path, text) -> list[CommandSite]`; `read_sites`
picks the kind from the file's name and content."""

from __future__ import annotations

from pathlib import Path

from kvpreflight.review.interface import CommandSite, ReviewError


def read_sites(path: Path) -> list[CommandSite]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReviewError(f"{path}: no such file; pass the deployment files to review") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReviewError(f"{path}: cannot read it ({exc}); pass a text deployment file") from None
    if path.suffix in (".yaml", ".yml", ".json"):
        from kvpreflight.review.sources import bootspec, compose, kubernetes
        from kvpreflight.review.sources.yamlnodes import get, load_documents

        docs = load_documents(path, text)
        if any(get(d, "engines") is not None for d in docs):
            return bootspec.sites(path, docs)
        if any(get(d, "services") is not None for d in docs):
            return compose.sites(path, docs)
        return kubernetes.sites(path, docs)
    from kvpreflight.review.sources import shell

    return shell.sites(path, text)
