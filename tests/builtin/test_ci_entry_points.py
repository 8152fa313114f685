"""The CI entry points a platform team wires in: the GitHub Action at the repository root
(action.yml, run here step by step with bash as a runner would: inputs as INPUT_* in each step's
env, GITHUB_OUTPUT / GITHUB_ENV / GITHUB_PATH / GITHUB_STEP_SUMMARY as files) and the pre-commit
hook (.pre-commit-hooks.yaml, by a config that names this checkout, run by pre-commit in a fresh venv)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "tests/fixtures/review/models/DeepSeek-V3"
INCIDENT = "examples/review/incident-pd-lws.yaml"
FIXED = "examples/review/incident-pd-lws.fixed.yaml"
EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def action() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "action.yml").read_text())


def test_every_run_step_reads_its_inputs_from_env_never_from_an_expression_in_the_script() -> None:
    spec = action()
    assert spec["runs"]["using"] == "composite"
    runs = [step for step in spec["runs"]["steps"] if "run" in step]
    assert runs and all(step["shell"] == "bash" for step in runs)
    for step in runs:
        assert "${{" not in step["run"], step["name"]  # an input cannot inject shell code
        for value in step.get("env", {}).values():
            assert EXPRESSION.fullmatch(value), value
    upload = next(step for step in spec["runs"]["steps"] if step.get("uses", "").startswith("actions/upload-artifact"))
    assert "${{ inputs.report }}" in upload["with"]["path"] and "${{ inputs.record }}" in upload["with"]["path"]


class Runner:
    """Runs the action's `run:` steps as GitHub's runner does, in one workspace."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.files = {name: workdir / name.lower() for name in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}
        self.env = {**os.environ, "GITHUB_ACTIONS": "true", "RUNNER_TEMP": str(workdir / "runner-temp"),
                    **{name: str(path) for name, path in self.files.items()}}
        (workdir / "runner-temp").mkdir()
        for path in self.files.values():
            path.touch()

    def run(self, step: dict[str, Any], inputs: dict[str, str]) -> subprocess.CompletedProcess[str]:
        def resolve(value: str) -> str:
            expression = EXPRESSION.fullmatch(value)
            assert expression, value
            name = expression.group(1)
            if name == "github.action_path":
                return str(ROOT)
            assert name.startswith("inputs."), name
            return inputs[name.removeprefix("inputs.")]

        for path in (self.files["GITHUB_OUTPUT"], self.files["GITHUB_STEP_SUMMARY"]):
            path.write_text("")
        env = {**self.env, **{k: resolve(v) for k, v in step.get("env", {}).items()}}
        # As GitHub runs a composite step's `shell: bash`: bash --noprofile --norc -eo pipefail {0}
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        # What the runner does between steps: GITHUB_ENV and GITHUB_PATH reach the next ones.
        for line in self.files["GITHUB_ENV"].read_text().splitlines():
            key, _, value = line.partition("=")
            self.env[key] = value
        for line in self.files["GITHUB_PATH"].read_text().splitlines():
            self.env["PATH"] = f"{line}:{self.env['PATH']}"
        return proc

    def outputs(self) -> dict[str, str]:
        return dict(line.partition("=")[::2] for line in self.files["GITHUB_OUTPUT"].read_text().splitlines())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    runner = Runner(tmp_path_factory.mktemp("runner"))
    install = next(step for step in action()["runs"]["steps"] if step.get("name") == "Install kvpreflight")
    proc = runner.run(install, defaults())
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield runner


def defaults() -> dict[str, str]:
    return {name: str(spec.get("default", "")) for name, spec in action()["inputs"].items()}


@pytest.mark.xdist_group("action-install")  # one worker installs the action once (--dist loadgroup)
@pytest.mark.parametrize(("manifest", "verdict", "code"), [(INCIDENT, "fail", 1), (FIXED, "pass", 0)])
def test_the_action_reviews_a_manifest_and_writes_outputs_report_and_summary(installed: Runner, tmp_path: Path,
                                                                            manifest: str, verdict: str, code: int) -> None:
    step = next(step for step in action()["runs"]["steps"] if step.get("id") == "run")
    report = tmp_path / "report.json"
    inputs = {**defaults(), "command": "review", "args": f"--model-dir '{MODEL_DIR}' {manifest}", "report": str(report)}
    proc = installed.run(step, inputs)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert installed.outputs() == {"verdict": verdict, "exit-code": str(code), "report": str(report)}
    assert json.loads(report.read_text())["verdict"] == verdict
    summary = installed.files["GITHUB_STEP_SUMMARY"].read_text()
    assert f"kvpreflight: {verdict.upper()}" in summary
    if code:
        assert "::error" in proc.stderr  # annotations for the runner


@pytest.mark.xdist_group("action-install")
def test_the_action_refuses_args_it_cannot_split_and_an_unknown_command(installed: Runner) -> None:
    step = next(step for step in action()["runs"]["steps"] if step.get("id") == "run")
    proc = installed.run(step, {**defaults(), "command": "review", "args": "--model-dir 'unclosed"})
    assert proc.returncode == 2 and "cannot be split into arguments" in proc.stdout
    proc = installed.run(step, {**defaults(), "command": "rm -rf /", "args": FIXED})
    assert proc.returncode == 2 and "input command must be check or review" in proc.stdout


@pytest.fixture(scope="module")
def pre_commit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """pre-commit in a fresh venv, and a config naming this checkout as a user's names the hook
    (repo and rev): the working tree committed to a throwaway repository, as `pre-commit try-repo`
    does, but once, so both manifests run in the one hook environment pre-commit installs for
    that rev (try-repo installs kvpreflight anew on every call: ~25 s each on 2 cores)."""
    base = tmp_path_factory.mktemp("pre-commit")
    venv, shadow = base / "venv", base / "repo"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "pre-commit"], check=True, timeout=600)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True, text=True, timeout=60).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (shadow / name).parent.mkdir(parents=True, exist_ok=True)
            (shadow / name).write_bytes((ROOT / name).read_bytes())
    git = ["git", "-c", "user.name=kvpreflight-test", "-c", "user.email=test@localhost", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the working tree"]):
        subprocess.run([*git, *args], cwd=shadow, check=True, timeout=120)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=shadow, check=True, capture_output=True, text=True).stdout.strip()
    config = base / "pre-commit-config.yaml"
    config.write_text(yaml.safe_dump({"repos": [{"repo": str(shadow), "rev": rev, "hooks": [{"id": "kvpreflight-review"}]}]}))
    yield venv / "bin" / "pre-commit", config


@pytest.mark.xdist_group("pre-commit")  # one worker installs the hook environment once
@pytest.mark.parametrize(("manifest", "code"), [(FIXED, 0), (INCIDENT, 1)])
def test_the_pre_commit_hook_passes_the_fixed_manifest_and_fails_the_incident(pre_commit: tuple[Path, Path],
                                                                             tmp_path_factory: pytest.TempPathFactory,
                                                                             manifest: str, code: int) -> None:
    binary, config = pre_commit
    home = tmp_path_factory.getbasetemp() / "pre-commit-home"
    proc = subprocess.run([str(binary), "run", "--config", str(config), "kvpreflight-review", "--files", manifest],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PRE_COMMIT_HOME": str(home), "KVPREFLIGHT_MODEL_DIR": str(MODEL_DIR)})
    assert proc.returncode == code, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert ("Passed" if code == 0 else "Failed") in proc.stdout


def test_the_example_pr_workflow_review_step_annotates_and_writes_the_comment(tmp_path):
    """Run the workflow's own review step (examples/ci/review-pr.yml) as the runner would."""
    import shutil

    import yaml

    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "review-pr.yml").read_text())
    (step,) = [s for s in workflow["jobs"]["review"]["steps"] if s.get("id") == "review"]
    shutil.copytree(MODEL_DIR, tmp_path / "models" / "DeepSeek-V3")
    (tmp_path / "deploy").mkdir()
    shutil.copy(ROOT / INCIDENT, tmp_path / "deploy" / "pd.yaml")
    (tmp_path / "changed.txt").write_text("deploy/pd.yaml\n")
    out = tmp_path / "github_output"
    env = {**os.environ, "GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": str(out),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-c", step["run"]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert out.read_text().strip() == "rc=1"
    assert "::error file=deploy/pd.yaml,line=27" in r.stdout
    assert "681,512" in (tmp_path / "review.md").read_text()
