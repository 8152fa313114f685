"""kvpreflight's synthetic markers: the only response text a report may ever quote.

A marker is `KVPF-<KIND>-<24 hex>`: high-entropy, fresh per run, never real data. A response is
scanned for whole markers and for fragments (a marker cut by a page boundary still counts).
"""

from __future__ import annotations

import hashlib
import re
import secrets

from kvpreflight._internal.probes.results import Echo

MARKER = re.compile(r"KVPF-[A-Z]{2,12}-[0-9a-f]{24}")
FRAGMENT_MIN = 12  # hex characters of a marker's tail that count as a fragment


def new_marker(kind: str) -> str:
    return f"KVPF-{kind.upper()}-{secrets.token_hex(12)}"


def markers_in(text: str) -> set[str]:
    return set(MARKER.findall(text))


def contains_marker(text: str, marker: str) -> bool:
    """The marker in text, whole or as a fragment of its random tail."""
    return marker in text or _fragment_in(text, marker)


def foreign_markers(text: str, own: set[str] | frozenset[str], known: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Markers (or fragments of `known` markers) in text that do not belong to `own`.

    Only marker strings are returned, so evidence never quotes anything else from a response.
    """
    found = {m for m in markers_in(text) if m not in own}
    for marker in known - set(own):
        if marker not in found and _fragment_in(text, marker):
            found.add(marker + " (fragment)")
    return sorted(found)


def _fragment_in(text: str, marker: str) -> bool:
    tail = marker.rsplit("-", 1)[-1]
    return any(tail[start:start + FRAGMENT_MIN] in text for start in range(0, len(tail) - FRAGMENT_MIN + 1, 4))


def echo_of(text: str, own: set[str] | frozenset[str], *, sent_tokens: int, head: str | None = None) -> Echo:
    """What an answer repeated of its own prompt: one of its `own` markers (the prompt repeats
    them back to back), and its unique `head` where the prompt began with one. An answer too short
    to hold a whole marker wherever an echo of the prompt starts says nothing (`own` None)."""
    seen = any(contains_marker(text, m) for m in own)
    judged = seen or len(text) >= 2 * max((len(m) for m in own), default=0) + 1
    return Echo(own=seen if judged and own else None,
                head=None if head is None else contains_marker(text, head),
                sent_tokens=sent_tokens, chars=len(text), sha256=hashlib.sha256(text.encode()).hexdigest())
