#!/usr/bin/env bash
# Run pytest N times with its whole process tree held to PERCENT% of one CPU, as on a loaded machine.
#
#   sudo bash scripts/under_load.sh PERCENT N PYTEST-ARGS...
#   sudo bash scripts/under_load.sh 8 3 tests/emulation/test_emu_bursts.py::test_timed_burst
#
# Why a CPU quota and not busy loops beside the tests: the quota slows only the tests' own processes
# (servers, workers, iperf3, nft, the interpreter's start), so a shared machine's other users are not
# slowed, and the slowdown is the same at every run. A process under the quota runs PERCENT% of every
# 50 ms period and waits the rest: a sleep used as a barrier, an idle limit counted from a start, or a
# wall-clock bound with little margin fails as it would when the machine is busy. Not a model of a
# busy machine's scheduling (nice levels do not help inside the quota): a failure here is a lead to
# read the test by, not a verdict. Needs root and the cpu controller (cgroup v1 or v2). Prints
# PASS/FAIL counts; the logs of failed runs are kept under /tmp/under_load.<pid>/.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,4p' "$0" >&2
  exit 2
fi
PERCENT=$1; N=$2; shift 2
case "$PERCENT" in ''|*[!0-9]*) echo "under_load.sh: PERCENT must be a whole number of percent, got '$PERCENT'" >&2; exit 2;; esac
case "$N" in ''|*[!0-9]*) echo "under_load.sh: N must be a whole number of runs, got '$N'" >&2; exit 2;; esac
if [ "$PERCENT" -lt 2 ] || [ "$PERCENT" -gt 100 ]; then
  echo "under_load.sh: PERCENT must be in [2, 100], got $PERCENT" >&2; exit 2
fi
cd "$(dirname "$0")/.."
PERIOD_US=50000
QUOTA_US=$((PERCENT * PERIOD_US / 100))
if [ -d /sys/fs/cgroup/cpu ] && [ -w /sys/fs/cgroup/cpu ]; then  # cgroup v1
  CG=/sys/fs/cgroup/cpu/dblp-under-load-$$
  mkdir "$CG"
  echo "$PERIOD_US" > "$CG/cpu.cfs_period_us"
  echo "$QUOTA_US" > "$CG/cpu.cfs_quota_us"
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then  # v2
  CG=/sys/fs/cgroup/dblp-under-load-$$
  mkdir "$CG"
  echo "$QUOTA_US $PERIOD_US" > "$CG/cpu.max"
else
  echo "under_load.sh: no writable cpu cgroup controller (run as root; cgroup v1 cpu or v2 with cpu)" >&2
  exit 2
fi
LOGS=/tmp/under_load.$$
mkdir -p "$LOGS"
cleanup() { sleep 0.5; rmdir "$CG" 2>/dev/null || echo "under_load.sh: $CG still holds processes" >&2; }
trap cleanup EXIT
pass=0; fail=0
for i in $(seq 1 "$N"); do
  echo "run $i of $N at $PERCENT% of a CPU: pytest $*" >&2
  if bash -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" env PYTHONPATH="$PWD" \
      .venv/bin/python -m pytest -q -p no:cacheprovider "$@" > "$LOGS/run$i.log" 2>&1; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "  failed: $LOGS/run$i.log" >&2
    grep -E "^(E   |FAILED)" "$LOGS/run$i.log" | head -5 >&2 || true
  fi
done
echo "PASS $pass FAIL $fail at $PERCENT% of a CPU; load: $(cut -d' ' -f1-3 /proc/loadavg)"
