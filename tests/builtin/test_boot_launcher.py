"""The launcher against real processes over real HTTP on 127.0.0.1: a stand-in engine
(tests/boot_support/fake_engine.py) that boots, crashes, never gets ready, ignores SIGTERM or
leaves children behind. Every test checks the process table (`ps`) afterwards; a safety net
kills, by PID and process group, whatever a failing test would otherwise leave running."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from boot_support.procs import group_members, live_pids

from kvpreflight.boot import BootError, boot_deployment, parse_spec

FAKE = str(Path(__file__).parents[1] / "boot_support" / "fake_engine.py")
DRIVER = str(Path(__file__).parents[1] / "boot_support" / "driver.py")
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def reaper():
    """Collects PIDs the test saw; kills any still alive at teardown, group and process."""
    pids: set[int] = set()
    yield pids
    for pid in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def spec_file(tmp_path: Path, *engines: tuple[str, str, str], entry: str | None = None) -> Path:
    """A spec file of (name, role, fake-engine mode) engines, for the driver process."""
    lines = ["deployment: driven", *([f"entry: {entry}"] if entry else []), "engines:"]
    for name, role, mode in engines:
        args = ", ".join(f"'{a}'" for a in mode.split())
        lines.append(f"  - {{name: {name}, role: {role}, port: auto, command: ['{{python}}', '{FAKE}', '{{port}}', {args}]}}")
    path = tmp_path / "spec.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def ready_pids(driver: subprocess.Popen, reaper: set[int]) -> set[int]:
    """Waits for the driver's READY line; the engine processes it names."""
    line = driver.stdout.readline()
    assert line.startswith("READY "), driver.stderr.read() if driver.poll() is not None else line
    pids = {int(p) for p in line.split()[1:]}
    reaper.update(pids)
    return pids


@contextlib.contextmanager
def driver_process(spec: Path, tmp_path: Path, reaper: set[int]):
    """tests/boot_support/driver.py running the launcher in a process (and session) of its own."""
    driver = subprocess.Popen([sys.executable, DRIVER, str(spec), str(tmp_path / "logs")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, cwd=Path(__file__).parents[2])
    reaper.add(driver.pid)
    try:
        yield driver
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


def engine(name, mode, role="unified", **extra):
    return {"name": name, "role": role, "port": "auto",
            "command": ["{python}", FAKE, "{port}", *mode.split()], **extra}


def spec_of(*engines, **top):
    return parse_spec({"deployment": "test", "engines": list(engines), **top}, source="test.yaml")


def seen_pids(stderr: io.StringIO) -> set[int]:
    return {int(pid) for pid in re.findall(r"pid (\d+)", stderr.getvalue())}


def children_in_logs(log_dir: Path) -> set[int]:
    return {int(pid) for log in log_dir.glob("*.log") for pid in re.findall(r"child pid (\d+)", log.read_text())}


def assert_all_gone(pids: set[int]) -> None:
    assert pids, "the test saw no engine processes at all"
    left = pids & live_pids()
    assert not left, f"processes left behind: {sorted(left)}"
    for pid in pids:
        assert not group_members(pid), f"process group {pid} still has members"


def get(url: str) -> int:
    with NO_PROXY.open(url, timeout=5) as response:
        return response.status


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_boots_pd_trio_and_stops_everything(tmp_path, reaper):
    spec = spec_of(
        engine("prefill", "ok", role="prefill", gpus=[0, 1]),
        engine("decode", "ok", role="decode", gpus="2,3"),
        engine("router", "proxy", role="router", env={"UPSTREAM": "{prefill.url}"}),
        context_length=4096,
    )
    stderr = io.StringIO()
    with boot_deployment(spec, tmp_path, stderr=stderr) as deployment:
        pids = set().union(*(e.process_ids() for e in deployment.engines))
        reaper.update(pids)
        assert [e.name for e in deployment.engines] == ["prefill", "decode", "router"]
        router = deployment.engine("router")
        assert deployment.entry_url == router.url
        assert get(deployment.entry_url + "/health") == 200  # the router reached prefill
        assert len({e.port for e in deployment.engines}) == 3
        assert all(e.url == f"http://127.0.0.1:{e.port}" for e in deployment.engines)
        prefill_log = Path(deployment.log_files[deployment.engine("prefill").url]).read_text()
        assert "fake engine ok loading weights" in prefill_log
        assert "CUDA_VISIBLE_DEVICES=0,1" in prefill_log
        assert deployment.engine("decode").gpus == ("2", "3")
        ports = [e.port for e in deployment.engines]
    assert_all_gone(pids)
    assert all(refused(port) for port in ports)
    progress = stderr.getvalue()
    assert "started prefill (prefill, GPUs 0,1) pid" in progress
    assert "router ready after" in progress
    assert "all engines stopped" in progress
    # routers start only after their workers are ready
    assert progress.index("decode ready") < progress.index("started router")


def test_engine_that_crashes_on_start_is_named_with_its_last_log_line(tmp_path, reaper):
    spec = spec_of(engine("prefill", "ok"), engine("decode", "crash"), entry="prefill")
    stderr = io.StringIO()
    with pytest.raises(BootError) as caught:
        with boot_deployment(spec, tmp_path, stderr=stderr):
            pytest.fail("the block must not run when an engine crashed")
    reaper.update(seen_pids(stderr))
    message = str(caught.value)
    assert caught.value.exit_code == 3
    assert "engine decode (unified) exited with status 7" in message
    assert "RuntimeError: CUDA out of memory (fake)" in message
    assert "api_key='***'" in message and "sk-live-123" not in message  # secrets masked
    assert str(tmp_path / "decode.log") in message
    assert "\n" not in message
    assert_all_gone(seen_pids(stderr))  # the healthy prefill was stopped too


def test_engine_never_ready_is_killed_at_its_deadline(tmp_path, reaper):
    spec = spec_of(engine("slowpoke", "never-ready", ready_timeout_s=1.5))
    stderr = io.StringIO()
    started = time.monotonic()
    with pytest.raises(BootError) as caught:
        with boot_deployment(spec, tmp_path, stderr=stderr):
            pass
    took = time.monotonic() - started
    reaper.update(seen_pids(stderr))
    assert 1.5 <= took < 8
    assert caught.value.exit_code == 3
    assert "engine slowpoke (unified) was not ready within 1.5s" in str(caught.value)
    assert "HTTP 503" in str(caught.value)
    assert "listening on 127.0.0.1" in str(caught.value)  # its last log line
    assert_all_gone(seen_pids(stderr))


def test_engine_ignoring_sigterm_gets_sigkill_after_grace(tmp_path, reaper):
    spec = spec_of(engine("stubborn", "ignore-term"))
    stderr = io.StringIO()
    with boot_deployment(spec, tmp_path, stderr=stderr, stop_grace_s=1.0) as deployment:
        pid = deployment.engines[0].pid
        reaper.add(pid)
        left_block = time.monotonic()
    took = time.monotonic() - left_block
    assert 1.0 <= took < 6
    assert f"engine stubborn (pid {pid}) still running 1s after SIGTERM; sending SIGKILL" in stderr.getvalue()
    assert_all_gone({pid})


def test_children_that_left_the_group_are_stopped_too(tmp_path, reaper):
    spec = spec_of(engine("parent", "family"))
    with boot_deployment(spec, tmp_path, stderr=io.StringIO(), stop_grace_s=1.0) as deployment:
        children = children_in_logs(tmp_path)
        reaper.update(children | {deployment.engines[0].pid})
        assert len(children) == 2
        assert children <= deployment.engines[0].process_ids()
    assert_all_gone(children | {deployment.engines[0].pid})


def test_progress_is_throttled_and_shows_the_last_log_line(tmp_path, reaper):
    spec = spec_of(engine("loader", "slow 3"))
    stderr = io.StringIO()
    with boot_deployment(spec, tmp_path, stderr=stderr, progress_interval_s=1.0) as deployment:
        reaper.add(deployment.engines[0].pid)
    waiting = [line for line in stderr.getvalue().splitlines() if "waiting for" in line]
    assert 1 <= len(waiting) <= 4, waiting
    assert re.search(r"waiting for loader \d+s \(connection refused\): loading shard \d+", waiting[0])


def test_exception_in_the_block_still_stops_engines(tmp_path, reaper):
    spec = spec_of(engine("one", "ok"))
    with pytest.raises(ZeroDivisionError):
        with boot_deployment(spec, tmp_path, stderr=io.StringIO()) as deployment:
            pid = deployment.engines[0].pid
            reaper.add(pid)
            raise ZeroDivisionError  # any exception inside the block
    assert_all_gone({pid})


def test_missing_program_is_a_configuration_error(tmp_path):
    spec = spec_of({"name": "ghost", "role": "unified", "port": "auto",
                    "command": "no-such-engine-binary --port {port}"})
    with pytest.raises(BootError) as caught:
        with boot_deployment(spec, tmp_path, stderr=io.StringIO()):
            pass
    assert caught.value.exit_code == 2
    assert "engine ghost: cannot start 'no-such-engine-binary' (No such file or directory)" in str(caught.value)


def test_port_already_in_use_is_refused_before_starting(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = spec_of(dict(engine("one", "ok"), port=port))
        stderr = io.StringIO()
        with pytest.raises(BootError) as caught:
            with boot_deployment(spec, tmp_path, stderr=stderr):
                pass
    assert caught.value.exit_code == 2
    assert f"engines[0].port: {port} is already in use" in str(caught.value)
    assert "started" not in stderr.getvalue()


@pytest.mark.parametrize("sig, exit_code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_the_launching_process_stops_every_engine(tmp_path, reaper, sig, exit_code):
    spec = spec_file(tmp_path, ("prefill", "prefill", "family"), ("decode", "decode", "ignore-term"),
                     ("router", "router", "ok"), entry="router")
    with driver_process(spec, tmp_path, reaper) as driver:
        pids = ready_pids(driver, reaper)
        assert len(pids) == 5  # three engines and the two children of prefill
        os.kill(driver.pid, sig)
        code = driver.wait(timeout=20)
        stderr = driver.stderr.read()
    assert code == exit_code, stderr
    assert "all engines stopped" in stderr
    assert_all_gone(pids)


def test_sigterm_while_engines_still_load_stops_them(tmp_path, reaper):
    spec = spec_file(tmp_path, ("big", "unified", "slow 60"))
    with driver_process(spec, tmp_path, reaper) as driver:
        line = driver.stderr.readline()
        found = re.search(r"started big \(unified\) pid (\d+)", line)
        assert found, line
        pid = int(found.group(1))
        reaper.add(pid)
        time.sleep(1.0)  # it is loading now
        assert pid in live_pids()
        os.kill(driver.pid, signal.SIGTERM)
        code = driver.wait(timeout=20)
        stderr = driver.stderr.read()
    assert code == 143, stderr
    assert "READY" not in driver.stdout.read()
    assert_all_gone({pid})


def test_engine_dying_after_boot_is_visible(tmp_path, reaper):
    with boot_deployment(spec_of(engine("one", "ok")), tmp_path, stderr=io.StringIO()) as deployment:
        (one,) = deployment.engines
        reaper.add(one.pid)
        assert one.running()
        os.kill(one.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while one.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not one.running()
    assert_all_gone({one.pid})


def test_unwritable_log_folder_is_a_configuration_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(BootError, match=r"cannot write engine logs to .*file/logs .*; choose a writable log folder") as caught:
        with boot_deployment(spec_of(engine("one", "ok")), blocker / "logs", stderr=io.StringIO()):
            pass
    assert caught.value.exit_code == 2


def test_deployment_says_which_engine_holds_which_gpu(tmp_path, reaper):
    from kvpreflight._internal.gpus import Gpu, GpuInventory, GpuProcess
    from kvpreflight.check_plan import CheckPlan
    from kvpreflight.model import Role
    from kvpreflight.preflight import booted_plan
    from kvpreflight.targets import Target

    spec = spec_of(engine("p", "ok", role="prefill"), engine("d", "ok", role="decode"), entry="p")
    with boot_deployment(spec, tmp_path, stderr=io.StringIO()) as deployment:
        p, d = deployment.engines
        reaper.update({p.pid, d.pid})
        # A booted deployment becomes the check's targets directly (no ROLE=URL round trip).
        plan = booted_plan(CheckPlan(targets=()), spec, deployment)
        assert plan.targets == (Target(p.url, Role.PREFILL), Target(d.url, Role.DECODE)) and plan.booted
        found = GpuInventory(driver_version="580", gpus=(
            Gpu(0, "H100", "GPU-a", 80, 70, (GpuProcess(p.pid, 69, "compute"),)),
            Gpu(1, "H100", "GPU-b", 80, 70, (GpuProcess(d.pid, 69, "compute"),)),
            Gpu(2, "H100", "GPU-c", 80, 0, ()),
        ))
        records = deployment.gpu_records(found)
    assert [(r["uuid"], r["engines"]) for r in records] == [("GPU-a", ["p"]), ("GPU-b", ["d"]), ("GPU-c", [])]
    assert_all_gone({p.pid, d.pid})


def test_second_ctrl_c_during_shutdown_does_not_abandon_engines(tmp_path, reaper):
    spec = spec_file(tmp_path, ("stubborn", "unified", "ignore-term"))
    with driver_process(spec, tmp_path, reaper) as driver:
        pids = ready_pids(driver, reaper)
        os.kill(driver.pid, signal.SIGINT)
        time.sleep(1.0)  # the driver waits out its 3 s grace for the stubborn engine
        os.kill(driver.pid, signal.SIGINT)
        code = driver.wait(timeout=20)
        stderr = driver.stderr.read()
    assert code == 130, stderr
    assert "still stopping engines; wait" in stderr
    assert "sending SIGKILL" in stderr and "all engines stopped" in stderr
    assert_all_gone(pids)
