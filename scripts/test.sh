#!/usr/bin/env bash
# Sets up everything and runs the whole test suite: lint, types, unit and lab integration tests.
# Extra arguments go to pytest (e.g. `-m "not vllm"` or `-k soak`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check controller tests bench roles
echo "== mypy"; mypy
echo "== pytest"
rc=0
pytest "$@" || rc=$?
# pytest's 5 means it collected nothing: a suite that ran no test has not passed.
exit $rc
