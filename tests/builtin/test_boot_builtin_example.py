"""Boot mode from the shipped builtin P/D example spec, unchanged: the builtin prefill, decode and
router as real processes, serving through the router, and nothing left behind."""

from __future__ import annotations

import io
import json
import urllib.request
from pathlib import Path

from boot_support.procs import group_members, live_pids

from kvpreflight.boot import boot_deployment, load_spec

SPECS = Path(__file__).parents[2] / "examples" / "specs"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def test_builtin_pd_example_boots_and_serves_through_the_router(tmp_path):
    stderr = io.StringIO()
    with boot_deployment(load_spec(SPECS / "builtin-pd.yaml"), tmp_path, stderr=stderr) as deployment:
        pids = set().union(*(e.process_ids() for e in deployment.engines))
        assert [(e.name, e.role, e.engine) for e in deployment.engines] == [
            ("prefill", "prefill", "builtin"), ("decode", "decode", "builtin"), ("router", "router", "builtin")]
        assert deployment.entry_url == deployment.engine("router").url
        request = urllib.request.Request(
            deployment.entry_url + "/generate", headers={"Content-Type": "application/json"},
            data=json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 3}}).encode())
        with NO_PROXY.open(request, timeout=30) as response:
            body = json.loads(response.read())
        assert body["meta_info"]["completion_tokens"] == 3
        for name in ("prefill", "decode"):
            log = Path(deployment.log_files[deployment.engine(name).url]).read_text()
            assert "KV Cache is allocated. dtype: torch.float32, #tokens: 8192" in log
    assert "all engines stopped" in stderr.getvalue()
    assert pids and not pids & live_pids()
    assert not any(group_members(e.pid) for e in deployment.engines)
