"""Counter deltas are typed (CounterDelta): a counter not read at both ends of a window stays
unknown (None), never 0, from the engine's reading to the report's evidence; and a misspelt
counter is an error, not a counter that silently reads as unknown."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvpreflight._internal.engines.interface import Counters
from kvpreflight._internal.probes.engine_state import counter_deltas
from kvpreflight._internal.probes.results import counter_moved, deltas_evidence
from kvpreflight.model import CounterDelta, CounterField, CounterValues

ROOT = Path(__file__).resolve().parents[2]
STILL, BLIND, GONE = "http://still:1", "http://blind:2", "http://gone:3"


def window() -> dict[str, CounterDelta]:
    """Three engines over one window: one counts late reads and saw none, one has no such counter,
    one could not be read at the end."""
    before = {STILL: Counters(requests=4, stale_kv_reads=2), BLIND: Counters(requests=4), GONE: Counters(requests=4)}
    after = {STILL: Counters(requests=5, stale_kv_reads=2), BLIND: Counters(requests=5), GONE: None}
    return counter_deltas(before, after)


def test_a_counter_that_did_not_move_reads_0_and_one_the_engine_lacks_reads_unknown():
    deltas = window()
    assert deltas[STILL].stale_kv_reads == 0.0 and deltas[BLIND].stale_kv_reads is None
    assert GONE not in deltas  # not read at the end: nothing is known of it, not that it was idle
    assert deltas[BLIND].get(CounterField.STALE_KV_READS) is None and deltas[STILL].get(CounterField.STALE_KV_READS) == 0.0
    assert counter_moved(deltas, CounterField.STALE_KV_READS) == {}  # neither moved up


def test_the_evidence_quotes_a_still_counter_as_0_and_leaves_an_unknown_one_out():
    evidence = json.loads(json.dumps(deltas_evidence(window())))
    assert evidence == {STILL: {"requests": 1.0, "stale_kv_reads": 0.0}, BLIND: {"requests": 1.0}}


def test_the_evidence_keeps_the_counters_order_and_the_engines_extra_counters_last():
    delta = Counters(kv_transfers=3, requests=9, extra={"kv_transfer_seconds_sum": 1.5}).deltas_since(
        Counters(kv_transfers=1, requests=2, extra={"kv_transfer_seconds_sum": 0.5}))
    assert list(delta.known().items()) == [("requests", 7.0), ("kv_transfers", 2.0), ("kv_transfer_seconds_sum", 1.0)]
    assert delta.transfer_seconds == 1.0 and delta.transfers_timed is None


def test_a_misspelt_counter_is_an_error_not_an_unknown_counter():
    delta = CounterDelta(cached_prompt_tokens=12.0)
    with pytest.raises(AttributeError):
        delta.cached_promt_tokens  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ValueError, match="cached_promt_tokens"):
        delta.get("cached_promt_tokens")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CounterDelta(cached_promt_tokens=12.0)  # type: ignore[call-arg]


def test_mypy_refuses_a_misspelt_counter_and_a_counter_named_by_a_plain_string(tmp_path):
    api = pytest.importorskip("mypy.api")
    sample = tmp_path / "reads.py"
    sample.write_text("from kvpreflight.model import CounterDelta, CounterField\n"
                      "d = CounterDelta(cached_prompt_tokens=1.0)\n"
                      "ok: float | None = d.cached_prompt_tokens\n"
                      "also: float | None = d.get(CounterField.CACHED_PROMPT_TOKENS)\n"
                      "typo = d.cached_promt_tokens\n"
                      "by_string = d.get('cached_prompt_tokens')\n")
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {ROOT}\n")
    out, _, status = api.run(["--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), "--no-error-summary",
                              str(sample)])
    errors = [line.split(": error: ")[0].rsplit(":", 1)[1] for line in out.splitlines() if ": error: " in line]
    assert status == 1 and errors == ["5", "6"], out


def test_each_counter_field_is_a_field_of_the_counters_and_of_their_deltas():
    # one declaration (CounterValues) behind both the readings and the deltas
    names = [f.name for f in dataclasses.fields(CounterValues)]
    assert names == [f.value for f in CounterField]
    assert {f.name for f in dataclasses.fields(Counters)} == {*names, "used_tokens", "extra"}
    assert {f.name for f in dataclasses.fields(CounterDelta)} == {*names, "extra"}


def test_a_scenario_over_several_windows_knows_a_counter_only_where_every_window_read_it():
    """A carried scenario sums its probes' windows. A window that could not read a counter (or an
    engine) once let the other windows' sum stand as the whole, a smaller figure than moved: a
    stale read in the unread window disappeared. Now what one window missed stays unknown."""
    from kvpreflight._internal.probes.isolation import over_windows

    seen = {STILL: CounterDelta.of({CounterField.STALE_KV_READS: 0.0, CounterField.REQUESTS: 1.0}),
            BLIND: CounterDelta.of({CounterField.REQUESTS: 1.0})}
    missed = {STILL: CounterDelta.of({CounterField.REQUESTS: 2.0})}  # STILL's stale reads unread, BLIND not read at all
    summed = over_windows([seen, missed])
    assert summed[STILL].requests == 3.0 and summed[STILL].stale_kv_reads is None
    assert BLIND not in summed
    both = over_windows([seen, seen])
    assert both[STILL].stale_kv_reads == 0.0 and both[BLIND].requests == 2.0
    assert over_windows([]) == {}
