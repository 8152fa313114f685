"""Writing a file a reader must never see half of (reports, records): one function."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PUBLIC_MODE = 0o644  # reports and records are not secrets; a key file is written elsewhere (0600)


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, mode: int = PUBLIC_MODE) -> Path:
    """Write `data` to `path` through a temporary file beside it, fsynced, then renamed over it.

    Parent folders are created. The file gets `mode` whatever the umask. Raises OSError; the caller
    says which file it was and what to do.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
