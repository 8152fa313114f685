"""Every file a user names is read bounded (issue 28): every option of every command that takes a
path, given a pipe nobody writes to, /dev/zero, a sparse file past its cap, a folder and a loop of
symbolic links, exits 2 at once with one line naming the file, never blocks, never reads without
end. And nothing in the package opens or reads a file outside kvpreflight/_internal/files.py."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from record_support import make_keys, write_signed
from support.cli import invoke

from kvpreflight._internal.files import FileKind, read_bytes, read_tail
from kvpreflight.record import RecordError

REPO = Path(__file__).parents[2]
PACKAGE = REPO / "kvpreflight"
ENGINE = "http://127.0.0.1:9"  # nothing listens: a read that came after a request would say so
SCRIPT = REPO / "tests/fixtures/review/qwen-tp8.sh"
MODELS = REPO / "tests/fixtures/review/models"


def _fifo(tmp: Path) -> Path:
    path = tmp / "pipe"
    os.mkfifo(path)
    return path


def _sparse(tmp: Path) -> Path:
    path = tmp / "sparse"
    with path.open("wb") as handle:
        handle.truncate(64 << 30)  # past every cap; takes no room
    return path


def _folder(tmp: Path) -> Path:
    path = tmp / "folder"
    path.mkdir()
    return path


def _loop(tmp: Path) -> Path:
    (tmp / "loop-a").symlink_to(tmp / "loop-b")
    (tmp / "loop-b").symlink_to(tmp / "loop-a")
    return tmp / "loop-a"


HOSTILE: dict[str, Callable[[Path], Path]] = {
    "a pipe nobody writes to": _fifo, "/dev/zero": lambda tmp: Path("/dev/zero"), "a sparse file past the cap": _sparse,
    "a folder": _folder, "a loop of symbolic links": _loop,
}


def _verify_args(tmp: Path) -> tuple[Path, Path, Path]:
    key, private, public = make_keys(tmp / "keys")
    record = tmp / "record.dsse.json"
    write_signed(record, key)
    return record, private, public


def _check(*extra: object) -> list[object]:
    return ["check", "--endpoint", ENGINE, "--timeout", "1", *extra]


# Each path option of each command: (its name, the argv with P where the hostile path goes).
def _options(tmp: Path) -> Iterator[tuple[str, Callable[[Path], list[object]]]]:
    record, private, public = _verify_args(tmp)
    yield "check --api-key-file", lambda p: _check("--api-key-file", p)
    yield "check --log", lambda p: _check("--log", f"{ENGINE}={p}")
    yield "check --ca-bundle", lambda p: _check("--ca-bundle", p)
    yield "check --client-cert", lambda p: _check("--client-cert", p)
    yield "check --client-key", lambda p: _check("--client-cert", private, "--client-key", p)
    yield "check --sign-key", lambda p: _check("--record", tmp / "out.dsse.json", "--sign-key", p, "--subject",
                                               "app=sha256:" + "a" * 64)
    yield "check --boot", lambda p: ["check", "--boot", p]
    yield "check --advisories (a file in it)", lambda p: _check("--advisories", _folder_with(tmp, p))
    yield "verify RECORD", lambda p: ["verify", p, "--key", public, "--any-subject"]
    yield "verify --key", lambda p: ["verify", record, "--key", p, "--any-subject"]
    yield "verify --sign-key", lambda p: ["verify", record, "--key", public, "--any-subject", "--vsa", tmp / "vsa.json",
                                          "--resource-uri", "oci://x", "--sign-key", p]
    yield "review MANIFEST", lambda p: ["review", p, "--gpu", "H100"]
    yield "review --model-dir (its config.json)", lambda p: ["review", SCRIPT, "--gpu", "H100", "--model-dir",
                                                             _model_dir_with(tmp, p)]
    yield "fleet INVENTORY", lambda p: ["fleet", p]
    yield "fleet --sign-key", lambda p: ["fleet", _inventory(tmp), "--record", tmp / "fleet.dsse.json", "--sign-key", p]
    yield "demo --sign-key", lambda p: ["demo", "--sign-key", p]
    yield "advisories list --advisories (a file in it)", lambda p: ["advisories", "list", "--advisories",
                                                                   _folder_with(tmp, p)]


def _inventory(tmp: Path) -> Path:
    inventory = tmp / "fleet.yaml"
    inventory.write_text(f"deployments:\n  - name: a\n    attach: {{endpoints: ['{ENGINE}']}}\n")
    return inventory


def _folder_with(tmp: Path, hostile: Path) -> Path:
    """A folder whose one advisory file is `hostile`."""
    folder = tmp / f"advisories-{len(list(tmp.iterdir()))}"
    folder.mkdir()
    (folder / "extra.yaml").symlink_to(hostile)
    return folder


def _model_dir_with(tmp: Path, hostile: Path) -> Path:
    """A models folder whose Qwen2.5-7B-Instruct/config.json is `hostile`."""
    model = tmp / f"models-{len(list(tmp.iterdir()))}" / "Qwen2.5-7B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").symlink_to(hostile)
    return model.parent


def _cases() -> list[tuple[str, str]]:
    names = ["check --api-key-file", "check --log", "check --ca-bundle", "check --client-cert", "check --client-key",
             "check --sign-key", "check --boot", "check --advisories (a file in it)", "verify RECORD", "verify --key",
             "verify --sign-key", "review MANIFEST", "review --model-dir (its config.json)", "fleet INVENTORY",
             "fleet --sign-key", "demo --sign-key",
             "advisories list --advisories (a file in it)"]
    return [(option, kind) for option in names for kind in HOSTILE]


class _Blocked(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Blocked


@pytest.mark.parametrize(("option", "kind"), _cases())
def test_every_path_option_refuses_what_is_not_a_bounded_regular_file(tmp_path: Path, option: str, kind: str) -> None:
    options = dict(_options(tmp_path))
    assert sorted(options) == sorted(o for o, _ in _cases()[::len(HOSTILE)])
    hostile = HOSTILE[kind](tmp_path)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)  # a read that blocks or never ends fails here instead of hanging the suite
    try:
        result: subprocess.CompletedProcess = invoke(*options[option](hostile))
    except _Blocked:
        pytest.fail(f"{option} with {kind}: still reading after 20 s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if (option, kind) == ("check --log", "a sparse file past the cap"):
        # a log may be longer than its cap: its newest end is read, and the check goes on to the
        # engine (nothing listens: inconclusive), within the time above
        assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
        return
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert os.path.basename(hostile) in lines[0] or str(hostile) in lines[0] or "extra.yaml" in lines[0] \
        or "config.json" in lines[0] or option.startswith("check --c"), lines[0]  # the TLS flags are named, not their paths


@pytest.mark.parametrize(("kind", "error"), [(FileKind.SECRET, "16 KiB"), (FileKind.RECORD, "16 MiB")])
def test_the_refusal_names_the_file_the_kind_and_the_cap(tmp_path: Path, kind: FileKind, error: str) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * (kind.cap + 1))
    with pytest.raises(RecordError) as caught:
        read_bytes(big, kind, RecordError)
    message = str(caught.value)
    assert str(big) in message and kind.label in message and error in message and "\n" not in message


def test_a_logs_tail_is_read_bounded_and_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    line = b"a line the engine logged before the newest end\n"
    with log.open("wb") as handle:
        handle.write(b"first line\n" + line * (FileKind.LOG.cap // len(line) + 1000))  # past the cap
        handle.write(b"KV Cache is allocated. #tokens: 8192\n")
    text = read_tail(log)
    assert len(text) <= FileKind.LOG.cap and text.endswith("#tokens: 8192\n") and "first line" not in text
    assert text.startswith(line.decode())  # the line the cap cut through is dropped, the next kept whole


# Package reads and writes kept outside kvpreflight/_internal/files.py, each for its reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("boot/readiness.py", "open"): "urllib's OpenerDirector.open: an HTTP request, not a file",
}
FILE_CALLS = {"open", "read_text", "read_bytes", "fdopen"}  # as methods (Path's, os'); `open` also bare


def file_calls(source: str) -> list[tuple[int, str]]:
    """(line, name) of each call in `source` that opens or reads a file."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = "open" if isinstance(func, ast.Name) and func.id == "open" else \
                func.attr if isinstance(func, ast.Attribute) else ""
            if name in FILE_CALLS:
                out.append((node.lineno, name))
    return sorted(out)


def test_no_module_but_files_py_opens_or_reads_a_file() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        if where != "_internal/files.py":
            found += [f"{where}:{line}: {name}(...)" for line, name in file_calls(path.read_text())
                      if (where, name) not in ALLOWED]
    assert found == [], "read and write files through kvpreflight/_internal/files.py:\n" + "\n".join(found)


def test_the_scan_sees_each_way_of_opening_a_file() -> None:
    source = ("open('x')\nPath('x').read_text()\nos.fdopen(3)\nPath('x').open()\np.read_bytes()\nprint('open')\n"
              "read_bytes(p, FileKind.RECORD)\n")  # the last: files.py's own reader, by name
    assert file_calls(source) == [(1, "open"), (2, "read_text"), (3, "fdopen"), (4, "open"), (5, "read_bytes")]
