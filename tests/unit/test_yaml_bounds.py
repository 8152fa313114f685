"""YAML from pull requests and inventories is loaded with alias expansion and nesting bounded,
everywhere: an alias bomb or a value nested hundreds deep is one line and exit 2 within seconds, in
`review`, `check --boot` and `fleet`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.cli import invoke


def alias_bomb(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def merge_bomb(levels: int = 9) -> str:
    """The alias bomb again, each level merging the one below nine times."""
    lines = ["a: &a {" + ", ".join(f"k{i}: lol" for i in range(9)) + "}"]
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} {{<<: *{prev}, x{i}: [{', '.join([f'*{prev}'] * 9)}]}}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", [["review"], ["check", "--boot"], ["fleet"]])
@pytest.mark.parametrize("kind", ["aliases", "merge keys"])
def test_an_alias_bomb_is_refused_in_one_line_within_seconds(tmp_path: Path, command: list[str], kind: str) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb() if kind == "aliases" else merge_bomb())
    started = time.monotonic()
    proc = invoke(*command, str(bomb))
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "alias" in lines[0] and "bomb.yaml" in lines[0], proc.stderr
    assert elapsed < 20, elapsed  # a walk of the expanded tree would take hours


@pytest.mark.parametrize("command", [["review"], ["check", "--boot"], ["fleet"]])
def test_yaml_nested_hundreds_deep_is_refused_in_one_line(tmp_path: Path, command: list[str]) -> None:
    """PyYAML composes nested values recursively: 3,000 levels was a RecursionError traceback (exit 1)."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 3000 + "]" * 3000 + "\n")
    proc = invoke(*command, str(deep))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-500:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nested more than 100 levels deep" in lines[0] and "deep.yaml" in lines[0], proc.stderr


def test_yaml_nested_as_deep_as_real_files_loads() -> None:
    from kvpreflight._internal.fields import load_yaml

    assert load_yaml("a: " + "[" * 60 + "1" + "]" * 60, "ok.yaml") is not None


def test_a_boot_spec_that_is_not_text_is_one_line_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(b"\xff\xfe\x00binary\x80")
    proc = invoke("check", "--boot", str(spec))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not UTF-8 text" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_yaml_with_a_few_aliases_still_loads() -> None:
    from kvpreflight._internal.fields import load_yaml

    assert load_yaml("base: &b {n: 1}\nother: *b\n", "ok.yaml") == {"base": {"n": 1}, "other": {"n": 1}}


def test_an_error_about_a_file_that_is_not_a_spec_does_not_print_the_file(tmp_path: Path) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text("deployments:\n  - name: a\n    boot: /etc/passwd\n")
    proc = invoke("fleet", str(inventory))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "deployments[0].boot" in line and "/etc/passwd" in line
    assert len(line) < 400 and "root:x:0:0" not in line


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system ['true']", "!!python/name:os.system"])
def test_a_python_tag_is_still_refused_next_to_a_merge_key(tag: str) -> None:
    from kvpreflight._internal.fields import load_yaml
    from kvpreflight.errors import ConfigError

    assert load_yaml("base: &b {a: 1}\nx: {<<: *b, c: 2}\n", "spec.yaml") == {"base": {"a": 1}, "x": {"a": 1, "c": 2}}
    with pytest.raises(ConfigError, match="spec.yaml: not valid YAML"):
        load_yaml(f"base: &b {{a: 1}}\nx: {{<<: *b, c: {tag}}}\n", "spec.yaml")
