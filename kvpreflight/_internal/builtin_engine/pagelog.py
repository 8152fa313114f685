"""Debug log of page ownership (--page-log FILE): one JSON line per event, so a test can prove a
scenario really happened (pages given, freed, transfer writes landing, deferred releases)."""

from __future__ import annotations

import json
import threading
import time

from kvpreflight._internal.files import appending_text, read_tail


class PageLog:
    def __init__(self, path: str | None) -> None:
        self._file = appending_text(path) if path else None
        self._lock = threading.Lock()

    def event(self, event: str, rid: str | None, pages: list[int] | None = None, **fields: object) -> None:
        if self._file is None:
            return
        record = {"ts": time.time(), "event": event, "rid": rid, "pages": list(pages or []), **fields}
        with self._lock:
            self._file.write(json.dumps(record) + "\n")


def read_page_log(path: str) -> list[dict]:
    return [json.loads(line) for line in read_tail(path).splitlines() if line.strip()]
