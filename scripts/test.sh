#!/usr/bin/env bash
# Sets up everything and runs the whole test suite: lint, types, unit and lab integration tests.
# Extra arguments go to pytest (e.g. `-m "not vllm"` or `-k soak`). Two pytest-xdist workers: the lab's tests
# on one of them, in order, beside the rest (tests/conftest.py); FLEETCTL_TEST_WORKERS=0 runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check controller tests bench roles
echo "== mypy"; mypy
echo "== pytest"
rc=0
pytest -n "${FLEETCTL_TEST_WORKERS:-2}" --dist loadgroup "$@" || rc=$?
# pytest's 5 means it collected nothing: a suite that ran no test has not passed.
exit $rc
