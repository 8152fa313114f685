"""Progress in a CI log (no terminal): one plain line per step, each saying when it began, so the
step that took the time shows."""

from __future__ import annotations

import io
import re
import time

from kvpreflight._internal.terminal import progress_to_stderr


def test_each_plain_progress_line_says_when_its_step_began():
    stream = io.StringIO()
    with progress_to_stderr("kvpreflight", stream, environ={}) as say:
        say("probe boundary-accept: 8185 tokens")
        time.sleep(0.25)
        say("probe clamp: 8177 tokens")
    first, second = stream.getvalue().splitlines()
    assert re.fullmatch(r"kvpreflight: \[0\.\d s\] probe boundary-accept: 8185 tokens", first), first
    began = [float(re.match(r"kvpreflight: \[(\d+\.\d) s\] ", line).group(1)) for line in (first, second)]
    assert began[1] - began[0] >= 0.2


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_boot_steps_are_drawn_on_the_live_line_not_under_it():
    from kvpreflight.boot.progress import BootProgress

    terminal, stderr = _Terminal(), io.StringIO()
    with progress_to_stderr("kvpreflight", terminal, environ={"TERM": "xterm"}) as show:
        boot = BootProgress(stderr, scrub=lambda text: text.replace("sk-live-0123", "***"), say=show)
        boot.say("started prefill pid 41 sk-live-0123")
        time.sleep(0.4)  # rich redraws the live line several times a second
    out = terminal.getvalue()
    assert "kvpreflight: boot: started prefill pid 41 ***" in out  # the line, printed above the live line
    assert "boot: started prefill pid 41 ***  [0 s]" in out  # the live line: the step and its elapsed time
    assert "sk-live-0123" not in out and stderr.getvalue() == ""  # nothing written past the live line


def test_check_boot_hands_its_progress_to_the_boot(monkeypatch, tmp_path):
    """preflight.run_booted gives the boot the caller's progress (check --boot's live line)."""
    import contextlib

    import kvpreflight.boot
    from kvpreflight import preflight
    from kvpreflight._internal.demo import BuiltinDeployment, demo_spec
    from kvpreflight.check_plan import CheckPlan
    from kvpreflight.errors import NotMeasured

    @contextlib.contextmanager
    def boot_deployment(spec, log_dir, *, secrets=(), say=None):
        say("boot: started engine pid 7")
        raise NotMeasured("stop here")
        yield

    monkeypatch.setattr(kvpreflight.boot, "boot_deployment", boot_deployment)
    spec = demo_spec(BuiltinDeployment())
    said: list[str] = []
    with contextlib.suppress(NotMeasured):
        preflight.run_booted(spec, CheckPlan(targets=()), log_dir=tmp_path, progress=said.append)
    assert said == ["boot: started engine pid 7"]
