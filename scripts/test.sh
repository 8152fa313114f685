#!/usr/bin/env bash
# The project's test command: installs everything the suite needs, then runs it, tier by tier.
#   scripts/test.sh                      # everything: lint, then the unit, builtin and real tiers
#   scripts/test.sh unit                 # one tier (unit | builtin | real), or several: unit builtin
#   scripts/test.sh builtin -k demo      # arguments after the tiers go to pytest
#   KVPREFLIGHT_SKIP_LINT=1 scripts/test.sh ...          # skip ruff and mypy (a quick local rerun)
# Tiers (tests/conftest.py): unit (tests/unit/, in-process, starts no process), builtin
# (tests/builtin/, the builtin engine, demo and CLI as processes), real (tests/real/, real vLLM, the
# vLLM P/D pair, llama.cpp, smg, sglang-router). The tiers run one after the other (never two heavy
# tiers at once on 2 cores), each in two phases (below: three tests at a time, then the `alone` ones);
# the run ends with each tier's time, and fails if any tier failed.
# Installs: .venv (kvpreflight editable, with the engine and test extras; torch is pinned to the
# local CPU build; in a fresh clone, a link to a venv cached per pyproject.toml), and the real engines (vLLM on CPU, llama.cpp, the P/D stack, the SGLang routers)
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
install() {  # kvpreflight editable, with every dependency; then byte-compiled
    "$1" -m pip install --quiet --no-compile --disable-pip-version-check -e '.[engine,test]'
    # --no-compile, then compileall on every core: pip byte-compiles one file at a time (torch's
    # thousands, ~30 s more on 2 cores). Compiled here, not left to first import: with
    # PYTHONDONTWRITEBYTECODE=1 (as on this project's machines) nothing imported is ever cached,
    # and every builtin engine process would compile torch from source.
    "$1" -m compileall -q -j 0 "$(dirname "$1")/../lib" kvpreflight >/dev/null 2>&1 || true
}
if [[ -x .venv/bin/python ]]; then
    install .venv/bin/python  # a checkout's own venv (a developer's): brought up to date
elif [[ -e .venv ]]; then
    echo "test.sh: .venv exists but has no bin/python: remove it (rm -rf .venv) and run again" >&2
    exit 2
else
    # A fresh clone (CI's): the dependencies live in a venv cached with the engines, one per
    # pyproject.toml and Python (installing and compiling torch and ray took ~40 s of every run),
    # and .venv links to it; only kvpreflight itself is installed again, pointing at this clone.
    cache="${KVPREFLIGHT_CACHE:-$HOME/.cache/kvpreflight}"
    key=$(cat pyproject.toml <("$PY" -VV) | sha256sum | cut -c1-16)
    venv="$cache/test-venv-$key"
    if [[ ! -f "$venv/.complete" ]]; then
        rm -rf "$venv" && mkdir -p "$cache"
        "$PY" -m venv "$venv"
        install "$venv/bin/python"
        touch "$venv/.complete"
        # the venvs of earlier pyproject.tomls (a GiB or more each)
        find "$cache" -maxdepth 1 -name 'test-venv-*' ! -name "test-venv-$key" -exec rm -rf {} +
    else
        "$venv/bin/python" -m pip install --quiet --no-deps --disable-pip-version-check -e .
    fi
    ln -s "$venv" .venv
fi
# The cached venv is shared: its editable install points at whichever checkout installed last (a
# developer's test run while a clean clone's CI runs moved it once). This checkout's code comes
# first on every process's path, so each run tests its own tree.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
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
# A tier's phases: their exit codes joined (5, no test selected, fails the tier only when no phase ran
# a test, e.g. a `-k` that matched nothing) and their times in the ledger.
phase() {
    local name=$1 t0 rc=0
    shift
    t0=$(date +%s)
    .venv/bin/python -m pytest "$@" --durations=15 || rc=$?
    PHASES+=("$name $(( $(date +%s) - t0 )) s")
    if [[ $rc -eq 0 ]]; then ran=1; elif [[ $rc -ne 5 && $tier_rc -eq 0 ]]; then tier_rc=$rc; fi
}
for tier in "${TIERS[@]}"; do
    # The unit tier starts no process and spends most of its time waiting on its own misbehaving
    # in-process servers: six workers (78-85 s on four, 51-54 on six, 56 on eight). The builtin and
    # real tiers' engines leave a core idle most of the time (the builtin tier used 67% of one core
    # run one test at a time), so their tests run three at a time (builtin 218-238 s two at a time,
    # 176 three, 177 four; real 131-150 s two, 110 three), the tests sharing a module's fixture in one
    # worker (`xdist_group`, tests/conftest.py); then the tests marked `alone` (they judge speeds and
    # deadlines, which a neighbour on 2 cores skews, or fill both cores themselves: the vLLM
    # engines) run one at a time.
    t0=$(date +%s)
    tier_rc=0 ran=0 PHASES=()
    case $tier in
        unit) phase "in-process" "tests/unit" -n "${KVPREFLIGHT_UNIT_WORKERS:-6}" "$@" ;;
        builtin) phase "three-at-a-time" "tests/builtin" -n 3 --dist loadgroup -m "not alone" "$@"
                 phase "alone" "tests/builtin" -m alone "$@" ;;
        real) phase "three-at-a-time" "tests/real" -n 3 --dist loadgroup -m "not alone" "$@"
              phase "alone" "tests/real" -m alone "$@" ;;
    esac
    [[ $tier_rc -eq 0 && $ran -eq 0 ]] && tier_rc=5
    said=$(printf '%s, ' "${PHASES[@]}")
    LEDGER+=("$tier: $(( $(date +%s) - t0 )) s (exit $tier_rc; ${said%, })")
    [[ $tier_rc -eq 0 ]] || failed=1
done
LEDGER+=("total: $(( $(date +%s) - started )) s")
echo "== kvpreflight test ledger (per tier, wall clock) =="
printf '  %s\n' "${LEDGER[@]}"
exit $failed
