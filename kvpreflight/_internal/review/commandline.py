"""Shell words with line numbers, and the engine launch commands among them.

A small POSIX-shell tokenizer (quotes, backslash escapes, line continuations, comments and the
separators ``; && || | &`` and newline), because review must say on which line of a file each
flag stands. ``sh -c SCRIPT`` (and bash, dash) is opened and read as a script of its own.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping

from kvpreflight._internal.engine_kinds import ENGINES
from kvpreflight._internal.files import FileKind, read_text
from kvpreflight._internal.review.interface import CommandSite, Launch, ReviewError, Token
from kvpreflight.errors import ConfigError

_SEPARATORS = (";", "&&", "||", "|", "&", "\n")
_SHELLS = {"sh", "bash", "dash", "zsh", "ash"}
_PYTHON = re.compile(r"^(python(\d+(\.\d+)?)?|\{python\})$")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def tokenize(text: str, first_line: int = 1) -> list[list[Token]]:
    """Split shell text into commands (lists of words), each word with its starting line."""
    commands: list[list[Token]] = []
    current: list[Token] = []
    word: list[str] | None = None
    word_line = first_line
    line = first_line
    i, n = 0, len(text)

    def end_word() -> None:
        nonlocal word
        if word is not None:
            current.append(Token("".join(word), word_line))
            word = None

    def end_command() -> None:
        nonlocal current
        end_word()
        if current:
            commands.append(current)
        current = []

    def start_word() -> list[str]:
        nonlocal word, word_line
        if word is None:
            word, word_line = [], line
        return word

    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] == "\n":  # line continuation
            i += 2
            line += 1
            continue
        if ch == "\\" and i + 1 < n:
            start_word().append(text[i + 1])
            i += 2
            continue
        if ch == "'":
            w = start_word()
            end = text.find("'", i + 1)
            if end < 0:
                raise ReviewError(f"line {line}: unclosed single quote; close it or escape it")
            w.append(text[i + 1 : end])
            line += text.count("\n", i, end)
            i = end + 1
            continue
        if ch == '"':
            w = start_word()
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
                    if text[i + 1] == "\n":
                        line += 1
                    else:
                        w.append(text[i + 1])
                    i += 2
                    continue
                if text[i] == "\n":
                    line += 1
                w.append(text[i])
                i += 1
            if i >= n:
                raise ReviewError(f"line {line}: unclosed double quote; close it or escape it")
            i += 1
            continue
        if ch == "#" and word is None:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if ch in " \t\r":
            end_word()
            i += 1
            continue
        if ch == "\n":
            end_command()
            line += 1
            i += 1
            continue
        two = text[i : i + 2]
        if two in ("&&", "||"):
            end_command()
            i += 2
            continue
        if ch in ";|&":
            end_command()
            i += 1
            continue
        start_word().append(ch)
        i += 1
    end_command()
    return commands


def substitute(token: Token, env: Mapping[str, str]) -> Token:
    """Fill in $VAR, ${VAR} and Kubernetes' $(VAR) from literal values the file itself sets."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return env.get(name, m.group(0))

    return Token(_VAR.sub(repl, token.text), token.line) if "$" in token.text else token


def find_launches(site: CommandSite, env: Mapping[str, str] | None = None) -> list[Launch]:
    """Every SGLang, vLLM and llama.cpp launch in the site's words (sh -c scripts included)."""
    return list(_launches(site, [list(site.tokens)], site.env if env is None else env))


_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def _launches(site: CommandSite, commands: Iterable[list[Token]], env: Mapping[str, str]) -> Iterator[Launch]:
    env = dict(env)
    for words in commands:
        words = [substitute(t, env) for t in words]
        assigns = words[1:] if words and words[0].text == "export" else words
        if assigns and all(_ASSIGNMENT.match(w.text) for w in assigns):
            env.update((m.group(1), m.group(2)) for w in assigns if (m := _ASSIGNMENT.match(w.text)))
            continue
        found = False
        for i, tok in enumerate(words):
            base = posixpath.basename(tok.text)
            nxt = words[i + 1].text if i + 1 < len(words) else None
            if base in _SHELLS and nxt == "-c" and i + 2 < len(words):
                script = words[i + 2]
                yield from _launches(site, _script(site, script), env)
                found = True
                break
            engine, skip = _launch_at(words, i)
            if engine:
                rest = tuple(words[i + skip :])
                prefix = {m.group(1): m.group(2) for w in words[:i] if (m := _ASSIGNMENT.match(w.text))}
                yield Launch(engine=engine, site=site, line=tok.line, args=rest, env={**env, **prefix})
                found = True
                break
        if not found and len(words) == 1 and "\n" in words[0].text:
            # a whole script in one word (a YAML block scalar given as `args: [|...]`)
            yield from _launches(site, _script(site, words[0]), env)


def _script(site: CommandSite, word: Token) -> list[list[Token]]:
    """A script inside one word. When the word came from a folded YAML scalar its inner line
    breaks are gone: find each flag's real line in the file instead."""
    commands = tokenize(word.text, word.line)
    if site.search_lines is None:
        return commands
    lo, hi = site.search_lines
    lines = _file_lines(site.file)
    cursor = max(word.line - 1, lo - 1)
    out: list[list[Token]] = []
    for cmd in commands:
        fixed: list[Token] = []
        for tok in cmd:
            needle = tok.text.split("=", 1)[0] if tok.text.startswith("-") else tok.text
            for j in range(cursor, min(hi, len(lines))):
                if needle and needle in lines[j]:
                    cursor = j
                    break
            fixed.append(Token(tok.text, cursor + 1))
        out.append(fixed)
    return out


@functools.lru_cache(maxsize=64)
def _file_lines(path: str) -> tuple[str, ...]:
    try:
        return tuple(read_text(path, FileKind.REVIEW_INPUT).splitlines())
    except ConfigError:
        return ()


def _launch_at(words: list[Token], i: int) -> tuple[str | None, int]:
    """The engine whose launch starts at words[i] and how many words the launch itself takes: each
    registered engine's launch forms (kvpreflight._internal.engine_kinds), `python -m MODULE` ones after an
    interpreter, the others by the first word's base name."""
    base = posixpath.basename(words[i].text)
    texts = [base, *(w.text for w in words[i + 1:])]
    module = _PYTHON.match(base) is not None and texts[1:2] == ["-m"]
    for registration in ENGINES.values():
        for form in registration.launch_forms:
            if module and form[0] == "-m" and texts[1:1 + len(form)] == list(form):
                return registration.kind, 1 + len(form)
            if not module and form[0] != "-m" and texts[:len(form)] == list(form):
                return registration.kind, len(form)
    return None, 0
