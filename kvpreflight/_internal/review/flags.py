"""Read a launch's arguments the way argparse does: ``--flag value``, ``--flag=value``, the
last occurrence wins, and a flag's line is kept for annotations."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import overload

from kvpreflight._internal.review.interface import Flag, Launch, ReviewError, Token


@dataclass(frozen=True)
class ParsedArgs:
    flags: Mapping[str, Flag]  # canonical name -> the last occurrence
    positional: tuple[Token, ...]

    def value(self, name: str) -> str | None:
        f = self.flags.get(name)
        return f.value if f else None

    def line(self, name: str) -> int | None:
        f = self.flags.get(name)
        return f.line if f else None

    def has(self, name: str) -> bool:
        return name in self.flags

    @overload
    def number(self, launch: Launch, name: str) -> int | None: ...
    @overload
    def number(self, launch: Launch, name: str, kind: Callable[[str], float]) -> float | None: ...

    def number(self, launch: Launch, name: str, kind: Callable[[str], int | float] = int) -> int | float | None:
        """The flag's value read by `kind` (int unless given); None when the flag is absent."""
        f = self.flags.get(name)
        if f is None:
            return None
        try:
            value = kind(f.value or "")
        except ValueError:
            value = math.nan
        if not math.isfinite(value):  # "nan" and "inf" read as floats; no engine setting is either
            where = f"{launch.site.file}:{f.line}"
            hint = "an integer" if kind is int else "a number"
            raise ReviewError(
                f"{where}: {f.name} {f.value!r:.60} is not {hint}; write the literal value "
                "(review does not expand variables it cannot see in the file)"
            )
        return value


def parse_args(
    launch: Launch,
    aliases: Mapping[str, str],
    switches: frozenset[str],
    normalise: Callable[[str], str] = lambda s: s,
) -> ParsedArgs:
    """aliases: spelling -> canonical name; switches: canonical names that take no value.

    Flags we do not know take the next word as their value when it is not itself a flag, which
    is what they do in SGLang's, vLLM's and llama.cpp's parsers for all value flags.
    """
    flags: dict[str, Flag] = {}
    positional: list[Token] = []
    args = launch.args
    i = 0
    while i < len(args):
        tok = args[i]
        text = tok.text
        if not text.startswith("-") or text == "-" or _is_number(text):
            positional.append(tok)
            i += 1
            continue
        name, eq, inline = text.partition("=")
        name = normalise(name)
        canonical = aliases.get(name)
        if canonical in switches:
            flags[canonical] = Flag(name, inline if eq else None, tok.line)
            i += 1
            continue
        if eq:
            value: str | None = inline
            i += 1
        elif i + 1 < len(args) and (not args[i + 1].text.startswith("-") or _is_number(args[i + 1].text)):
            value = args[i + 1].text
            i += 2
        else:
            value = None
            i += 1
        if canonical is not None:
            if value is None:
                raise ReviewError(f"{launch.site.file}:{tok.line}: {name} needs a value; write e.g. {name} 8")
            flags[canonical] = Flag(name, value, tok.line)
    return ParsedArgs(flags, tuple(positional))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
