"""Shared types of `kvpreflight review`: where a launch command was found, and what it says.

Data flows one way: a source module (one per input kind) finds command lines in a file and
hands on `CommandSite`s; `commandline` splits them into `Launch`es with every flag's file and
line; an engine module (one per engine) reads its flags the way the engine does and estimates
its KV pool; `check` turns the estimate into a CheckResult with the shared thresholds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvpreflight.errors import ConfigError


class ReviewError(ConfigError):
    """A deployment file, model or GPU that review cannot read: one line, exit 2."""


@dataclass(frozen=True)
class Token:
    """One shell word and the 1-based line of the file it starts on."""

    text: str
    line: int


@dataclass(frozen=True)
class CommandSite:
    """A command line found in a deployment file, with what the surrounding file says."""

    file: str
    where: str  # e.g. "Deployment/glm-prefill container sglang", "service llm", "script"
    tokens: tuple[Token, ...]
    gpu_product: str | None = None  # nvidia.com/gpu.product from a node selector or affinity
    gpu_product_line: int | None = None
    role: str | None = None  # a boot spec's role
    context_length: int | None = None  # a boot spec's promised context
    # For YAML scalars the tokenizer's line is only the scalar's first line; these are the
    # file's lines a flag may be on, so its real line can be looked up.
    search_lines: tuple[int, int] | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # literal values the file sets
    image: str | None = None  # the container image (Kubernetes, compose), whose tag names the engine version
    image_line: int | None = None


@dataclass(frozen=True)
class Flag:
    name: str  # as written, e.g. "--tp" or "-c"
    value: str | None  # None for a switch
    line: int


@dataclass(frozen=True)
class Launch:
    """One engine launch command: the engine kind and its arguments as written."""

    engine: str  # sglang | vllm | llamacpp
    site: CommandSite
    line: int  # the line of the launch word (python -m sglang.launch_server, vllm serve ...)
    args: tuple[Token, ...]  # everything after the launch words
    # literal environment the launch runs with: the file's, a script's `export`s before it, and
    # `NAME=value` words in front of the launch words
    env: Mapping[str, str] = field(default_factory=dict)
