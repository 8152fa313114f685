"""One declaration per CLI parameter (issue 47): a flag declared in `kvpreflight._internal.commands.options` is
not declared again by a command, except where it means something else there (each such flag says
why in its command). And the rules between `watch`'s options live in the library, where a user's
mistakes are refused before anything is read or sent."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support.cli import invoke

COMMANDS = Path(__file__).resolve().parents[2] / "kvpreflight" / "_internal" / "commands"

# (command module, flag): the flag means something else there, so it is that command's own.
OWN_MEANING = {
    ("advisories.py", "--engine"): "the engines advisories name, not --engine's engine kinds",
    ("advisories.py", "--format"): "table or json of advisories, not a report format",
    ("gpus.py", "--format"): "table or json of GPUs, not a report format",
    ("engine.py", "--context-length"): "the builtin engine's served length, not a promise",
    ("demo.py", "--context-length"): "the demo engines' served length, not a promise",
    ("demo.py", "--record"): "a default path in --out",
    ("demo.py", "--sign-key"): "a fresh key by default, no KVPREFLIGHT_SIGN_KEY",
    ("fleet.py", "--format"): "fleet rows or every deployment's checks",
    ("fleet.py", "--record"): "one record per deployment beside the fleet's",
    ("verify.py", "--subject"): "a subject the record must name, not one written into it",
    ("watch.py", "--record"): "an input: the record to match",
    ("watch.py", "--timeout"): "one read or canary answer",
}


def declared_flags(path: Path) -> set[str]:
    """The flags a module declares with typer.Option(...)."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Option":
            flags.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                         and a.value.startswith("--"))
    return flags


def test_a_shared_flag_is_declared_once():
    shared = declared_flags(COMMANDS / "options.py")
    assert {"--format", "--output", "--allow-insecure-key", "--sign-key", "--advisories", "--context-length"} <= shared
    again = sorted((path.name, flag) for path in COMMANDS.glob("*.py") if path.name != "options.py"
                   for flag in declared_flags(path) & shared if (path.name, flag) not in OWN_MEANING)
    assert again == [], "declare these once in commands/options.py (or say in OWN_MEANING why they differ)"


def test_every_command_that_reads_a_private_key_explains_allow_insecure_key_alike():
    texts = {command: " ".join(invoke(command, "--help", env={"COLUMNS": "300"}).stdout.split())
             for command in ("check", "demo", "fleet", "verify", "watch")}
    for command, text in texts.items():
        assert "--allow-insecure-key Use a private key file (--sign-key, --client-key) that others can read" in text, command


@pytest.mark.parametrize("args,message", [
    (("--once", "--rounds", "2"), "--once is --rounds 1; pass one of them"),
    (("--interval", "0"), "--interval: must be a positive number (got 0.0)"),
    (("--record", "r.json"), "--record FILE and --key PUB go together"),
    (("--full-every", "1h", "--no-canaries"), "--full-every sends requests and --no-canaries sends none"),
])
def test_watch_refuses_contradicting_options_before_any_request(args, message):
    result = invoke("watch", "--endpoint", "http://127.0.0.1:9", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_watch_schedule_one_round_serves_no_metrics_unless_asked():
    from kvpreflight._internal.watch.schedule import watch_schedule

    def schedule(**given):
        values = dict(targets=True, spec=None, inventory=None, interval=60.0, once=False, rounds=None,
                      max_tokens_per_hour=None, full_every=None, canaries=True, record=None, key=None, textfile=None,
                      listen=None)
        return watch_schedule(**{**values, **given})

    once = schedule(once=True)
    assert once.listen is None and once.max_rounds == 1 and once.bounded
    served = schedule()
    assert served.listen is not None and served.max_rounds is None and not served.bounded
    assert schedule(once=True, listen="127.0.0.1:0").listen is not None


def test_review_refuses_a_context_length_below_one_in_one_line(tmp_path):
    result = invoke("review", "--context-length", "0", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == "kvpreflight: error: --context-length: must be a positive number (got 0)"


def test_a_written_default_is_shown_not_taken_for_markup():
    """typer reads help as rich markup, where an unescaped `[default: ...]` is a style tag that vanishes."""
    check = " ".join(invoke("check", "--help", env={"COLUMNS": "300"}).stdout.split())
    assert "[default: what the engine serves]" in check and "[default: 3x the estimate printed after calibration" in check
    watch = " ".join(invoke("watch", "--help", env={"COLUMNS": "300"}).stdout.split())
    assert "[default: 127.0.0.1:9478; off with --once]" in watch
    unescaped = [f"{path.name}:{node.lineno}" for path in sorted(COMMANDS.glob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
                 and isinstance(node.value, str) and re.search(r"(?<!\\)\[default:", node.value)]
    assert unescaped == [], "write \\\\[default: ...] in help text"
