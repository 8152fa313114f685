#!/usr/bin/env bash
# The property-based suites under Hypothesis's long profile (5,000 random examples per property,
# not derandomized): what CI's fixed `ci` profile cannot afford. Takes tens of minutes on 2 cores.
#   benchmarks/properties_long.sh [pytest args, e.g. -k prometheus]
set -euo pipefail
cd "$(dirname "$0")/.."
HYPOTHESIS_PROFILE=long exec .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/unit/test_properties_config.py tests/unit/test_properties_untrusted.py "$@"
