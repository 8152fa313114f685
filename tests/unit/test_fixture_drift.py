"""tests/support/fixture_drift.py, which the real tier compares recorded SGLang fixtures with live
answers by: each kind of drift is named, and what is no drift is not."""

from __future__ import annotations

import re

from support.fixture_drift import json_drift, lines_drift, metrics_drift


def test_a_field_missing_or_of_another_type_is_named_by_its_path():
    recorded = {"max_total_num_tokens": 681280, "internal_states": [{"memory_usage": {"token_capacity": 1}}],
                "max_total_tokens": None, "status": "ok"}
    live = {"max_total_num_tokens": "9216", "internal_states": [{}], "max_total_tokens": 9216, "status": "ok", "extra": 1}
    assert json_drift(recorded, live) == [
        "/max_total_num_tokens: recorded number 681280, live sent str '9216'",
        "/internal_states[0]/memory_usage: recorded, not sent live",
    ]


def test_a_series_missing_or_with_fewer_labels_is_named_and_a_lazy_counter_is_not():
    recorded = ('# TYPE a gauge\na{tp_rank="0",engine_type="prefill"} 1.0\nb_total{x="1"} 0.0\nc 1\n')
    live = 'a{engine_type="prefill"} 2.0\nc 3\nd 4\n'
    assert metrics_drift(recorded, live, absent_until_counted=["b_total"]) == [
        "a: recorded labels ['tp_rank'] not sent live (live: ['engine_type'])"]
    assert metrics_drift(recorded, live) == ["a: recorded labels ['tp_rank'] not sent live (live: ['engine_type'])",
                                             "b_total: recorded, not sent live"]


def test_a_log_pattern_that_reads_the_recording_but_no_live_line_is_named():
    patterns = {"pool": re.compile(r"#tokens: \d+"), "never": re.compile("nowhere")}
    assert lines_drift(patterns, "[TP0] #tokens: 5", "[x] #tokens: 7") == []
    assert lines_drift(patterns, "[TP0] #tokens: 5", "[x] tokens 7") == ["pool: matches the recorded log, no line of the live log"]
