#!/bin/bash
# The all_reduce probe and the facts probe on a host of two or more NVIDIA GPUs (torch with NCCL),
# two ranks on 127.0.0.1: what tests/fixtures/gpu holds was printed by this.
#
#   bash bench/allreduce_gpus.sh [OUTDIR]      (default ./gpu-run; from the repository's root)
#
# Writes: nvidia-smi.txt (sections split by ===, as tests/roles/test_preflight.py reads them),
# nvidia-smi-q.txt, facts.json, the tables (nvlink, nvlink-4g, sockets, sockets-full,
# cuda-visible-devices, budget-split, tcp-one-host; rank 0's stdout in NAME.txt, each rank's
# stderr and exit status in NAME.rR.err) and the join timeouts (missing.rR.err).
# NCCL over sockets: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1.
set -u
W=${1:-gpu-run}; mkdir -p "$W"; W=$(cd "$W" && pwd)
P="python3 controller/fleetctl/allreduce_probe.py"
A=127.0.0.1,127.0.0.1
export PYTHONUNBUFFERED=1
ms() { date +%s%N; }
# pair NAME PORT [VAR=VALUE...] -- COMMAND...: rank 1 in the background, rank 0 timed
pair() {
  local t=$1 p=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  ( env "${envs[@]}" "$@" --rank 1 --addrs $A --port "$p" >"$W/$t.r1.out" 2>"$W/$t.r1.err"
    echo "rc=$?" >>"$W/$t.r1.err" ) &
  local s; s=$(ms)
  env "${envs[@]}" "$@" --rank 0 --addrs $A --port "$p" >"$W/$t.txt" 2>"$W/$t.r0.err"
  echo "rc=$? ms=$(( ($(ms) - s) / 1000000 ))" >>"$W/$t.r0.err"
  wait
}
{ date -u; uname -r; nproc
  python3 -c 'import torch; c = torch.cuda; print("torch", torch.__version__,
"gpus", c.device_count(), "nccl", c.nccl.version(), c.get_device_name(0),
c.get_device_capability(0))'
  env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA)' | sort; } >"$W/env.txt" 2>&1
{ nvidia-smi; echo ===; nvidia-smi -L; echo ===
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,compute_cap,pci.bus_id,uuid \
    --format=csv; echo ===
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader; echo ===
  nvidia-smi --version; echo ===
  cat /proc/driver/nvidia/version; echo ===
  nvidia-smi topo -m; echo ===
  nvidia-smi nvlink -s; } >"$W/nvidia-smi.txt" 2>&1
nvidia-smi -q >"$W/nvidia-smi-q.txt" 2>&1
python3 - <roles/preflight/files/spark_facts.py >"$W/facts.json" 2>"$W/facts.err"
SOCK=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1)
pair nvlink 29510 -- $P
pair nvlink-4g 29520 -- $P --factor 2 --max-bytes $((4 << 30)) --iters 5
pair sockets 29530 "${SOCK[@]}" -- $P
pair sockets-full 29540 "${SOCK[@]}" -- $P --factor 2 --budget 30
# each rank sees only its own GPU
pair cuda-visible-devices 29550 -- sh -c \
  'CUDA_VISIBLE_DEVICES=$(echo "$@" | sed "s/.*--rank \([0-9]\).*/\1/") exec "$0" "$@"' \
  $P --max-bytes $((16 << 20))
# ranks on opposite sides of the budget: rank 1 alone would stop after the first size
pair budget-split 29560 -- sh -c \
  'case "$*" in *"--rank 1"*) exec "$0" "$@" --budget 0;; *) exec "$0" "$@" --budget 1000;; esac' $P
pair tcp-one-host 29580 -- $P --tcp --max-bytes $((16 << 20))
# a missing peer, each side: one line naming it once --join-timeout has passed
for r in 0 1; do
  s=$(ms)
  $P --rank $r --addrs $A --port 29590 --join-timeout 5 >"$W/missing.r$r.out" 2>"$W/missing.r$r.err"
  echo "rc=$? ms=$(( ($(ms) - s) / 1000000 ))" >>"$W/missing.r$r.err"
done
for f in "$W"/*.txt; do case $f in *nvidia-smi*) ;; *) echo "##### $f"; cat "$f";; esac; done
for f in "$W"/*.err; do echo "##### $f"; tail -2 "$f"; done
