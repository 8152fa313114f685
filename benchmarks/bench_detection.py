"""Does a cheaper plan still catch a racy leak (issue 14)? A builtin prefill/decode/router trio
whose decode has fault early-free-on-cancel firing at each client disconnect only with probability
--probability (KVPREFLIGHT_BUILTIN_FAULT_PROBABILITY), checked --runs times, fresh engines each run.
A run detects the leak when tenant-isolation fails with one tenant's answer carrying the other
tenant's canary. The engines always come from this tree; the `kvpreflight check` that probes them
comes from --checkout (another tree, e.g. a `git worktree` of main for the old plan; default: this
tree), so the old and the new plan face the same engines.

    .venv/bin/python benchmarks/bench_detection.py [--runs 20] [--probability 0.3] [--checkout DIR]

`--matrix` runs issue 26's fault matrix instead: each builtin fault of the answer-path classes on
a fresh unified engine (context 2,048, pool 8,192, metrics on), one `check` each, every cell the
fault can fire in judged from that run's evidence (MATRIX below: which check must fail, and the
requests that show the cell), then the honest engine, whose checks must all pass or warn; then
the same on a fresh prefill/decode trio behind the builtin router per fault (PD_MATRIX: which role
carries the fault, and why there; a fault with no unified form, such as decode-cache-no-salt, is in
PD_MATRIX alone, PD_NOT_LISTED saying why), then the honest trio (each engine's log goes to the
check as `--log`, so a fault that prints its engine's own warning can fail on it); a fault listed in
SETUPS runs on the engine shape it names (pool-in-another-unit: a true pool of 1,024 tokens, below
the context, stated as 2,048 unified and 4,096 on the prefill, with a third customer's
BackgroundTraffic during the check, so stale pages hold someone else's text; the honest engines run
with that traffic too, on the pools the fault states); then `--runs` runs of fault
leak-streamed firing with `--probability` per request (`--racy-only`: these alone), beside the
miss probability the plan implies: (1 - p) to the power of the streamed answers that showed the
leak in one run with it firing on every request (a streamed answer that cannot show it, such as
a long prompt's whose echo never reaches the leaked tail, is no chance).

    .venv/bin/python benchmarks/bench_detection.py --matrix [--runs 20] [--probability 0.3]

One JSON line per run, then a summary line; benchmarks/RESULTS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests/support: the builtin testbed
from support.builtin_testbed import BackgroundTraffic, pd_trio, unified_engine  # noqa: E402

from kvpreflight._internal.builtin_engine.config import FAULT_PROBABILITY_ENV, PARALLEL_SIZE_ENV  # noqa: E402

FAULT = "early-free-on-cancel"
TRANSFER_DELAY_MS = 6  # as the demo: a paced link, so a disconnect can land mid-transfer


def detected(report: dict) -> tuple[bool, list[str]]:
    """Whether some tenant's answer carried the other tenant's canary, and in which scenarios."""
    iso = next((c for c in report.get("checks", []) if c["id"] == "tenant-isolation"), None)
    if iso is None or iso["status"] != "fail":
        return False, []
    canaries = iso["evidence"]["canaries"]
    other = {"a": canaries["b"], "b": canaries["a"]}
    crossed = [c for c in iso["evidence"].get("crossings", [])
               if any(m.split(" ")[0] == other[c["tenant"]] for m in c["foreign_markers"])]
    return bool(crossed), sorted({c["scenario"] for c in crossed})


def one(checkout: Path, context: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as workdir, pd_trio(
            Path(workdir), context_length=context, prefill_pool=2 * context, decode_pool=2 * context,
            decode_faults=[FAULT], prefill_args=["--transfer-delay-ms", str(TRANSFER_DELAY_MS)],
            wait_s=600) as trio:  # a loaded machine boots slowly
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "kvpreflight", "check", "--endpoint", f"prefill={trio.prefill.url}",
             "--endpoint", f"decode={trio.decode.url}", "--entry", trio.router.url, "--context-length", str(context),
             "--format", "json", "--timeout", "60"],
            capture_output=True, text=True, timeout=1800, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)})
        wall = time.monotonic() - start
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    caught, scenarios = detected(report)
    cost = report.get("cost") or {}
    return {"exit_code": proc.returncode, "detected": caught, "scenarios": scenarios, "wall_s": round(wall, 1),
            "context_equivalents_submitted": cost.get("context_equivalents_submitted"),
            "context_equivalents_prefilled": cost.get("context_equivalents_prefilled")}


# Issue 26's answer-path faults: fault -> (the check that must fail, {cell: does this run's
# report show the fault caught in that cell}). Cells the fault cannot fire in are in NOT_LISTED.
MATRIX_CONTEXT, MATRIX_POOL = 2048, 8192
# Issue 44: the true pool of fault pool-in-another-unit (below the context) and its parallel
# sizes, unified and on the prefill (two shapes: stated 2,048 and 4,096 tokens).
TRUE_POOL, UNIFIED_P, PD_P = 1024, 2, 4


def _crossed(report: dict, *, streamed: bool, where: tuple[str, ...]) -> bool:
    """A request read to its end (or, for cancel-*, abandoned and scanned), of the given mode and
    named with one of `where`, carried the other tenant's canary (normal's pairs sent at once are
    concurrent, not alone)."""
    iso = _check(report, "tenant-isolation")
    for c in iso.get("evidence", {}).get("crossings", []):
        mode = c.get("stream", True)  # an abandoned request streamed unless it left during the transfer
        name = c["request"]
        if where is ALONE and any(w in name for w in AT_ONCE):
            continue
        if mode is streamed and any(w in name for w in where):
            return True
    return False


def _tally(report: dict, window: str) -> str | None:
    counts = _check(report, "prompt-integrity").get("evidence", {}).get("engine_counts", {})
    return counts.get(window, {}).get("tally")


def _check(report: dict, check_id: str) -> dict:
    return next((c for c in report.get("checks", []) if c["id"] == check_id), {})


def _status_decides(report: dict) -> bool:
    """The cell is the check's own verdict (cells() requires it failed): no finer evidence to read."""
    return True


def _warning_failed(report: dict, phrase: str) -> bool:
    """Some failing check names the engine's own start-up warning (read from --log)."""
    return any(phrase in c.get("message", "") for c in report.get("checks", []) if c.get("status") == "fail")


def _cross_said_no_hit(report: dict) -> bool:
    """prefix-cache-isolation's cross-tenant probes were answered with cached_tokens 0: the hit
    showed only in the engines' counters (faults decode-cache-no-salt*)."""
    probes = _check(report, "prefix-cache-isolation").get("evidence", {}).get("probes", [])
    cross = [p for p in probes if p.get("kind") == "cross"]
    return bool(cross) and all(p.get("cached_tokens") == 0 for p in cross)
def _failed(report: dict, check_id: str) -> bool:
    """Some result of the check failed (a P/D report has one per engine for per-engine checks)."""
    return any(c["id"] == check_id and c["status"] == "fail" for c in report.get("checks", []))


def _requests(report: dict, check_id: str, *names: str) -> list[dict]:
    """The check's probe requests whose name starts with one of `names`."""
    ev = _check(report, check_id).get("evidence", {})
    found = [r for s in ev.get("scenarios", []) for r in s.get("requests", [])]
    found += [r for r in ev.get("requests", []) if isinstance(r, dict)]
    return [r for r in found if any(str(r.get("request", "")).startswith(n) for n in names)]


def _stopped_answering(report: dict) -> bool:
    """tenant-isolation says the engine stopped answering after a disconnect (cancel-*)."""
    message = _check(report, "tenant-isolation").get("message", "")
    return "stopped answering" in message and "cancel-" in message


ALONE, AFTER = ("normal-", "over-capacity-", "boundary-"), ("cancel-",)
AT_ONCE = ("normal-at-once-",)  # normal's last pairs, A beside B
CONCURRENT = ("concurrent-", "load-", *AT_ONCE)
MATRIX = {
    "leak-streamed": ("tenant-isolation", {
        "unified, streamed, alone": lambda r: _crossed(r, streamed=True, where=ALONE),
        "unified, streamed, concurrent": lambda r: _crossed(r, streamed=True, where=CONCURRENT + ("cancel-transfer-",)),
        "unified, streamed, after a client disconnect": lambda r: _crossed(r, streamed=True, where=AFTER)}),
    "leak-not-streamed": ("tenant-isolation", {
        "unified, not streamed, alone": lambda r: _crossed(r, streamed=False, where=ALONE),
        "unified, not streamed, concurrent": lambda r: _crossed(r, streamed=False, where=CONCURRENT + ("cancel-transfer-",)),
        "unified, not streamed, after a client disconnect": lambda r: _crossed(r, streamed=False, where=AFTER)}),
    "shortened-prompt": ("prompt-integrity", {
        "unified, streamed, alone (the limit prompt)": lambda r: _tally(r, "boundary-accept") == "short",
        "unified, streamed and not, concurrent (the pair)": lambda r: _tally(r, "concurrent (x2)") == "short"}),
    "tokens-then-garbage": ("overcapacity-rejected", {
        "unified, streamed, alone (over-context-stream)":
            lambda r: "over-context-stream" in _check(r, "overcapacity-rejected").get("message", "")
            and "does not read" in _check(r, "overcapacity-rejected").get("message", "")}),
    "text-with-bad-count": ("overcapacity-rejected", {
        "unified, not streamed, alone (over-context)":
            lambda r: "its counts not readable" in _check(r, "overcapacity-rejected").get("message", "")}),
    # Issue 44: answers that do not come from their own prompt (defaults: positions 1,024 and a
    # window of 512 at context 2,048). The near-context probes' answers are noise or the tail's
    # text; short ones echo. The loud forms also put the engine's own warning in --log.
    "positions-overridden": ("prompt-integrity", {
        "unified, near-context answers past the positions (noise)": _status_decides,
        "unified, the engine's start-up warning read from --log": lambda r: _warning_failed(r, "derived context_length")}),
    "positions-overridden-silent": ("prompt-integrity", {
        "unified, near-context answers past the positions (noise), no warning": _status_decides}),
    "attention-window": ("prompt-integrity", {
        "unified, near-context answers copied from the last window (no head marker)": _status_decides,
        "unified, the engine's start-up warning read from --log": lambda r: _warning_failed(r, "maxAttentionWindowVec")}),
    "attention-window-silent": ("prompt-integrity", {
        "unified, near-context answers copied from the last window (no head marker), no warning": _status_decides}),
    # Issue 44. Over the true pool (1,024 tokens) every near-limit probe gets a placeholder's
    # answer from stale pages, fast, counted in full: the boundary pair (tenant-isolation), the
    # prompt at the limit (prompt-integrity: it came faster than the engine can prefill it) and
    # the concurrent pair (concurrent-capacity). The cell is caught when that check fails.
    "pool-in-another-unit": ("prompt-integrity", {
        "unified, streamed, alone (the limit prompt, 2,041 tokens over a 1,024-token true pool)":
            lambda r: _failed(r, "prompt-integrity"),
        "unified, streamed and not, concurrent (the pair of 1,785 tokens)": lambda r: _failed(r, "concurrent-capacity"),
        "unified, not streamed, alone (boundary A B B A, 1,791 tokens)": lambda r: _failed(r, "tenant-isolation")}),
    # The first disconnect (cancel-transfer) wedges the engine: every later request hangs.
    "wedge-after-disconnect": ("engine-healthy-after", {
        "unified, after a client disconnect (cancel-transfer's leaver)":
            lambda r: _failed(r, "engine-healthy-after") and _stopped_answering(r)
            and _check(r, "prefix-cache-isolation").get("status") != "pass"}),
}
NOT_LISTED = {
    "leak-streamed": "not streamed: by definition; prefill/decode: PD_MATRIX",
    "leak-not-streamed": "streamed: by definition; prefill/decode: PD_MATRIX",
    "shortened-prompt": ("not streamed alone: no near-limit request is sent alone unstreamed (prompt-integrity reads the limit "
                         "prompt and the pair; shorter prompts, under 256 tokens, pass whole); prefill/decode: PD_MATRIX"),
    "tokens-then-garbage": "not streamed: a whole answer has no frames; concurrent / after a disconnect: only over-limit prompts "
                           "fire it, and they are sent alone; prefill/decode: PD_MATRIX",
    "text-with-bad-count": "streamed: tokens-then-garbage is that path's cell; concurrent / after a disconnect: only over-limit "
                           "prompts fire it, sent alone; prefill/decode: PD_MATRIX",
    "positions-overridden": "prompts within the positions (every short probe) echo by design; prefill/decode: PD_MATRIX",
    "positions-overridden-silent": "as positions-overridden; prefill/decode: PD_MATRIX",
    "attention-window": "prompts within the window (every short probe) echo by design; prefill/decode: PD_MATRIX",
    "attention-window-silent": "as attention-window; prefill/decode: PD_MATRIX",
    "pool-in-another-unit": ("under the true pool: honest by definition (every short probe is computed); after a "
                             "disconnect: no near-limit request follows one; prefill/decode: PD_MATRIX"),
    "wedge-after-disconnect": ("alone / concurrent: no disconnect precedes them (the wedge needs one); streamed or not: "
                               "after the wedge nothing is answered either way; prefill/decode: PD_MATRIX"),
}
# Faults that need an engine shape of their own: fault -> (unified engine settings, the
# prefill's settings in a trio); both with a third customer's traffic during the check.
SETUPS: dict[str, tuple[dict, dict]] = {
    "pool-in-another-unit": ({"pool_tokens": TRUE_POOL, "env": {PARALLEL_SIZE_ENV: str(UNIFIED_P)}},
                             {"prefill_pool": TRUE_POOL, "prefill_env": {PARALLEL_SIZE_ENV: str(PD_P)}}),
}
# The honest engines beside them: the pools the fault states, truly held, with the same traffic.
HONEST_SETUPS: tuple[tuple[dict, dict], ...] = (
    ({"pool_tokens": TRUE_POOL * UNIFIED_P}, {"prefill_pool": TRUE_POOL * PD_P}),
)
BACKGROUND = {"pool-in-another-unit"}  # faults checked with BackgroundTraffic running

# The same faults behind the builtin router (a prefill and a decode, context 2,048, pools 8,192,
# the transfer paced at 6 ms a batch so that cancel-transfer's disconnect lands mid-transfer):
# fault -> (the check that must fail, the prefill's faults, the decode's faults, {cell: caught?}).
# Each fault sits where a P/D deployment would have it: a leak on the decode's answer path (it
# decodes over the KV it received, its tail another tenant's); a shortened prompt in the
# prefill's prompt accounting (the prefill is the only engine that computes the prompt: it
# computes half and tells the decode the whole prompt's KV was sent, so the decode's
# received-equals-reserved check passes); the two frame faults on both roles (one engine build
# serves both): the router answers a prompt the prefill refused with the prefill's reply, so
# tokens-then-garbage reaches the client from the prefill through the router's SSE relay, and
# text-with-bad-count's 200 from the prefill sends the router on to the decode, whose bad answer
# it relays.
PD_ALONE = ALONE
PD_MATRIX = {
    "leak-streamed": ("tenant-isolation", (), ("leak-streamed",), {
        "P/D, streamed, alone (the decode's answer, behind the router)": lambda r: _crossed(r, streamed=True, where=PD_ALONE),
        "P/D, streamed, concurrent (normal's pairs sent at once)": lambda r: _crossed(r, streamed=True, where=AT_ONCE),
        "P/D, streamed, after a client disconnect (cancel-decode's streamed follower)":
            lambda r: _crossed(r, streamed=True, where=AFTER)}),
    "leak-not-streamed": ("tenant-isolation", (), ("leak-not-streamed",), {
        "P/D, not streamed, alone (the decode's answer, behind the router)": lambda r: _crossed(r, streamed=False, where=PD_ALONE),
        "P/D, not streamed, concurrent (normal's pairs sent at once)": lambda r: _crossed(r, streamed=False, where=AT_ONCE),
        "P/D, not streamed, after a client disconnect (cancel-decode's follower)":
            lambda r: _crossed(r, streamed=False, where=AFTER)}),
    "shortened-prompt": ("prompt-integrity", ("shortened-prompt",), (), {
        "P/D, streamed, alone (the limit prompt: the prefill computed half)": lambda r: _tally(r, "boundary-accept") == "short",
        "P/D, streamed and not, concurrent (the pair)": lambda r: _tally(r, "concurrent (x2)") == "short"}),
    "tokens-then-garbage": ("overcapacity-rejected", ("tokens-then-garbage",), ("tokens-then-garbage",), {
        "P/D, streamed, alone (over-context-stream: the prefill's refusal, relayed by the router)":
            lambda r: "over-context-stream" in _check(r, "overcapacity-rejected").get("message", "")
            and "does not read" in _check(r, "overcapacity-rejected").get("message", "")}),
    "text-with-bad-count": ("overcapacity-rejected", ("text-with-bad-count",), ("text-with-bad-count",), {
        "P/D, not streamed, alone (over-context: the decode's answer, relayed by the router)":
            lambda r: "its counts not readable" in _check(r, "overcapacity-rejected").get("message", "")}),
    # Issue 44. The decode's own prefix cache (SGLang's --disaggregation-decode-enable-radix-cache)
    # keyed without the salt: tenant B's repeat of tenant A's prefix hits it, the decode's counters
    # move, the answer (the prefill's figure) says cached_tokens 0.
    "decode-cache-no-salt": ("prefix-cache-isolation", (), ("decode-cache-no-salt",), {
        "P/D, cross-tenant prefix probes (full hit in the decode's lookup and cached-token counters; the answer says 0)":
            _cross_said_no_hit}),
    "decode-cache-no-salt-partial": ("prefix-cache-isolation", (), ("decode-cache-no-salt-partial",), {
        "P/D, cross-tenant prefix probes (half the prefix, in the decode's cached-token counter alone; the answer says 0)":
            _cross_said_no_hit}),
    # The model's positions and its attention window belong to the model both roles load.
    "positions-overridden": ("prompt-integrity", ("positions-overridden",), ("positions-overridden",), {
        "P/D, near-context answers past the positions (the decode's noise, behind the router)": _status_decides,
        "P/D, the engines' start-up warning read from --log": lambda r: _warning_failed(r, "derived context_length")}),
    "positions-overridden-silent": ("prompt-integrity", ("positions-overridden-silent",), ("positions-overridden-silent",), {
        "P/D, near-context answers past the positions (the decode's noise), no warning": _status_decides}),
    "attention-window": ("prompt-integrity", ("attention-window",), ("attention-window",), {
        "P/D, near-context answers copied from the last window (the decode's)": _status_decides,
        "P/D, the engines' start-up warning read from --log": lambda r: _warning_failed(r, "maxAttentionWindowVec")}),
    "attention-window-silent": ("prompt-integrity", ("attention-window-silent",), ("attention-window-silent",), {
        "P/D, near-context answers copied from the last window (the decode's), no warning": _status_decides}),
    # Issue 44: on the prefill, the only engine that computes the prompt (its true pool 1,024
    # tokens, stated 4,096): it sends the placeholder's pages as the whole prompt's KV, so the
    # decode's received-equals-reserved check passes and decodes the prefill's stale pages.
    "pool-in-another-unit": ("prompt-integrity", ("pool-in-another-unit",), (), {
        "P/D, streamed, alone (the limit prompt, over the prefill's true pool)": lambda r: _failed(r, "prompt-integrity"),
        "P/D, streamed and not, concurrent (the pair)": lambda r: _failed(r, "concurrent-capacity"),
        "P/D, not streamed, alone (boundary A B B A)": lambda r: _failed(r, "tenant-isolation")}),
    # On the decode, where the disconnect is seen (the router closes its relay when the client leaves).
    "wedge-after-disconnect": ("engine-healthy-after", (), ("wedge-after-disconnect",), {
        "P/D, after a client disconnect (cancel-transfer's leaver, the decode wedged)":
            lambda r: _failed(r, "engine-healthy-after") and _stopped_answering(r)
            and _check(r, "prefix-cache-isolation").get("status") != "pass"}),
}
PD_NOT_LISTED = {
    "leak-streamed": "not streamed: by definition",
    "leak-not-streamed": "streamed: by definition",
    "shortened-prompt": ("not streamed alone: as unified; after a disconnect: no near-limit request follows one; on the decode: "
                         "a decode computes no prompt (it reserves what it was sent and compares it with what arrived)"),
    "tokens-then-garbage": ("not streamed: no frames; concurrent / after a disconnect: only over-limit prompts, sent alone; on "
                            "the decode alone: the router answers a refused prompt from the prefill and drops the decode's reply"),
    "text-with-bad-count": ("streamed: tokens-then-garbage's cell; concurrent / after a disconnect: only over-limit prompts, sent "
                            "alone; on one role alone: the prefill's refusal (decode only) or the decode's honest 400 (prefill "
                            "only) is what the client gets, a correct rejection"),
    "decode-cache-no-salt": ("unified: a unified engine has no decode-side cache (its own cache without the salt is "
                             "prefix-cache-no-salt); on the prefill: it is the decode's cache"),
    "decode-cache-no-salt-partial": "as decode-cache-no-salt",
    "positions-overridden": "on one role alone: the model is one build on both; prompts within the positions echo by design",
    "positions-overridden-silent": "as positions-overridden",
    "attention-window": "on one role alone: the model is one build on both; prompts within the window echo by design",
    "attention-window-silent": "as attention-window",
    "pool-in-another-unit": ("on the decode: a decode computes no prompt (it reserves what the prefill says and takes "
                             "the KV sent); after a disconnect: no near-limit request follows one"),
    "wedge-after-disconnect": ("on the prefill: the cancel probes' disconnects reach the decode (the router closes the "
                               "decode's relay; the prefill's side finishes its transfer); alone / concurrent: no disconnect "
                               "precedes them"),
}
PD_TRANSFER_DELAY_MS = 6


def _run_check(entry: str, args: list[str], background: bool) -> tuple[int, dict, float]:
    """One `check` (a third customer's traffic to `entry` during it, if `background`)."""
    traffic = BackgroundTraffic(entry) if background else None
    if traffic is not None:
        traffic.start()
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", *args, "--format", "json"],
                              capture_output=True, text=True, timeout=1800)
    finally:
        if traffic is not None:
            traffic.stop()
    wall = time.monotonic() - start
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, wall


def matrix_run(faults: list[str], setup: dict | None = None, *, background: bool = False) -> tuple[int, dict, float]:
    """`setup`: the engine's settings where a fault needs its own (SETUPS), else the matrix's. The
    engine's log goes to the check (--log), so a fault that prints the engine's own warning can fail on it."""
    settings = {"pool_tokens": MATRIX_POOL, **(setup or {})}
    with tempfile.TemporaryDirectory() as workdir, unified_engine(
            Path(workdir), context_length=MATRIX_CONTEXT, faults=faults, wait_s=300, **settings) as engine:
        return _run_check(engine.url, ["--endpoint", engine.url, "--log", f"{engine.url}={engine.log_path}"], background)


def pd_matrix_run(prefill_faults: tuple[str, ...], decode_faults: tuple[str, ...], setup: dict | None = None, *,
                  background: bool = False) -> tuple[int, dict, float]:
    settings = {"prefill_pool": MATRIX_POOL, **(setup or {})}
    with tempfile.TemporaryDirectory() as workdir, pd_trio(
            Path(workdir), context_length=MATRIX_CONTEXT, decode_pool=MATRIX_POOL,
            prefill_faults=prefill_faults, decode_faults=decode_faults, page_log=False,
            prefill_args=["--transfer-delay-ms", str(PD_TRANSFER_DELAY_MS)], wait_s=300, **settings) as trio:
        return _run_check(trio.router.url, ["--endpoint", f"prefill={trio.prefill.url}", "--endpoint",
                                            f"decode={trio.decode.url}", "--entry", trio.router.url,
                                            "--log", f"{trio.prefill.url}={trio.prefill.log_path}",
                                            "--log", f"{trio.decode.url}={trio.decode.log_path}"], background)


def streamed_chances(report: dict) -> int:
    """Streamed answers read to the end with room for a canary: the chances a streamed-only leak has."""
    iso = _check(report, "tenant-isolation")
    return sum(1 for s in iso.get("evidence", {}).get("scenarios", []) for r in s.get("requests", [])
               if r.get("stream") and r.get("http_status") == 200 and "scanned" not in r)


def shown_streamed(report: dict) -> int:
    """Streamed answers read to the end that carried the other tenant's canary: with the leak
    firing on every request, the chances a streamed-only leak has to show in one run."""
    iso = _check(report, "tenant-isolation")
    return sum(1 for c in iso.get("evidence", {}).get("crossings", []) if c.get("stream") and "disconnected" not in c)


def matrix(runs: int, probability: float, *, racy_only: bool = False, only: tuple[str, ...] = ()) -> None:
    start = time.monotonic()
    if not racy_only:
        cells(only)
    code, report, _ = matrix_run(["leak-streamed"])  # firing on every request: how many answers can show it
    shown = shown_streamed(report)
    os.environ[FAULT_PROBABILITY_ENV] = str(probability)
    hits, chances = 0, []
    for run in range(runs):
        code, report, wall = matrix_run(["leak-streamed"])
        caught = _check(report, "tenant-isolation").get("status") == "fail"
        hits += caught
        chances.append(streamed_chances(report))
        print(json.dumps({"run": run + 1, "fault": "leak-streamed", "probability": probability, "caught": caught,
                          "streamed_answers": chances[-1], "wall_s": round(wall, 1)}), flush=True)
    os.environ.pop(FAULT_PROBABILITY_ENV)
    miss = (1 - probability) ** shown
    print(json.dumps({"bench": "fault matrix", "racy_fault": "leak-streamed", "probability": probability, "runs": runs,
                      "caught": hits, "streamed_answers_fewest": min(chances, default=0),
                      "streamed_answers_showing_it_at_probability_1": shown,
                      "miss_probability_per_run": round(miss, 4), "misses_expected": round(runs * miss, 3),
                      "wall_s": round(time.monotonic() - start, 1)}), flush=True)


def cells(only: tuple[str, ...] = ()) -> None:
    """Every listed cell of MATRIX and PD_MATRIX (or those of the faults `only` names), then the
    honest unified engine and trio."""
    for fault, (check_id, listed) in MATRIX.items():
        if only and fault not in only:
            continue
        code, report, wall = matrix_run([fault], SETUPS.get(fault, ({}, {}))[0], background=fault in BACKGROUND)
        status = "fail" if _failed(report, check_id) else _check(report, check_id).get("status")
        for cell, caught in listed.items():
            print(json.dumps({"fault": fault, "cell": cell, "check": check_id, "check_status": status,
                              "caught": bool(status == "fail" and caught(report)), "exit_code": code,
                              "wall_s": round(wall, 1)}), flush=True)
        print(json.dumps({"fault": fault, "not_listed": NOT_LISTED[fault]}), flush=True)
    code, report, wall = matrix_run([])
    bad = {c["id"]: c["status"] for c in report.get("checks", []) if c["status"] in ("fail", "inconclusive")}
    print(json.dumps({"fault": None, "cell": "honest engine, every cell", "exit_code": code, "failing_or_inconclusive": bad,
                      "wall_s": round(wall, 1)}), flush=True)
    for unified, _ in HONEST_SETUPS:
        code, report, wall = matrix_run([], unified, background=True)
        bad = {c["id"]: c["status"] for c in report.get("checks", []) if c["status"] in ("fail", "inconclusive")}
        print(json.dumps({"fault": None, "cell": "honest engine, a third customer's traffic during the check", "engine": unified,
                          "exit_code": code, "failing_or_inconclusive": bad, "wall_s": round(wall, 1)}), flush=True)
    for fault, (check_id, prefill_faults, decode_faults, listed) in PD_MATRIX.items():
        if only and fault not in only:
            continue
        code, report, wall = pd_matrix_run(prefill_faults, decode_faults, SETUPS.get(fault, ({}, {}))[1],
                                           background=fault in BACKGROUND)
        status = "fail" if _failed(report, check_id) else _check(report, check_id).get("status")
        for cell, caught in listed.items():
            print(json.dumps({"fault": fault, "prefill_faults": list(prefill_faults), "decode_faults": list(decode_faults),
                              "cell": cell, "check": check_id, "check_status": status,
                              "caught": bool(status == "fail" and caught(report)), "exit_code": code,
                              "wall_s": round(wall, 1)}), flush=True)
        print(json.dumps({"fault": fault, "pd_not_listed": PD_NOT_LISTED[fault]}), flush=True)
    code, report, wall = pd_matrix_run((), ())
    bad = {c["id"]: c["status"] for c in report.get("checks", []) if c["status"] in ("fail", "inconclusive")}
    print(json.dumps({"fault": None, "cell": "honest P/D trio behind the router, every cell", "exit_code": code,
                      "failing_or_inconclusive": bad, "wall_s": round(wall, 1)}), flush=True)
    for _, prefill in HONEST_SETUPS:
        code, report, wall = pd_matrix_run((), (), prefill, background=True)
        bad = {c["id"]: c["status"] for c in report.get("checks", []) if c["status"] in ("fail", "inconclusive")}
        print(json.dumps({"fault": None, "cell": "honest P/D trio, a third customer's traffic during the check",
                          "prefill": prefill, "exit_code": code, "failing_or_inconclusive": bad, "wall_s": round(wall, 1)}),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--matrix", action="store_true", help="issue 26's fault matrix (see the module docstring)")
    parser.add_argument("--racy-only", action="store_true", help="with --matrix: only the racy-leak runs")
    parser.add_argument("--only", action="append", default=[], choices=sorted(MATRIX.keys() | PD_MATRIX.keys()),
                        help="with --matrix: only this fault's rows (repeatable)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--probability", type=float, default=0.3)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the tree whose `kvpreflight check` probes")
    parser.add_argument("--label", default="", help="what --checkout is (default: its git commit)")
    args = parser.parse_args()
    if args.matrix:
        matrix(args.runs, args.probability, racy_only=args.racy_only, only=tuple(args.only))
        return
    os.environ[FAULT_PROBABILITY_ENV] = str(args.probability)  # the engines inherit it
    checkout = args.checkout.resolve()
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or args.label
    hits = 0
    for run in range(args.runs):
        result = one(checkout, args.context)
        hits += bool(result["detected"])
        print(json.dumps({"run": run + 1, **result}), flush=True)
    print(json.dumps({"bench": "racy-leak detection", "fault": FAULT, "probability": args.probability,
                      "context": args.context, "checkout": str(checkout), "commit": args.label or commit,
                      "runs": args.runs, "detected": hits, "rate": round(hits / args.runs, 2)}), flush=True)


if __name__ == "__main__":
    main()
