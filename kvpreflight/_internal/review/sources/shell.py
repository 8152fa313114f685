"""Shell scripts (and any other text file): the whole file is one script; backslash line
continuations, quotes and `sh -c` are read as the shell reads them, and `VAR=value` lines
fill in `$VAR` in later commands."""

from __future__ import annotations

import re
from pathlib import Path

from kvpreflight._internal.review.commandline import tokenize
from kvpreflight._internal.review.interface import CommandSite

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def sites(path: Path, text: str) -> list[CommandSite]:
    out: list[CommandSite] = []
    env: dict[str, str] = {}
    for words in tokenize(text):
        if words and words[0].text == "export":
            words = words[1:]
        if words and all(_ASSIGN.match(w.text) for w in words):
            for w in words:
                m = _ASSIGN.match(w.text)
                assert m
                env[m.group(1)] = m.group(2)
            continue
        out.append(CommandSite(file=str(path), where="script", tokens=tuple(words), env=dict(env)))
    return out
