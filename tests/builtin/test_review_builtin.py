"""Review's estimate against what a running builtin engine really allocates.

The engine is started as a deployment would start it (the same command line review reads);
its pool comes from its own /server_info and its allocator's log line, not from review's code.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvpreflight._internal.review import review
from kvpreflight._internal.review.estimate import ReviewInputs

ROOT = Path(__file__).parents[2]


def _boot(args: list[str]) -> tuple[int, str]:
    """Start `kvpreflight engine serve ARGS --port 0`; return (max_total_num_tokens, log)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvpreflight", "engine", "serve", *args, "--port", "0", "--device", "cpu"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    log: list[str] = []
    try:
        deadline = time.monotonic() + 90
        port = None
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError("builtin engine exited:\n" + "".join(log))
            log.append(line)
            m = re.search(r"running on http://[\d.]+:(\d+)", line)
            port = int(m.group(1)) if m else None
        assert port, "builtin engine did not start:\n" + "".join(log)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10) as resp:
            info = json.load(resp)
        return int(info["max_total_num_tokens"]), "".join(log)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    "flags,hand",
    [
        # (1,000,000 - 16,640 weights) - 1,000,000 * (1 - 0.5) = 483,360 B; // 128 B = 3,776; pages of 16: 3,776
        ("--mem-budget-bytes 1000000 --mem-fraction-static 0.5", 3_776),
        # (8,388,608 - 16,640) - 8,388,608 * 0.1 = 7,533,107.2 B; // 128 = 58,852; page 1
        ("--mem-budget-bytes 8388608 --mem-fraction-static 0.9 --page-size 1", 58_852),
        # --pool-tokens 5000 in pages of 16: 312 * 16 = 4,992
        ("--pool-tokens 5000", 4_992),
    ],
)
def test_estimate_matches_what_the_builtin_engine_allocates(tmp_path, flags, hand):
    script = tmp_path / "serve.sh"
    script.write_text(f"kvpreflight engine serve --role prefill --context-length 4096 \\\n  {flags}\n")
    (check,) = review([script], ReviewInputs()).checks
    estimated = check.evidence["estimated_pool_tokens"]
    assert estimated == hand
    real, log = _boot(["--role", "prefill", "--context-length", "4096", *flags.split()])
    assert real == estimated
    assert f"#tokens: {estimated}," in log  # the allocator's own line agrees
