"""Run batches on this machine, at most N at a time, each in a daemon thread with a deadline."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

from kvpreflight.fleet.job import JobSettings, Outcome, run_batch
from kvpreflight.fleet.runners.interface import Batch, Events, Runner, batch_deadline_s, batch_failed


class LocalRunner(Runner):
    name = "local"

    def __init__(self, parallel: int) -> None:
        self.parallel = max(1, parallel)

    def run(self, batches: Sequence[Batch], settings: JobSettings, events: Events) -> list[Outcome]:
        done: queue.Queue = queue.Queue()
        waiting = list(enumerate(batches))
        running: dict[int, float] = {}  # batch index -> deadline (monotonic)
        results: dict[int, list[Outcome]] = {}

        def work(index: int, batch: Batch) -> None:
            try:
                outcomes = list(run_batch(batch, settings))
            except BaseException as exc:  # run_batch fails closed itself; this is the last guard
                outcomes = batch_failed(batch, f"internal error: {type(exc).__name__}: {exc}")
            done.put((index, outcomes))

        while waiting or running:
            while waiting and len(running) < self.parallel:
                index, batch = waiting.pop(0)
                running[index] = time.monotonic() + batch_deadline_s(batch)
                events.started(batch, "this machine")
                threading.Thread(target=work, args=(index, batch), daemon=True,
                                 name=f"kvpreflight-fleet-{index}").start()
            try:
                index, outcomes = done.get(timeout=max(0.0, min(running.values()) - time.monotonic()))
            except queue.Empty:
                now = time.monotonic()
                for index in [i for i, deadline in running.items() if deadline <= now]:
                    del running[index]
                    batch = batches[index]
                    results[index] = batch_failed(batch, f"did not finish within its deadline of "
                                                         f"{batch_deadline_s(batch):g}s (timeout_s); abandoned")
                    for outcome in results[index]:
                        events.finished(outcome)
                continue
            if index not in running:  # came back after its deadline; already reported
                continue
            del running[index]
            results[index] = outcomes
            for outcome in outcomes:
                events.finished(outcome)
        return [o for i in range(len(batches)) for o in results[i]]
