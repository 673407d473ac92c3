#!/usr/bin/env bash
# The benchmark's targets (docs/benchmark.md) on a GPU machine (16 cores), as one device call of at most ~8 minutes.
# Prepared here with scripts/prepare_device.sh (carry [".whl", ".device-tools"]); each step runs under
# `timeout`, a failed step does not stop the later ones, and the steps' timeouts shrink so the whole
# script ends within TC_BUDGET (450 s):
#
#   1 setup    scripts/gpu_emu_check.sh's setup step: the carried wheels and the C helper, the machine's
#              facts (cores, load, Python, torch); here too the carried ip/tc/nft go first on PATH;
#   2 targets  scenarios/benchmark.py --targets: loopback 25M x 3 and x 8, DBLP sharded and single server
#              against gloo (the 16-core bounds apply from 16 cores on: sharded <= 1.0x at 3 workers and
#              <= 1.2x at 8, single server <= 1.6x at 3), veth at MTU 1500 on namespace hosts (root and
#              ip/nft), the DDP small-model step; TC_REPEATS repeats (3) of TC_ROUNDS timed rounds (10),
#              median and range;
#   3 pacing   scenarios/benchmark.py --pacing quick: a paced sender's delivered rate (1 Gbit/s, GSO and
#              plain), passes per lossless round without a rate flag, the 70% burst round against hand
#              pacing (namespace hosts and TBF).
# Caps: setup 150 s, targets 250 s (a repeat of 10 rounds takes ~144 s on 2 cores; each repeat rewrites
# targets.csv, so a cut run keeps the repeats it finished), pacing 110 s (~84 s on 2 cores). On the 2-core
# VM the targets step's cap keeps 1 repeat of 3 (a cut run exits 124 with its finished repeats kept and no
# namespace left); the 16-core machine's rounds are ~2x shorter. The dry runs' timings: docs/benchmark.md.
#
# Output in $OUT: summary.txt (one line per step), targets_check.log (everything), targets.tar.gz
# (targets.csv/.json/.png and each repeat's run folders), pacing.tar.gz.
#
# Usage (device machine, repository root):  bash scripts/targets_check.sh
# CPU dry run here (root; one repeat, the pacing step too):
#   OUT=/tmp/tc TC_STEPS="targets pacing" TC_REPEATS=1 TC_BUDGET=900 bash scripts/targets_check.sh
set -uo pipefail  # no -e: every step is guarded
cd "$(dirname "$0")/.."
source scripts/lib/check_steps.sh  # check_log, note, want, budget: the steps' rules, shared with the other checks
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/targets_check_out}
RES=${TC_RESULTS:-/tmp/tc_results}
rm -rf "$RES" && mkdir -p "$RES"
STEPS=${TC_STEPS:-setup targets pacing}
BUDGET=${TC_BUDGET:-450}
REPEATS=${TC_REPEATS:-3}
ROUNDS=${TC_ROUNDS:-10}  # timed rounds a repeat (--targets' own default is 15: 10 keeps 3 repeats inside the cap)
check_log targets_check
carried_tools_first
PY=${TC_PY:-$(default_python)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
note "targets_check: steps [$STEPS], python $PY, OUT $OUT, budget $BUDGET s, $REPEATS repeat(s)"
for t in ip tc nft; do echo "  $t: $(command -v $t || echo missing)"; done

# ---- 1. setup ------------------------------------------------------------------------------------------------
if want setup; then  # the same as scripts/gpu_emu_check.sh's: run that step, not a copy of it
  note "1 setup: start (scripts/gpu_emu_check.sh's setup step)"
  timeout -k 5 "$(budget 160 280)" env OUT="$OUT/setup" GE_STEPS=setup GE_PY="$PY" GE_BUDGET="$BUDGET" \
    GE_RESULTS=/tmp/tc_setup ${TC_SITE:+GE_SITE=$TC_SITE} ${TC_PTH:+GE_PTH=$TC_PTH} bash scripts/gpu_emu_check.sh
  note "1 setup: rc=$? ($(tr '\n' ';' <"$OUT/setup/summary.txt" 2>/dev/null | tail -c 400))"
fi

# ---- 2. the targets: loopback and veth against gloo, the DDP small-model step -------------------------------
if want targets; then
  sets=loopback,ddp
  if [[ $(id -u) == 0 ]] && command -v ip >/dev/null && command -v nft >/dev/null; then
    sets=loopback,veth,ddp
  fi
  note "2 targets: start (--target-sets $sets --repeats $REPEATS)"
  timeout -k 15 "$(budget 250 100)" "$PY" scenarios/benchmark.py --targets --target-sets "$sets" --repeats "$REPEATS" \
    --iterations "$ROUNDS" --out "$RES/targets"
  rc=$?
  [[ -d "$RES/targets" ]] && tar -czf "$OUT/targets.tar.gz" -C "$RES/targets" .
  note "2 targets: rc=$rc ($(grep -c ',True,' "$RES/targets/targets.csv" 2>/dev/null || echo 0) rows met)"
  ip netns list 2>/dev/null | grep -c dblpns- | xargs -I{} echo "  dblpns- namespaces left: {}"
fi

# ---- 3. the pacing targets on namespace links -------------------------------------------------------------------
if want pacing; then
  if [[ $(id -u) != 0 ]] || ! command -v tc >/dev/null; then
    note "3 pacing: skipped (needs root and tc/nft: carry .device-tools)"
  else
    note "3 pacing: start (--pacing quick)"
    timeout -k 15 "$(budget 110 5)" "$PY" scenarios/benchmark.py --pacing quick --out "$RES/pacing"
    rc=$?
    [[ -d "$RES/pacing" ]] && tar -czf "$OUT/pacing.tar.gz" -C "$RES/pacing" .
    note "3 pacing: rc=$rc"
  fi
fi
note "targets_check: done in $((SECONDS - T0)) s"
