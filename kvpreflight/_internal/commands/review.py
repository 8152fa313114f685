"""`kvpreflight review`: pre-merge static estimate of every engine's KV pool in deployment files."""

from __future__ import annotations

from pathlib import Path

import typer

from kvpreflight._internal.commands import options


def register(app: typer.Typer) -> None:
    @app.command("review")
    def review_command(
        files: list[Path] = typer.Argument(...,
            help="Kubernetes manifests, docker-compose files, shell scripts or kvpreflight boot specs."),
        model_dir: Path | None = typer.Option(None, "--model-dir", envvar="KVPREFLIGHT_MODEL_DIR",
            help="(or KVPREFLIGHT_MODEL_DIR) The model's folder (Hugging Face config.json, optional model.safetensors.index.json), or "
                 "a folder holding model folders named like the command's model path."),
        gpu: str | None = typer.Option(None, "--gpu",
            help="GPU product (e.g. 'H100 80GB', H200, B200, 'A100 80GB', L40S, MI300X); default: the manifest's "
                 "nvidia.com/gpu.product label."),
        context_length: int | None = options.in_panel(options.CONTEXT_LENGTH, None),
        format: str = options.in_panel(options.FORMAT, None),
        output: Path | None = options.in_panel(options.OUTPUT, None),
        advisories: list[Path] | None = options.in_panel(options.ADVISORIES, None),
    ) -> None:
        """Estimate each engine's KV pool from deployment files; exit 1 when one cannot hold its context.

        Reads SGLang, vLLM and llama.cpp launches and sizes each pool the way the engine will. An
        estimate: `kvpreflight check` on the running engine stays the proof.
        """
        from kvpreflight import __version__
        from kvpreflight._internal.review import review
        from kvpreflight._internal.review.estimate import ReviewInputs
        from kvpreflight.errors import naming
        from kvpreflight.formats import get_format, write_report
        from kvpreflight.formats.ci import github_actions_side_effects
        from kvpreflight.targets import positive

        with naming("--context-length"):  # a value's range, as check's check_fields checks it
            positive(context_length)
        formatter = get_format(format)  # a bad --format is a usage error before any work
        report = review(files, ReviewInputs(model_dir=model_dir, gpu=gpu, context_length=context_length), version=__version__,
                        advisory_dirs=tuple(advisories or ()))
        write_report(report, formatter, output)
        github_actions_side_effects(report, format_name=format if output is None else None)
        raise typer.Exit(report.exit_code)
