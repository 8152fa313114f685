"""Reading the files a user names for records, with one clear line for each way that can fail."""

from __future__ import annotations

import os

from kvpreflight._internal.files import FileKind, read_bytes
from kvpreflight.record.errors import RecordError


def read_input(path: str | os.PathLike[str], kind: FileKind, hint: str) -> bytes:
    """The bytes of ``path`` (bounded, a regular file); anything else is bad input (exit 2)."""
    return read_bytes(path, kind, RecordError, missing=f"{kind.label} {path} does not exist; {hint}")
