"""Reading the files a user names, with one clear line for each way that can fail."""

from __future__ import annotations

import os
from pathlib import Path

from kvpreflight.record.errors import RecordError


def read_input(path: str | os.PathLike[str], what: str, hint: str) -> bytes:
    """The bytes of ``path``; a missing or unreadable file is bad input (exit 2)."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise RecordError(f"{what} {path} does not exist; {hint}") from None
    except IsADirectoryError:
        raise RecordError(f"{what} {path} is a directory; pass the file itself") from None
    except OSError as exc:
        raise RecordError(f"cannot read {what} {path}: {exc.strerror}") from None
