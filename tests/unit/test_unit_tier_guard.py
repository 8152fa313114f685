"""The unit tier's own promise: no test in it can start a process (tests/unit/conftest.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest
from support.no_processes import ProcessStarted, child_pids


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    lambda: subprocess.Popen(["true"]),
    lambda: os.system("true"),
    lambda: os.fork(),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: multiprocessing.get_context("fork").Process(target=print).start(),
], ids=["subprocess.run", "Popen", "os.system", "os.fork", "mp-spawn", "mp-fork"])
def test_every_way_to_start_a_process_is_refused(start):
    with pytest.raises(ProcessStarted, match="starts no process"):
        start()


def test_no_child_process_is_running_now():
    assert child_pids() == set()
