"""`kvpreflight check --boot SPEC` with real vLLM: boot, check, stop, and nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import realengines
import yaml
from support.boot_check import boot_check, spec_file

ROOT = Path(__file__).resolve().parents[2]


def test_vllm_example_spec_is_booted_checked_and_stopped(tmp_path, echo_hf_model):
    """examples/specs/vllm-single.yaml as a user runs it (from a folder holding ./models/echo/hf,
    vLLM's python3 first on PATH), with -O0 --enforce-eager added: they only shorten start-up on
    this CPU (35 s instead of 70 s). One vLLM start for both the boot and the check assertions."""
    (tmp_path / "models" / "echo").mkdir(parents=True)
    (tmp_path / "models" / "echo" / "hf").symlink_to(echo_hf_model)
    raw = yaml.safe_load((ROOT / "examples" / "specs" / "vllm-single.yaml").read_text())
    raw["engines"][0]["command"] += " -O0 --enforce-eager"
    raw["engines"][0]["env"] |= realengines.vllm_env(tmp_path / "vllm")  # short ZMQ socket folder, caches under tmp
    spec = spec_file(tmp_path, raw["engines"], context_length=raw["context_length"])
    path = os.pathsep.join([str(Path(realengines.vllm_python()).parent), os.environ["PATH"]])
    proc, report = boot_check(spec, tmp_path, "--skip", "max-tokens-clamp", "--reason", "vLLM clamps max_tokens by design",
                              cwd=tmp_path, extra_env={"PATH": path})
    assert report is not None, proc.stderr[-2000:]
    checks = {c["id"]: c for c in report["checks"]}
    (engine,) = report["engines"]
    assert engine["engine"] == "vllm" and engine["context_length"] == 4096
    assert "vllm ready after" in proc.stderr and "all engines stopped" in proc.stderr
    assert checks["kv-capacity"]["status"] == "pass"
    assert checks["kv-sources-agree"]["status"] == "pass"  # the captured log is the second origin
    assert checks["overcapacity-rejected"]["status"] == "pass"
    assert checks["max-tokens-clamp"]["status"] == "skip" and "by design" in checks["max-tokens-clamp"]["message"]
    # boot_check asserted that no process of the run (vLLM's engine core included) is left
