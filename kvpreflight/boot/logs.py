"""Where a booted deployment's logs go, one rule for `check --boot` and `demo`: the folder the user
named (`--log-dir`, left as it is); else a new temporary folder, removed once the run is over
unless `keep` (then its path is said)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def log_folder(given: Path | None, *, keep: bool, prefix: str, say: Callable[[str], None],
               kept_in: Path | None = None) -> Iterator[Path]:
    """The logs' folder for the `with` block: `given` if any; else `kept_in` with `keep` (the demo's
    DIR/logs), else a new temporary folder named `prefix`..., removed when the block ends (after the
    report and the record, which names the logs by digest, are written) unless `keep`, whatever
    happened inside it."""
    if given is not None:
        yield given
        return
    folder = kept_in if keep and kept_in is not None else Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        if keep:
            say(f"engine logs kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
