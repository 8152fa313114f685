#!/usr/bin/env bash
# The checks that need an NVIDIA GPU (run on a lent GPU machine; CPU machines cannot):
#   1. `kvpreflight gpus` reads NVML for real (name, UUID, memory, driver, PIDs);
#   2. the builtin engine runs on CUDA, booted by `check --boot`, and the report's GPU inventory
#      names the engine's process on GPU 0.
# Usage: scripts/device_check.sh   (writes reports under ${OUT:-./device-check})
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./device-check}"
mkdir -p "$OUT"
if [[ ! -x .venv/bin/python ]]; then python3 -m venv .venv; fi
.venv/bin/python -m pip install --quiet -e '.[engine]'
.venv/bin/kvpreflight gpus --format json | tee "$OUT/gpus.json"
.venv/bin/python - "$OUT/gpus.json" <<'PY'
import json, sys
inv = json.load(open(sys.argv[1]))
gpus = inv.get("gpus") or []
assert gpus, f"NVML found no GPU: {inv}"
for g in gpus:
    assert g.get("uuid") and g.get("memory_total_bytes"), g
print(f"NVML ok: {len(gpus)} GPU(s), driver {inv.get('driver_version')}")
PY
set +e
.venv/bin/kvpreflight check --boot examples/specs/builtin-cuda.yaml --log-dir "$OUT/logs" --format json --output "$OUT/report.json"
code=$?
set -e
echo "check exit code: $code"
.venv/bin/python - "$OUT/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("verdict:", r["verdict"])
for c in r["checks"]:
    print(f'{c["status"]:13} {c["id"]:24} {c["message"][:150]}')
gpus = r.get("gpus") or []
assert gpus and any(g.get("engines") for g in gpus), f"no GPU in the report names the engine: {gpus}"
print("the report's GPU inventory names the engine's process: ok")
PY
