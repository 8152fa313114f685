"""The README names only flags that exist, and stays a user's document (short, no figure that ages)."""

from __future__ import annotations

import re

from support.cli import command_paths, invoke
from support.readme import README, flags_named


def all_help() -> str:
    texts = []
    for path in command_paths():
        result = invoke(*path, "--help", env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
        assert result.returncode == 0, (path, result.stderr)
        texts.append(result.stdout)
    return "\n".join(texts)


def test_every_flag_the_readme_names_is_in_some_commands_help():
    help_text = all_help()
    named = flags_named()
    assert {"--endpoint", "--entry", "--record", "--quiet"} <= named  # the reader's way in is found
    missing = sorted(f for f in named if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", help_text))
    assert not missing, f"README names flags no --help shows: {missing}"


def test_the_reader_finds_a_flag_that_does_not_exist():
    assert "--no-such-flag" in flags_named("run `kvpreflight check --no-such-flag`")
    assert "--no-such-flag" not in all_help()


def test_readme_is_short_and_carries_no_date_or_machine_figure():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 320
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a dated figure belongs in docs/FINDINGS.md"
    assert not re.search(r"\b\d+ (cores?|CPUs?)\b|\bmeasured (here|on|from)\b", text, flags=re.I)
    assert not re.search(r"\d+(\.\d+)? ?(ms|s)\b(?! per)", text.split("<!-- sample-output:")[0]), "a timing belongs in docs/"
