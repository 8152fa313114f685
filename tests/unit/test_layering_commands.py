"""The library never reaches up into the CLI: only cli.py and __main__.py import kvpreflight._internal.commands,
and no library module reads or writes sys.argv (the command line is passed down explicitly)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvpreflight"
CLI_MODULES = {PACKAGE / "_internal" / "cli.py", PACKAGE / "__main__.py"}


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module a file imports, at top level or inside functions."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def library_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if p not in CLI_MODULES and (PACKAGE / "_internal" / "commands") not in p.parents]


def test_no_library_module_imports_the_cli_layer():
    offenders = []
    for path in library_modules():
        imports = imported_modules(ast.parse(path.read_text(), str(path)))
        if any(name == "kvpreflight._internal.commands" or name.startswith("kvpreflight._internal.commands.") for name in imports):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_no_library_module_uses_sys_argv():
    offenders = []
    for path in library_modules():
        if path.name == "reaper.py":  # its own `python -m` entry point reads its own argv
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "argv" and isinstance(node.value, ast.Name) \
                    and node.value.id == "sys":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


def test_the_scan_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from kvpreflight._internal.commands.check import register\n")
    assert "kvpreflight._internal.commands.check" in imported_modules(tree)


def test_cli_choices_come_from_the_registries():
    """--engine and --format help list exactly what the registries hold (no copy to drift)."""
    from kvpreflight._internal.commands.options import ENGINE_HELP, FORMAT_HELP
    from kvpreflight._internal.engines import ENGINES
    from kvpreflight.boot.spec import router_only_kinds, spec_engine_kinds
    from kvpreflight.formats import FORMATS

    shipped = [name for name in ENGINES if name != "fake"]  # `fake`: the unit tier's own (tests/unit/conftest.py)
    assert set(shipped) == set(spec_engine_kinds()) - {"auto", "fake", *router_only_kinds()}
    # the unit tier's `fake` is registered before commands.options is first imported here
    assert [k for k in ENGINE_HELP.split(", ") if k != "fake"] == ["auto", *shipped]
    assert FORMAT_HELP.split(", ") == list(FORMATS)
