#!/usr/bin/env bash
# The project's test command: installs everything the suite needs, then runs it.
#   scripts/test.sh                      # everything: fast, slow and real-engine tests
#   scripts/test.sh -m "not real_engine and not slow"   # the fast suite alone (pytest args pass through)
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
exec .venv/bin/python -m pytest "$@"
