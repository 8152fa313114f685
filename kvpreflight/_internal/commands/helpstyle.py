"""`--help` in the conventions users know from other CLIs: placeholders are URL, N, PATH or TEXT
(never a Python type such as `<list[str]>`), a flag shows none, and a required argument reads
`RECORD...` in the usage line. Recent typer releases print Python types; this maps them once for
every command. Options that name their own placeholder (`metavar=`) keep it."""

from __future__ import annotations

from typing import Any

# typer's type label (without <>) -> the conventional placeholder.
_PLACEHOLDERS = {"int": "N", "float": "N", "str": "TEXT", "path": "PATH", "Path": "PATH", "bool": ""}


def _placeholder(label: str) -> str:
    inner = label.strip("<>")
    if inner.startswith("list[") and inner.endswith("]"):
        inner = inner[len("list["):-1]
    return _PLACEHOLDERS.get(inner, inner)


def install() -> None:
    """Make typer's help use the placeholders above; a no-op for typer releases that already do."""
    from typer import core

    parameter = getattr(core, "_TyperParameter", None)
    original = getattr(parameter, "display_type", None)
    if parameter is None or original is None or getattr(original, "_kvpreflight", False):
        return

    def display_type(self: Any, ctx: Any) -> str:
        if getattr(self, "is_flag", False):
            return ""  # a flag takes no value
        return _placeholder(original(self, ctx))

    display_type._kvpreflight = True  # type: ignore[attr-defined]
    parameter.display_type = display_type
    argument = getattr(core, "TyperArgument", None)
    if argument is not None and hasattr(argument, "_usage_display_name"):
        def usage_name(self: Any) -> str:
            name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
            return name + ("..." if self.nargs != 1 else "")

        argument._usage_display_name = usage_name
