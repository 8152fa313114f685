"""Every usage or configuration problem is found before any engine is contacted or booted: one line,
exit 2, no report on stdout, no request seen by the engine, no engine process started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from static_server import static_server
from support.cli import invoke

KVPF = [sys.executable, "-m", "kvpreflight"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return invoke(*args, cwd=cwd, env_exact={k: v for k, v in os.environ.items() if k != "KVPREFLIGHT_SIGN_KEY"})


def assert_refused_early(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-800:])
    assert proc.stdout == ""  # no report
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvpreflight: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    invoke("keygen", "--out", str(folder), check_ok=True)
    return folder / "kvpreflight.key"


def test_a_record_without_any_subject_is_refused_before_the_engine_is_contacted(tmp_path: Path, keys: Path) -> None:
    with static_server({}) as url:
        proc = run("check", "--endpoint", url, "--record", str(tmp_path / "r.json"), "--sign-key", str(keys))
        seen = list(static_server.seen)  # type: ignore[attr-defined]
    assert_refused_early(proc, "at least one subject", "--subject")
    assert seen == [] and not (tmp_path / "r.json").exists()


def test_an_unknown_waiver_id_is_refused_before_the_engine_is_contacted() -> None:
    with static_server({}) as url:
        proc = run("check", "--endpoint", url, "--skip", "kv-capacty", "--reason", "typo")
        seen = list(static_server.seen)  # type: ignore[attr-defined]
    assert_refused_early(proc, "--skip", "kv-capacty", "no such check")
    assert seen == []


def test_a_malformed_advisory_folder_is_exit_2_in_one_line_before_any_request(tmp_path: Path) -> None:
    folder = tmp_path / "advisories"
    folder.mkdir()
    (folder / "broken.yaml").write_text("- id: X\n  engine: [unclosed\n")
    with static_server({}) as url:
        proc = run("check", "--endpoint", url, "--advisories", str(folder))
        seen = list(static_server.seen)  # type: ignore[attr-defined]
    assert_refused_early(proc, "broken.yaml")
    assert "Traceback" not in proc.stderr and seen == []


def _spec(tmp_path: Path, marker: Path, **extra: object) -> Path:
    # The "engine" would create `marker` if it were ever started.
    spec = {
        "deployment": "never-booted",
        "engines": [{"name": "solo", "role": "unified", "port": "auto",
                     "command": [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]}],
        **extra,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("extra,fragments", [
    ({"checks": {"skip": [{"id": "isolation.cancel", "reason": "no cancel here"}]}}, ["checks.skip[0].id", "isolation.cancel"]),
    ({"checks": {"boundary": {"n": 3}}}, ["checks.boundary", "unknown key"]),
    ({"contex_length": 4096}, ["contex_length", "unknown key"]),
])
def test_a_boot_spec_with_an_unknown_key_or_check_id_boots_nothing(tmp_path: Path, extra: dict, fragments: list[str]) -> None:
    marker = tmp_path / "started"
    proc = run("check", "--boot", str(_spec(tmp_path, marker, **extra)), "--log-dir", str(tmp_path / "logs"))
    assert_refused_early(proc, *fragments)
    assert not marker.exists() and not (tmp_path / "logs").exists()


def test_a_record_problem_in_boot_mode_boots_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    proc = run("check", "--boot", str(_spec(tmp_path, marker)), "--log-dir", str(tmp_path / "logs"),
               "--record", str(tmp_path / "r.json"))
    assert_refused_early(proc, "--sign-key")
    assert not marker.exists()


@pytest.mark.parametrize("args,env,fragments", [
    (["--api-key-env", "KVPF_SHORT"], {"KVPF_SHORT": "abc"}, ["KVPF_SHORT", "shorter than 8"]),
    (["--header", "X-Gateway-Token: short"], {}, ["X-Gateway-Token", "shorter than 8"]),
    (["--header", "X-Tenant-Pin: 1234", "--secret-header", "x-tenant-pin"], {}, ["X-Tenant-Pin", "shorter than 8"]),
])
def test_a_secret_too_short_to_scrub_by_value_is_refused(args: list[str], env: dict[str, str], fragments: list[str]) -> None:
    with static_server({}) as url:
        proc = invoke("check", "--endpoint", url, *args, env=env)
        seen = list(static_server.seen)  # type: ignore[attr-defined]
    assert_refused_early(proc, *fragments)
    assert seen == [] and "abc" not in proc.stderr and "1234" not in proc.stderr


@pytest.mark.parametrize("args,fragments", [
    (["--client-cert", "/nonexistent/client.pem"], ["--client-cert"]),
    (["--client-key", "/nonexistent/client.key"], ["--client-key needs --client-cert"]),
])
def test_client_certificate_problems_are_found_before_any_request(args: list[str], fragments: list[str]) -> None:
    with static_server({}) as url:
        proc = run("check", "--endpoint", url, *args)
        seen = list(static_server.seen)  # type: ignore[attr-defined]
    assert_refused_early(proc, *fragments)
    assert seen == [] and "/nonexistent/client.pem" not in proc.stderr


def test_ctrl_c_says_what_it_stopped_and_exits_130(monkeypatch) -> None:
    import kvpreflight.preflight

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(kvpreflight.preflight, "run", interrupted)
    result = invoke("check", "--endpoint", "http://127.0.0.1:9")
    assert result.returncode == 130, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("kvpreflight: error:")]
    assert "interrupted (Ctrl-C)" in line and "every engine it started has been stopped" in line
    assert "Traceback" not in result.stderr


def test_keep_without_boot_is_a_usage_error() -> None:
    result = invoke("check", "--endpoint", "http://127.0.0.1:9", "--keep")
    assert result.returncode == 2 and "--keep only makes sense with --boot SPEC.yaml" in result.stderr


def _unwritable(tmp_path: Path, where: str) -> Path:
    """A path no report or record can be written to, even by root."""
    if where == "under a file":
        (tmp_path / "a-file").write_text("x")
        return tmp_path / "a-file" / "out.json"
    if where == "a folder":
        (tmp_path / "a-folder").mkdir()
        return tmp_path / "a-folder"
    return Path("/proc/kvpreflight-out.json")  # a folder that takes no new file


@pytest.mark.parametrize("where", ["under a file", "a folder", "in /proc"])
@pytest.mark.parametrize("flag", ["--output", "--record", "--test-result"])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_request(tmp_path: Path, keys: Path, flag: str,
                                                                            where: str) -> None:
    bad = _unwritable(tmp_path, where)
    paths = {"--output": tmp_path / "report.json", "--record": tmp_path / "r.dsse.json", "--test-result": tmp_path / "t.json"}
    paths[flag] = bad
    with static_server({}) as url:
        proc = run("check", "--endpoint", url, "--output", str(paths["--output"]), "--record", str(paths["--record"]),
                   "--test-result", str(paths["--test-result"]), "--sign-key", str(keys), "--subject", "app=sha256:" + "a" * 64)
        seen = list(static_server.seen)  # type: ignore[attr-defined]
    assert_refused_early(proc, flag, str(bad))
    assert seen == [] and not any(p.exists() for p in paths.values() if p != bad)


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_signing_key_others_can_read_is_refused_before_any_request(tmp_path: Path, keys: Path, mode: int) -> None:
    key = tmp_path / "shared.key"
    key.write_bytes(keys.read_bytes())
    key.chmod(mode)
    with static_server({}) as url:
        proc = run("check", "--endpoint", url, "--record", str(tmp_path / "r.json"), "--sign-key", str(key),
                   "--subject", "app=sha256:" + "a" * 64)
        seen = list(static_server.seen)  # type: ignore[attr-defined]
    assert_refused_early(proc, str(key), "chmod 600", "--allow-insecure-key")
    assert seen == []


@pytest.mark.parametrize("which", ["client_key", "client_both"])
def test_a_tls_client_key_others_can_read_is_refused_unless_allowed(tmp_path: Path, which: str) -> None:
    from support.mtls import write_pki

    pki = write_pki(tmp_path)
    pki[which].chmod(0o644)
    flags = ["--client-cert", str(pki["client_cert"]), "--client-key", str(pki["client_key"])] if which == "client_key" \
        else ["--client-cert", str(pki["client_both"])]
    with static_server({}) as url:
        proc = run("check", "--endpoint", url, *flags)
        seen = list(static_server.seen)  # type: ignore[attr-defined]
    assert_refused_early(proc, "--client-key" if which == "client_key" else "--client-cert", "chmod 600")
    assert seen == []
    with static_server({}) as url:
        allowed = run("check", "--endpoint", url, "--capacity-only", "--timeout", "2", *flags, "--allow-insecure-key")
    assert allowed.returncode == 3 and "chmod" not in allowed.stderr, allowed.stderr  # it went on to the engine
