"""Boot a deployment, wait until every engine is ready, and always stop it again.

    with boot_deployment(spec, log_dir) as deployment:
        ...  # deployment.entry_url, deployment.engines, deployment.log_files

Engines other than routers start together; routers start once every worker is ready (a router
needs its workers). An engine that exits, or is not ready by its ready_timeout_s, stops the boot
with BootError (exit 3) naming it, its exit status and its last log lines. On leaving the block
for any reason (success, error, Ctrl-C, SIGTERM) every engine's process family gets SIGTERM, then
SIGKILL after `stop_grace_s`, and is reaped. SIGTERM/SIGHUP become SystemExit(128+signal) in the
main thread for the duration, so callers' `finally` blocks run too.

Not covered: SIGKILL of the launching process itself (nothing can run then); the engines, in
their own sessions, would stay; their PIDs are in the "started" progress lines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import types
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO

from kvpreflight._internal.files import check_writable_folder
from kvpreflight._internal.redact import Redactor
from kvpreflight.boot.deployment import BootedDeployment, BootedEngine
from kvpreflight.boot.errors import BootConfigError, BootError
from kvpreflight.boot.launch import DeploymentPlan, LaunchPlan, plan_deployment
from kvpreflight.boot.process import EngineProcess, stop_all
from kvpreflight.boot.progress import BootProgress, clip
from kvpreflight.boot.readiness import probe
from kvpreflight.boot.signals import signals_held, sigterm_raises
from kvpreflight.boot.spec import DeploymentSpec

POLL_S = 0.25


@contextlib.contextmanager
def boot_deployment(
    spec: DeploymentSpec,
    log_dir: str | os.PathLike[str],
    *,
    stderr: TextIO | None = None,
    progress_interval_s: float = 5.0,
    stop_grace_s: float = 10.0,
    secrets: Iterable[str] = (),
    say: Callable[[str], None] | None = None,
) -> Iterator[BootedDeployment]:
    """Start every engine of `spec`, yield once all are ready, stop them all on exit. The values of
    `secrets` are removed from every line shown (engines' log lines are quoted in progress and errors).
    BootProgress goes to `say` when given (each line "boot: ..."), else to `stderr`.

    Raises BootConfigError (exit 2) for a problem found before anything started (port in use, program
    not found), exit 3 when an engine exits or is not ready in time.
    """
    progress = BootProgress(stderr, progress_interval_s, Redactor(secrets).text, say=say)
    plan = plan_deployment(spec)
    log_dir = os.fspath(log_dir)
    try:
        check_writable_folder(log_dir)
    except OSError as exc:
        raise BootConfigError(f"cannot write engine logs to {log_dir} ({exc.strerror or exc}); "
                        "choose a writable log folder") from None
    started: list[EngineProcess] = []
    failed = False
    with sigterm_raises():
        try:
            workers = [p for p in plan.engines if p.spec.role != "router"]
            routers = [p for p in plan.engines if p.spec.role == "router"]
            for phase in (workers, routers):
                if phase:
                    _wait_ready(_start_all(phase, log_dir, started, progress), progress)
            yield _booted(plan, started)
        except BaseException:
            failed = True
            raise
        finally:
            with signals_held(deliver=not failed, notice=lambda: progress.say("still stopping engines; wait")):
                started = [p for p in started if p.launched]
                if started:
                    progress.say(f"stopping {len(started)} engine(s)")
                    stop_all(started, stop_grace_s, say=progress.say)
                    leftover = [p.name for p in started if not p.gone()]
                    if leftover:
                        progress.say(f"could not stop {', '.join(leftover)}; check the process table")
                    else:
                        progress.say("all engines stopped")


def _start_all(plans: list[LaunchPlan], log_dir: str, started: list[EngineProcess],
               progress: BootProgress) -> list[EngineProcess]:
    batch = []
    for plan in plans:
        proc = EngineProcess(plan, os.path.join(log_dir, f"{plan.name}.log"))
        started.append(proc)  # before start(): a signal right after the fork must still stop it
        proc.start()
        batch.append(proc)
        gpus = f", GPUs {','.join(plan.spec.gpus)}" if plan.spec.gpus else ""
        progress.say(f"started {plan.name} ({plan.spec.role}{gpus}) pid {proc.pid}, log {proc.log_path}")
    return batch


def _wait_ready(batch: list[EngineProcess], progress: BootProgress) -> None:
    pending = list(batch)
    last_status = {p.name: "not asked yet" for p in batch}
    while pending:
        for proc in list(pending):
            code = proc.poll()
            if code is not None:
                raise BootError(f"engine {proc.name} ({proc.plan.spec.role}) {_describe_exit(code)} "
                                f"{proc.elapsed():.1f}s after start, before it was ready; {_last_words(proc, progress.scrub)}")
            remaining = proc.plan.spec.ready_timeout_s - proc.elapsed()
            if remaining <= 0:
                raise BootError(f"engine {proc.name} ({proc.plan.spec.role}) was not ready within "
                                f"{proc.plan.spec.ready_timeout_s:g}s ({proc.plan.ready_url}: "
                                f"{last_status[proc.name]}); raise ready_timeout_s if it is only slow; "
                                f"{_last_words(proc, progress.scrub)}")
            ready, last_status[proc.name] = probe(proc.plan.ready_url, min(2.0, remaining))
            if ready:
                progress.say(f"{proc.name} ready after {proc.elapsed():.1f}s at {proc.plan.url}")
                pending.remove(proc)
        if pending:
            progress.tick(lambda: "waiting for " + "; ".join(
                f"{p.name} {p.elapsed():.0f}s ({last_status[p.name]}): "
                + clip(progress.scrub((p.last_lines(1) or ["no output yet"])[0]), 100)
                for p in pending))
            time.sleep(POLL_S)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def _last_words(proc: EngineProcess, scrub: Callable[[str], str]) -> str:
    if proc.poll() is not None:
        proc.finish(timeout=1.0)  # let the copier catch the final lines of a dead engine
    lines = [clip(scrub(line), 200) for line in proc.last_lines(3)]
    said = "last log lines: " + " | ".join(lines) if lines else "it wrote no output"
    return f"{said}; full log: {proc.log_path}"


def _booted(plan: DeploymentPlan, started: list[EngineProcess]) -> BootedDeployment:
    engines = tuple(
        BootedEngine(
            name=p.name, role=p.plan.spec.role, url=p.plan.url, ready_url=p.plan.ready_url,
            pid=p.pid, log_path=p.log_path, engine=p.plan.spec.kind, gpus=p.plan.spec.gpus,
            port=p.plan.port,
        )
        for p in started
    )
    return BootedDeployment(
        spec=plan.spec,
        engines=engines,
        entry_url=plan.entry_url,
        log_files=types.MappingProxyType({e.url: e.log_path for e in engines}),
    )
