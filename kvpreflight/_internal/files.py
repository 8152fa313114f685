"""The files kvpreflight reads and writes, in one place.

Reading: every path a user names (keys, secrets, logs, specs, inventories, records, model
configs, review inputs) is read here, bounded: `read_bytes(path, kind)` refuses what is not a
regular file (a pipe, a device, a folder, a symlink loop; no option takes a pipe or `-`) and
anything larger than the kind's cap, in one line naming the file, the kind and the cap;
`read_tail` reads a log's newest end. Nothing is opened before its type is known, and every open
is non-blocking, so no read waits on a writer that never comes.

Writing: a file a reader must never see half of (reports, records) goes through `write_atomic`.
"""

from __future__ import annotations

import enum
import errno
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from kvpreflight.errors import ConfigError, KvpreflightError

PUBLIC_MODE = 0o644  # reports and records are not secrets; a key file is written elsewhere (0600)
KiB, MiB = 1 << 10, 1 << 20


class FileKind(enum.Enum):
    """What a user's file is: how it is named in errors and how much of it is read."""

    SECRET = ("secret file", 16 * KiB)
    PRIVATE_KEY = ("private key", 64 * KiB)
    PUBLIC_KEY = ("public key", 64 * KiB)
    CERTIFICATE = ("certificate file", 1 * MiB)  # a PEM chain or CA bundle
    BOOT_SPEC = ("boot spec", 1 * MiB)
    INVENTORY = ("fleet inventory", 4 * MiB)
    RECORD = ("record", 16 * MiB)
    MODEL_CONFIG = ("model config", 4 * MiB)
    REVIEW_INPUT = ("review input", 16 * MiB)
    ADVISORY = ("advisory file", 1 * MiB)
    SUBJECT = ("subject file", 4 << 30)  # hashed in pieces, never held whole
    WORKER_OUTPUT = ("worker output", 16 * MiB)
    LOG = ("log", 16 * MiB)  # a log's newest end, like the live log watch reads it
    SYSTEM = ("system file", 64 * KiB)  # /proc files kvpreflight reads about itself
    SOCKET_TABLE = ("socket table", 64 * MiB)  # /proc/net/tcp and tcp6: a row per connection of the host

    def __init__(self, label: str, cap: int) -> None:
        self.label = label
        self.cap = cap


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:,.1f}".removesuffix(".0") + f" {unit}"
    return f"{n:,} bytes"


def _refuse(path: str | os.PathLike[str], kind: FileKind, problem: str, error: type[KvpreflightError]) -> KvpreflightError:
    return error(f"{kind.label} {path}: {problem}; kvpreflight reads a {kind.label} of at most {_size(kind.cap)} "
                 "from a regular file")


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_file(path: str | os.PathLike[str], kind: FileKind, error: type[KvpreflightError] = ConfigError, *,
               whole: bool = True) -> os.stat_result:
    """`path`'s status when it is a file kvpreflight may read (`whole`: all of it) as `kind`;
    else the one-line error."""
    try:
        info = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, kind, "a loop of symbolic links", error) from None
        if exc.errno == errno.ENOENT:
            raise _refuse(path, kind, "does not exist", error) from None
        raise _refuse(path, kind, f"cannot be read ({(exc.strerror or 'unreadable').lower()})", error) from None
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, kind, f"is {_what(info.st_mode)}, not a regular file", error)
    if whole and info.st_size > kind.cap:
        raise _refuse(path, kind, f"is {_size(info.st_size)}, over the cap", error)
    return info


def read_bytes(path: str | os.PathLike[str], kind: FileKind, error: type[KvpreflightError] = ConfigError, *,
               missing: str | None = None) -> bytes:
    """The bytes of the user's file `path`, at most `kind.cap` of them; what is not such a file
    is `error`, in one line (`missing`: the line for a file that does not exist)."""
    with _opened(path, kind, error, missing=missing) as handle:
        try:
            data = handle.read(kind.cap + 1)
        except OSError as exc:
            raise _refuse(path, kind, f"cannot be read ({(exc.strerror or 'unreadable').lower()})", error) from None
    if len(data) > kind.cap:
        raise _refuse(path, kind, "grew past the cap while it was read", error)
    return data


def sha256_of(path: str | os.PathLike[str], kind: FileKind, error: type[KvpreflightError] = ConfigError, *,
              missing: str | None = None) -> str:
    """The sha256 of the user's file `path`, read in pieces, at most `kind.cap` bytes of it."""
    digest, total = hashlib.sha256(), 0
    with _opened(path, kind, error, missing=missing) as handle:
        for block in iter(lambda: handle.read(MiB), b""):
            total += len(block)
            if total > kind.cap:
                raise _refuse(path, kind, "grew past the cap while it was read", error)
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def _opened(path: str | os.PathLike[str], kind: FileKind, error: type[KvpreflightError], *,
            whole: bool = True, missing: str | None = None) -> Iterator[BinaryIO]:
    if missing is not None and not os.path.lexists(path):
        raise error(missing)
    check_file(path, kind, error, whole=whole)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _refuse(path, kind, f"cannot be read ({(exc.strerror or 'unreadable').lower()})", error) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped for something else since it was looked at
        os.close(fd)
        raise _refuse(path, kind, f"is {_what(mode)}, not a regular file", error)
    with os.fdopen(fd, "rb") as handle:
        yield handle


def check_private(path: str | os.PathLike[str], what: str, *, allow_insecure: bool,
                  error: type[KvpreflightError] = ConfigError, name_path: bool = True) -> None:
    """A private key its group or others can read is refused, as ssh refuses one, unless
    `allow_insecure` (--allow-insecure-key). `name_path=False` where the path must not be printed
    (a boot spec's key: the caller names its field)."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077 and not allow_insecure:
        said, fix = (f"{what} {path}", f"run `chmod 600 {path}`") if name_path else (what, "run `chmod 600` on it")
        raise error(f"{said} can be read by others (mode {mode:04o}); {fix}, or pass --allow-insecure-key to use it anyway")


def read_text(path: str | os.PathLike[str], kind: FileKind, error: type[KvpreflightError] = ConfigError, *,
              missing: str | None = None) -> str:
    """`read_bytes` as UTF-8 text; text that is not UTF-8 is `error` too."""
    try:
        return read_bytes(path, kind, error, missing=missing).decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(path, kind, "is not UTF-8 text", error) from None


def read_tail(path: str | os.PathLike[str], kind: FileKind = FileKind.LOG,
              error: type[KvpreflightError] = ConfigError) -> str:
    """The newest `kind.cap` bytes of a log, whole lines only (a line the cap cut through is
    dropped), decoded leniently: a log is the engine's to write."""
    with _opened(path, kind, error, whole=False) as handle:
        start = max(0, os.fstat(handle.fileno()).st_size - kind.cap)
        handle.seek(start)
        data = handle.read(kind.cap)
    if start:
        data = data[data.find(b"\n") + 1:]
    return data.decode("utf-8", errors="replace")


def read_new(path: str | os.PathLike[str], start: int, end: int) -> bytes:
    """Bytes `start`..`end` of a log being written (the live watch); b"" when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.pread(fd, end - start, start)
    except OSError:
        return b""
    finally:
        os.close(fd)


def read_system(path: str) -> str | None:
    """A small file the system keeps about this machine or kvpreflight's own processes (/proc);
    None when it cannot be read."""
    try:
        return read_bytes(path, FileKind.SYSTEM).decode("utf-8", errors="replace")
    except ConfigError:
        return None


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


def write_new(path: str | os.PathLike[str], data: bytes, mode: int) -> None:
    """A new file `path` holding `data` with exactly `mode` (a key: 0600); an existing one is
    never overwritten (FileExistsError). Raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)  # the umask must not loosen or tighten what was promised


@contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """`path` open for writing (a log a child process writes), created or emptied."""
    with open_log(path) as handle:
        yield handle


def open_log(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` open for writing, created or emptied; the caller closes it (a copier thread)."""
    return open(path, "wb")


def append_text(path: str | os.PathLike[str], text: str) -> None:
    """`text` at the end of `path` (a CI step summary other steps write too). Raises OSError."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def check_writable(path: str | os.PathLike[str], what: str, error: type[KvpreflightError] = ConfigError) -> None:
    """Before anything runs: `path` (a report, a record) can be written where `write_atomic` puts
    it: not a folder, and its nearest existing folder takes a new file. `what` names the option."""
    target = Path(os.path.abspath(path))
    if target.is_dir():
        raise error(f"{what} {path}: is a folder; give a file name")
    existing = target.parent
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise error(f"{what} {path}: {existing} is not a folder; choose a writable path")
    try:
        if existing == target.parent:
            fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=existing)
            os.close(fd)
            os.unlink(probe)
        elif not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        raise error(f"{what} {path}: cannot be written ({(exc.strerror or str(exc)).lower()} in {existing}); "
                    "choose a writable path") from None


def check_writable_folder(folder: str | os.PathLike[str]) -> None:
    """`folder` exists (created if need be) and a file can be created in it. Raises OSError."""
    os.makedirs(folder, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".kvpreflight-write-test.", dir=folder)
    os.close(fd)
    os.unlink(probe)


def appending_text(path: str | os.PathLike[str]) -> TextIO:
    """`path` open for appending text line by line (a debug log a process keeps open)."""
    return open(path, "a", encoding="utf-8", buffering=1)
