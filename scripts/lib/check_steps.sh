# What the prepared GPU-machine checks (scripts/device_check.sh, gpu_emu_check.sh, targets_check.sh)
# share, sourced by each from the repository root. Each check is a list of steps run within one
# device call: every step under `timeout`, a failed step not stopping the later ones, and the steps'
# timeouts shrinking so that the whole check ends within its budget. Those rules live here once.
#
# The sourcing script sets OUT, STEPS (the steps to run, by name) and BUDGET (seconds for all of
# them); after sourcing, optionally SCALE (the caps' factor, 1) and FLOOR (the shortest timeout a
# step gets, 15).
#
#   check_log NAME        all output from here on also into $OUT/NAME.log; the check's clock starts
#   note TEXT...          TEXT with the time and the seconds since the start, also into $OUT/summary.txt
#   want STEP             whether STEP is one of $STEPS
#   budget CAP RESERVE    a step's timeout: CAP seconds, or less so that RESERVE seconds stay for the
#                         later steps (both times $SCALE), and never under $FLOOR
#   default_python        the repository's .venv/bin/python where there is one, else python3
#   carried_tools_first   the carried ip/tc/nft (.device-tools/bin, scripts/prepare_device.sh) first on PATH

SCALE=1 FLOOR=15  # the defaults, not the environment's: a script that wants others sets them after sourcing

check_log() {
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/$1.log") 2>&1
  T0=$SECONDS
}

note() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - T0))s] $*" | tee -a "$OUT/summary.txt"; }

want() { [[ " $STEPS " == *" $1 "* ]]; }

budget() {
  local cap=$(($1 * SCALE)) left=$((BUDGET - (SECONDS - T0) - $2 * SCALE))
  ((left > cap)) && left=$cap
  ((left < FLOOR)) && left=$FLOOR
  echo "$left"
}

default_python() { if [[ -x .venv/bin/python ]]; then echo .venv/bin/python; else echo python3; fi; }

carried_tools_first() { if [[ -d .device-tools/bin ]]; then export PATH="$PWD/.device-tools/bin:$PATH"; fi; }
