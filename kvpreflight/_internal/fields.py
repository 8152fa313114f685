"""The one small parser that maps loaded YAML onto typed values, for boot specs and fleet inventories.

Every problem is one line naming the file and the field (``spec.yaml: engines[1].port: expected an
integer or "auto", got 'x'``), raised as the front end's own ConfigError subclass. Unknown keys
and unknown check ids are errors: a typo must not silently drop a setting or a waiver.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from kvpreflight._internal.check_ids import CHECK_IDS
from kvpreflight.errors import ConfigError, KvpreflightError
from kvpreflight.model import Waiver
from kvpreflight.targets import waiver_expiry

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Nodes a YAML file may expand to, aliases counted each time they are used. Real specs,
# inventories and manifests have hundreds to thousands; an alias bomb ("billion laughs") has
# billions, which would hang whoever walks it.
MAX_EXPANDED_NODES = 200_000
# Lists and mappings nested deeper than this are refused: PyYAML composes them recursively (a few
# hundred levels exhaust Python's stack) and its scanner slows down with every open level. Real
# specs, inventories and manifests nest fifteen or twenty levels.
MAX_DEPTH = 100


class BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses values nested past MAX_DEPTH with a YAMLError (one line, its place)."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"values nested more than {MAX_DEPTH} levels deep; write them flatter",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def compose_documents(text: str, source: str, error_type: Callable[[str], ConfigError] = ConfigError) -> list[Node]:
    """Every document of `text` as YAML nodes (with their lines), refused if it is not YAML or if
    aliases would expand it past MAX_EXPANDED_NODES, or if it nests past MAX_DEPTH."""
    try:
        documents = [d for d in yaml.compose_all(text, Loader=BoundedLoader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error_type(f"{source}: not valid YAML{where}: {problem}") from None
    bound_expansion(documents, source, error_type)
    return documents


def bound_expansion(documents: Sequence[Node], source: str, error_type: Callable[[str], ConfigError] = ConfigError) -> None:
    """Refuse documents whose aliases expand past MAX_EXPANDED_NODES, stopping as soon as they do."""
    budget = MAX_EXPANDED_NODES
    stack: list[Node] = list(documents)
    while stack:
        node = stack.pop()
        budget -= 1
        if budget < 0:
            raise error_type(f"{source}: YAML aliases expand past {MAX_EXPANDED_NODES:,} values "
                             "(an alias bomb?); write the values out")
        if isinstance(node, SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, MappingNode):
            for key, value in node.value:
                stack.extend((key, value))


def load_yaml(text: str | bytes, source: str, error_type: Callable[[str], ConfigError] = ConfigError) -> Any:
    """One YAML document as Python data (None when empty), bounded like compose_documents."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise error_type(f"{source}: not UTF-8 text; give a YAML file") from None
    documents = compose_documents(text, source, error_type)
    if len(documents) > 1:
        raise error_type(f"{source}: holds {len(documents)} YAML documents; give one")
    if not documents:
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(documents[0])
    except yaml.YAMLError as exc:
        raise error_type(f"{source}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None


def describe(value: Any) -> str:
    """A short description of a YAML value for an error message."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        # Quote a short value (a typo is easiest to see); never echo a whole file into a message.
        return repr(value) if len(value) <= 60 and "\n" not in value else f"a text of {len(value):,} characters"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class FieldParser:
    """Reads fields of one file; `error_type` is the front end's ConfigError subclass."""

    def __init__(self, source: str, base_dir: str, error_type: Callable[[str], ConfigError] = ConfigError) -> None:
        self.source = source
        self.base_dir = base_dir
        self.error_type = error_type

    def error(self, where: str | None, problem: str) -> ConfigError:
        message = f"{self.source}: {where}: {problem}" if where else f"{self.source}: {problem}"
        return self.error_type(" ".join(message.split()))  # one line, whatever a key or value held

    def adopt(self, where: str, exc: KvpreflightError) -> ConfigError:
        """A library parser's error (which names no field), placed at `where`."""
        return self.error(where, str(exc))

    def mapping(self, value: Any, allowed: Sequence[str], where: str | None, what: str) -> dict[str, Any]:
        """A mapping whose keys are all in `allowed`."""
        if not isinstance(value, dict):
            raise self.error(where, f"expected {what}, got {describe(value)}")
        self.unknown_keys(value, allowed, where)
        return value

    def unknown_keys(self, data: dict[Any, Any], allowed: Sequence[str], where: str | None) -> None:
        for key in data:
            if key not in allowed:
                name = key if isinstance(key, str) and re.fullmatch(r"[\w.-]{1,60}", key) else describe(key)
                at = f"{where}.{name}" if where else name
                raise self.error(at, f"unknown key (expected one of: {', '.join(allowed)})")

    def positive_int(self, value: Any, where: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(where, f"expected a positive integer, got {describe(value)}")
        return value

    def positive_number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self.error(where, f"expected a positive number, got {describe(value)}")
        return float(value)

    def boolean(self, value: Any, where: str, default: bool = False) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(where, f"expected true or false, got {describe(value)}")
        return value

    def strings(self, value: Any, where: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.error(where, f"expected a list of strings, got {describe(value)}")
        return tuple(value)

    def optional_str(self, value: Any, where: str) -> str | None:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise self.error(where, f"expected a non-empty string, got {describe(value)}")
        return value

    def path(self, value: Any, where: str) -> str | None:
        """A file path, relative to the file being parsed; not opened here (it is read where the
        check runs, which may be another node)."""
        text = self.optional_str(value, where)
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(text))) if text else None

    def env_name(self, value: Any, where: str) -> str | None:
        """The NAME of an environment variable (secrets are read from it where the check runs)."""
        name = self.optional_str(value, where)
        if name is not None and not ENV_NAME.match(name):
            raise self.error(where, f"the NAME of the environment variable holding the key, got {describe(name)}")
        return name

    def waivers(self, raw: Any, where: str) -> tuple[Waiver, ...]:
        """`[{id, reason, until?}]`: each id a known check, each with a reason, `until` its last day."""
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise self.error(where, f"expected a list of {{id, reason}}, got {describe(raw)}")
        out = []
        for i, item in enumerate(raw):
            at = f"{where}[{i}]"
            self.mapping(item, ("id", "reason", "until"), at, "a mapping with id, reason and optionally until")
            if item.get("id") not in CHECK_IDS:
                raise self.error(f"{at}.id", f"expected one of {', '.join(CHECK_IDS)}, got {describe(item.get('id'))}")
            reason = item.get("reason")
            if not isinstance(reason, str) or not reason.strip():
                raise self.error(f"{at}.reason", "a skipped check needs a reason (it goes into the record)")
            until = item.get("until")
            if until is not None:
                until = str(until)  # YAML reads 2026-12-31 as a date
                try:
                    until = waiver_expiry(until)
                except ConfigError:
                    raise self.error(f"{at}.until", f"expected the waiver's last day as YYYY-MM-DD, got {describe(until)}") from None
            out.append(Waiver(item["id"], reason.strip(), until))
        return tuple(out)

    def subjects(self, value: Any, where: str, parse: Callable[[str], object]) -> tuple[str, ...]:
        """`NAME=sha256:HEX` strings, each checked by `parse` (kvpreflight.record.parse_subject)."""
        items = self.strings(value, where)
        for i, text in enumerate(items):
            try:
                parse(text)
            except KvpreflightError as exc:
                raise self.adopt(f"{where}[{i}]", exc) from None
        return items
