"""What a person sees on a terminal: no line of `check` or `review` wider than COLUMNS (messages
wrap, nothing is cut), colour and the live progress line only on a terminal, never with NO_COLOR,
and plain lines, one per step, in a CI log."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from misbehaving_http import DIALECTS, fake_engine

from kvpreflight._internal.checks import CHECK_IDS

ROOT = Path(__file__).resolve().parents[2]
SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour and style
MODEL_DIR = ROOT / "tests/fixtures/review/models/DeepSeek-V3"


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvpreflight", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


@pytest.mark.parametrize("columns", [80, 120])
def test_no_line_of_check_or_review_is_wider_than_the_terminal(columns: int) -> None:
    env = {"COLUMNS": str(columns)}
    with fake_engine(DIALECTS["sglang"]) as url:
        check = run("check", "--endpoint", url, "--timeout", "2", env=env)
    review = run("review", "--model-dir", str(MODEL_DIR), "examples/review/incident-pd-lws.yaml", env=env)
    assert check.returncode == 3 and review.returncode == 1, (check.stderr[-800:], review.stderr[-800:])
    for proc in (check, review):
        lines = (proc.stdout + proc.stderr).splitlines()
        assert max(len(line) for line in lines) <= columns, max(lines, key=len)
    assert "Checks (" in check.stdout and "tenant-isolation" in check.stdout  # wrapped, not dropped


def on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Everything a command writes to a pseudo-terminal (stdout and stderr both)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kvpreflight", *args], stdin=follower, stdout=follower, stderr=follower,
                            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", **env}, close_fds=True)
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the command ended and closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        os.close(leader)
    return out.decode("utf-8", errors="replace")


@pytest.mark.parametrize("no_color", [False, True])
def test_colour_and_the_live_line_only_on_a_terminal_and_never_with_no_color(no_color: bool) -> None:
    with fake_engine(DIALECTS["sglang"]) as url:
        text = on_a_terminal(["check", "--endpoint", url, "--timeout", "2"], {"NO_COLOR": "1"} if no_color else {})
    assert "probe boundary-accept" in text and "INCONCLUSIVE" in text
    coloured = [code for code in SGR.findall(text) if code not in ("\x1b[0m", "\x1b[m")]
    if no_color:
        assert coloured == [], coloured[:5]
    else:
        assert coloured  # the status column and the verdict
    assert "\x1b[?25l" in text  # rich hid the cursor for the live line (and showed it again)


def test_in_a_ci_log_progress_is_one_plain_line_per_step() -> None:
    with fake_engine(DIALECTS["sglang"]) as url:
        proc = run("check", "--endpoint", url, "--timeout", "2", env={})
    assert "\x1b" not in proc.stderr + proc.stdout
    # each line says when its step began: "kvpreflight: [1.2 s] probe boundary-accept: ..."
    probes = [line for line in proc.stderr.splitlines() if re.match(r"kvpreflight: \[\d+\.\d s\] probe ", line)]
    assert len(probes) == len(set(probes)) >= 5


def _tmux(socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-S", str(socket), *args], capture_output=True, text=True, timeout=30)


def test_a_tmux_pane_of_80_columns_shows_every_row_of_the_table_on_whole_lines(tmp_path: Path) -> None:
    """A real terminal (tmux, colour on, no COLUMNS): the width comes from the pane itself, and
    no line of the table is wrapped by the terminal (a soft-wrapped line shows only when joined)."""
    from support.consumers import consumer

    consumer("tmux")
    socket, done = tmp_path / "tmux.sock", tmp_path / "done"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "TMUX")}
    with fake_engine(DIALECTS["sglang"]) as url:
        command = (f"{sys.executable} -m kvpreflight check --endpoint {url} --timeout 2 --capacity-only 2>/dev/null;"
                   f" touch {done}; sleep 60")
        started = subprocess.run(["tmux", "-S", str(socket), "-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "200",
                                  command], env={**env, "TERM": "xterm-256color"}, capture_output=True, text=True, timeout=30)
        assert started.returncode == 0, started.stderr
        try:
            deadline = time.monotonic() + 60
            while not done.exists():
                assert time.monotonic() < deadline, _tmux(socket, "capture-pane", "-p").stdout
                time.sleep(0.2)
            shown = _tmux(socket, "capture-pane", "-p", "-e", "-S", "0").stdout  # as displayed, with colour
            joined = _tmux(socket, "capture-pane", "-p", "-J", "-S", "0").stdout  # wrapped lines joined again
        finally:
            _tmux(socket, "kill-server")
    lines = [line for line in shown.rstrip("\n").splitlines()]
    assert any(SGR.search(line) for line in lines), "no colour: the pane is not a terminal to kvpreflight"
    plain = [SGR.sub("", line) for line in lines]
    assert joined.rstrip("\n").splitlines() == [line.rstrip() for line in plain]  # no line wrapped by the terminal
    heading = next(line for line in plain if line.startswith("Checks ("))  # "Checks (2 pass, 1 warn, 9 skip)"
    expected = sum(int(count.split()[0]) for count in heading.removeprefix("Checks (").rstrip(")").split(", "))
    table = plain[plain.index(heading) + 3:]
    table = table[:table.index("")]
    table = [line for line in table if not line.startswith("… marks a message cut short")]  # the note under it
    starts = [line for line in table if not line.startswith(" ")]
    assert all(line.split()[0] in ("FAIL", "INCONCLUSIVE", "WARN", "SKIP", "PASS") for line in starts), table
    # one row per result, the same finding on several checks grouped into one row naming them all:
    # every check the heading counts is named once in the table
    named = [word.rstrip(",") for line in table for word in line.split() if word.rstrip(",") in CHECK_IDS]
    assert len(named) == len(set(named)) == expected >= 10, table
    assert len(table) > len(starts), table  # and a long message wrapped, within its column
    assert all(len(line) <= 80 for line in plain)
