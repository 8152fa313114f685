"""The README's quickstart is what a newcomer gets: `kvpreflight check --endpoint URL` against the
builtin engine started as the README says prints the checks, statuses and verdict line the README
shows. One engine, one check (about 15 s); stopped by PID."""

from __future__ import annotations

import os
import subprocess
import sys

from support.builtin_testbed import start_engine, stop_engine
from support.readme import README, check_rows, row_messages, sample_output, verdict_line

README_URL = "http://localhost:30000"


def test_readme_sample_output_is_what_the_quickstart_command_prints(tmp_path):
    text = README.read_text(encoding="utf-8")
    assert "kvpreflight check --endpoint http://localhost:30000\n" in text
    # The README's way to start the engine, on a free port (the testbed adds only --host/--port).
    assert "kvpreflight engine serve --role unified --context-length 8192 --pool-tokens 16384" in text
    engine = start_engine("unified", tmp_path, context_length=8192, pool_tokens=16384, enable_metrics=False)
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "GITHUB_ACTIONS")} | {"COLUMNS": "100"}
        proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url],
                              capture_output=True, text=True, timeout=180, env=env)
    finally:
        stop_engine(engine)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sample = sample_output(text)
    assert check_rows(proc.stdout) == check_rows(sample)
    assert len(check_rows(sample)) == 13
    # what a newcomer reads first: every warning's and skip's words, not only its status
    assert row_messages(proc.stdout, engine.url) == row_messages(sample, README_URL)
    assert verdict_line(proc.stdout, engine.url) == verdict_line(sample, README_URL)
