"""Progress in a CI log (no terminal): one plain line per step, each saying when it began, so the
step that took the time shows."""

from __future__ import annotations

import io
import re
import time

from kvpreflight.terminal import progress_to_stderr


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
