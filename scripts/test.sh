#!/usr/bin/env bash
# The project's test command: installs everything the suite needs, then runs it.
#   scripts/test.sh                      # everything: fast, slow and real-engine tests
#   scripts/test.sh -m "not real_engine and not slow"   # the fast suite alone (pytest args pass through)
#   KVPREFLIGHT_SKIP_LINT=1 scripts/test.sh ...          # skip ruff and mypy (a quick local rerun)
# Runs ruff and mypy over the code, then pytest (with the 40 slowest tests listed).
# Installs: .venv (kvpreflight editable, with the engine and test extras; torch is pinned to the
# local CPU build), and the real engines (vLLM on CPU, llama.cpp) cached under
# ${KVPREFLIGHT_CACHE:-~/.cache/kvpreflight} by scripts/setup_engines.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[engine,test]'
scripts/setup_engines.sh
if [[ -z "${KVPREFLIGHT_SKIP_LINT:-}" ]]; then
    # Guardrails first: they take a minute and fail fast (configuration in pyproject.toml).
    .venv/bin/ruff check kvpreflight tests benchmarks scripts
    .venv/bin/mypy
fi
exec .venv/bin/python -m pytest --durations=40 "$@"
