#!/usr/bin/env bash
# The project's test command: installs everything the suite needs, then runs it, tier by tier.
#   scripts/test.sh                      # everything: lint, then the unit, builtin and real tiers
#   scripts/test.sh unit                 # one tier (unit | builtin | real), or several: unit builtin
#   scripts/test.sh builtin -k demo      # arguments after the tiers go to pytest
#   KVPREFLIGHT_SKIP_LINT=1 scripts/test.sh ...          # skip ruff and mypy (a quick local rerun)
# Tiers (tests/conftest.py): unit (tests/unit/, in-process, starts no process), builtin
# (tests/builtin/, the builtin engine, demo and CLI as processes), real (tests/real/, real vLLM, the
# vLLM P/D pair, llama.cpp, smg, sglang-router). Each tier is its own pytest run, one after the
# other (never two heavy tiers at once on 2 cores); the run ends with each tier's time, and fails
# if any tier failed.
# Installs: .venv (kvpreflight editable, with the engine and test extras; torch is pinned to the
# local CPU build), and the real engines (vLLM on CPU, llama.cpp, the P/D stack, the SGLang routers)
# cached under ${KVPREFLIGHT_CACHE:-~/.cache/kvpreflight} by scripts/setup_engines.sh (only when
# the real tier runs), and the programs that consume kvpreflight's outputs (node_exporter, promtool,
# Sarif.Multitool, actionlint, shellcheck, zizmor) by scripts/setup_consumers.sh (only when the
# builtin tier runs; each installed once, when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TIERS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        unit|builtin|real) TIERS+=("$1"); shift ;;
        all) TIERS+=(unit builtin real); shift ;;
        *) break ;;
    esac
done
[[ ${#TIERS[@]} -gt 0 ]] || TIERS=(unit builtin real)

started=$(date +%s)
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
# --no-compile, then compileall on every core: pip byte-compiles one file at a time (torch's
# thousands, ~30 s more on 2 cores). Compiled here, not left to first import: with
# PYTHONDONTWRITEBYTECODE=1 (as on this project's machines) nothing imported is ever cached, and
# every builtin engine process would compile torch from source.
.venv/bin/python -m pip install --quiet --no-compile --disable-pip-version-check -e '.[engine,test]'
.venv/bin/python -m compileall -q -j 0 .venv/lib kvpreflight >/dev/null 2>&1 || true
if [[ " ${TIERS[*]} " == *" builtin "* ]]; then
    scripts/setup_consumers.sh
fi
if [[ " ${TIERS[*]} " == *" real "* ]]; then
    scripts/setup_engines.sh
fi
LEDGER=("setup: $(( $(date +%s) - started )) s")
if [[ -z "${KVPREFLIGHT_SKIP_LINT:-}" ]]; then
    # Guardrails first: they take a minute and fail fast (configuration in pyproject.toml).
    t0=$(date +%s)
    .venv/bin/ruff check kvpreflight tests benchmarks scripts
    .venv/bin/mypy
    LEDGER+=("lint: $(( $(date +%s) - t0 )) s")
fi

failed=0
for tier in "${TIERS[@]}"; do
    # The builtin and real tiers run one test at a time: many judge deadlines and speeds, which two
    # at once on 2 cores skew. The unit tier starts no process and spends most of its time waiting
    # on its own misbehaving in-process servers (user time ~75 s of ~220 s): four workers.
    t0=$(date +%s)
    rc=0
    workers=()
    [[ $tier == unit ]] && workers=(-n "${KVPREFLIGHT_UNIT_WORKERS:-4}")
    .venv/bin/python -m pytest "tests/$tier" "${workers[@]}" --durations=15 "$@" || rc=$?
    LEDGER+=("$tier: $(( $(date +%s) - t0 )) s (exit $rc)")
    [[ $rc -eq 0 ]] || failed=1
done
LEDGER+=("total: $(( $(date +%s) - started )) s")
echo "== kvpreflight test ledger (per tier, wall clock) =="
printf '  %s\n' "${LEDGER[@]}"
exit $failed
