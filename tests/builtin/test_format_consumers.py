"""Every output format fed to the real program that consumes it (issue 29): node_exporter's textfile
collector and promtool for `--format prometheus` and the shipped alert rules, Sarif.Multitool's
GitHub rules for `--format sarif`, actionlint (with shellcheck) and zizmor for the example
workflows and action.yml. Each consumer comes from scripts/setup_consumers.sh; a missing one fails.

Two builtin engines, started once for the module: one whose pool holds its context ("sized") and one
whose pool does not ("undersized"); `check --capacity-only` reads each (in-process CLI, no request
sent to the engines).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.builtin_testbed import RunningEngine, start_engine, stop_engine
from support.cli import invoke
from support.consumers import consumer, run_consumer

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "examples" / "prometheus" / "kvpreflight.rules.yml"
WORKFLOWS = sorted((REPO / "examples" / "ci").glob("*.yml"))


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> Iterator[dict[str, RunningEngine]]:
    workdir = tmp_path_factory.mktemp("consumers")
    sizes = {"sized": (2048, 4096), "undersized": (4096, 2048)}  # (context, pool) in tokens
    with ThreadPoolExecutor(2) as pool:  # both start at once: half the wait
        futures = {name: pool.submit(start_engine, "unified", workdir, name=name, context_length=ctx, pool_tokens=tokens)
                   for name, (ctx, tokens) in sizes.items()}
    started = {name: f.result() for name, f in futures.items() if f.exception() is None}
    try:
        for f in futures.values():
            if f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        yield started
    finally:
        for engine in started.values():
            stop_engine(engine)


def check(engine: RunningEngine, *args: str) -> tuple[int, str]:
    done = invoke("check", "--endpoint", engine.url, "--capacity-only", *args)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout


@pytest.fixture(scope="module")
def prom_files(engines, tmp_path_factory) -> dict[str, Path]:
    """Each deployment's .prom file, as a timer per deployment writes them into one textfile folder."""
    folder = tmp_path_factory.mktemp("textfile")
    files = {}
    for name, engine in engines.items():
        code, _ = check(engine, "--name", name, "--format", "prometheus", "--output", str(folder / f"kvpreflight-{name}.prom"))
        assert code == (0 if name == "sized" else 1), name
        files[name] = folder / f"kvpreflight-{name}.prom"
    return files


def samples(text: str, metric: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples if s.name == metric]


# -- node_exporter: one collector, two deployments -----------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def node_exporter(textfile_dir: Path, log: Path) -> Iterator[str]:
    """Debian's prometheus-node-exporter, textfile collector only, on a loopback port; stopped by PID."""
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([consumer("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{port}",
                                 "--collector.disable-defaults", "--collector.textfile",
                                 f"--collector.textfile.directory={textfile_dir}"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"node_exporter exited with {proc.returncode}: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"node_exporter did not answer on {url}: {log.read_text()[-2000:]}"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_one_node_exporter_serves_both_deployments_verdicts(prom_files, tmp_path):
    folder = prom_files["sized"].parent
    with node_exporter(folder, tmp_path / "node_exporter.log") as url:
        with urllib.request.urlopen(url, timeout=10) as reply:
            served = reply.read().decode()
    log = (tmp_path / "node_exporter.log").read_text()
    assert "was collected before" not in log and "error" not in log.lower(), log
    verdicts = {labels["deployment"]: value for labels, value in samples(served, "kvpreflight_verdict")}
    assert verdicts == {"sized": 0.0, "undersized": 4.0}  # the failing deployment is not hidden by the pass
    # node_exporter flags a file it could not read with node_textfile_scrape_error 1
    assert samples(served, "node_textfile_scrape_error") == [({}, 0.0)]
    pools = {labels["deployment"]: value for labels, value in samples(served, "kvpreflight_kv_pool_tokens")}
    assert pools == {"sized": 4096.0, "undersized": 2048.0}


# -- promtool: the shipped alert rules fire on the undersized engine only --------------------------

def _input_series(files: dict[str, Path], *, stale: bool) -> list[dict[str, str]]:
    series = []
    for path in files.values():
        for family in text_string_to_metric_families(path.read_text()):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                value = 0 if stale and s.name == "kvpreflight_last_run_timestamp_seconds" else s.value
                series.append({"series": f"{s.name}{{{labels}}}", "values": f"{value:.17g}+0x300"})
    return series


def test_promtool_fires_the_shipped_alerts_on_the_undersized_engine_only(prom_files, engines, tmp_path):
    assert "promtool check rules" in RULES.read_text()
    checked = run_consumer("promtool", "check", "rules", RULES)
    assert checked.returncode == 0 and "7 rules found" in checked.stdout, checked.stdout + checked.stderr
    undersized = engines["undersized"].url
    fired = {"deployment": "undersized", "severity": "critical"}
    tests = [
        {   # fresh files: pool under context and the failed verdict fire for "undersized", nothing for "sized"
            "interval": "1m",
            "input_series": _input_series(prom_files, stale=False),
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "KvpreflightPoolUnderContext", "exp_alerts": [{
                    "exp_labels": {**fired, "endpoint": undersized, "role": "unified"},
                    "exp_annotations": {"summary": f"undersized: the unified engine {undersized} has a KV pool of 2048 "
                                                   "tokens, under the context it must hold"}}]},
                {"eval_time": "10m", "alertname": "KvpreflightVerdictNotPass", "exp_alerts": [{
                    "exp_labels": fired,
                    "exp_annotations": {"summary": "undersized: the last kvpreflight run was not a pass "
                                                   "(3 inconclusive, 4 fail): 4"}}]},
                {"eval_time": "10m", "alertname": "KvpreflightRunStale", "exp_alerts": []},
            ],
        },
        {   # the runs stopped (their last timestamps are the epoch): stale fires for both, four hours on
            "interval": "1m",
            "input_series": _input_series(prom_files, stale=True),
            "alert_rule_test": [
                {"eval_time": "4h", "alertname": "KvpreflightRunStale", "exp_alerts": [
                    {"exp_labels": {"deployment": name, "severity": "warning"},
                     "exp_annotations": {"summary": f"{name}: no kvpreflight run has finished for 4h 0m 0s"}}
                    for name in ("sized", "undersized")]},
            ],
        },
    ]
    test_file = tmp_path / "kvpreflight.rules.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    result = run_consumer("promtool", "test", "rules", test_file)
    assert result.returncode == 0 and "SUCCESS" in result.stdout + result.stderr, result.stdout + result.stderr


# -- Sarif.Multitool with GitHub's rules -----------------------------------------------------------

def sarif_errors(path: Path, tmp_path: Path) -> list[str]:
    """Sarif.Multitool `validate` with the GitHub (Gh) and SARIF rule sets: every error it reports."""
    out = tmp_path / f"{path.stem}.validation.sarif"
    done = run_consumer("sarif-multitool", "validate", "--rule-kind", "Gh;Sarif", "-o", out, path)
    assert out.exists(), done.stdout + done.stderr
    results = json.loads(out.read_text())["runs"][0].get("results", [])
    return [f"{r['ruleId']}: {r['message'].get('text') or r['message'].get('arguments')}" for r in results
            if r.get("level", "warning") == "error"]


def test_check_sarif_passes_githubs_rules_with_a_physical_location_on_every_result(engines, tmp_path):
    path = tmp_path / "check.sarif"
    code, _ = check(engines["undersized"], "--name", "undersized", "--format", "sarif", "--output", str(path))
    assert code == 1
    log = json.loads(path.read_text())
    results = log["runs"][0]["results"]
    assert results and all(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results)
    assert sarif_errors(path, tmp_path) == []


def test_review_sarif_passes_githubs_rules(tmp_path):
    path = tmp_path / "review.sarif"
    done = invoke("review", "--format", "sarif", "--output", path, REPO / "examples" / "review" / "incident-pd-lws.yaml",
                  "--model-dir", REPO / "tests" / "fixtures" / "review" / "models" / "DeepSeek-V3")
    assert path.exists(), done.stderr
    assert json.loads(path.read_text())["runs"][0]["results"], "the incident file must give findings"
    assert sarif_errors(path, tmp_path) == []


# -- actionlint (with shellcheck) and zizmor on the workflows users copy ----------------------------

def test_actionlint_with_shellcheck_passes_the_example_workflows_and_shellcheck_the_actions_scripts(tmp_path):
    assert len(WORKFLOWS) >= 4, WORKFLOWS
    config = REPO / "examples" / "ci" / "actionlint.yaml"  # the self-hosted `gpu` runner label
    done = run_consumer("actionlint", "-config-file", config, "-shellcheck", consumer("shellcheck"), *WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr
    # actionlint reads workflows only: action.yml's scripts go to shellcheck as the runner runs them
    steps = [s for s in yaml.safe_load((REPO / "action.yml").read_text())["runs"]["steps"] if "run" in s]
    assert len(steps) >= 2
    for i, step in enumerate(steps):
        script = tmp_path / f"step{i}.sh"
        script.write_text(step["run"])
        done = run_consumer("shellcheck", "--shell=bash", script)
        assert done.returncode == 0, f"{step['name']}: {done.stdout}"


def test_zizmor_finds_nothing_at_medium_or_above_in_the_workflows_and_the_action():
    done = run_consumer("zizmor", "--offline", "--min-severity", "medium", "--format", "plain", *WORKFLOWS, REPO / "action.yml")
    assert done.returncode == 0, done.stdout + done.stderr
