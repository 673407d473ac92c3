#!/usr/bin/env bash
# The paper's microburst experiment on a GPU machine, shortened to one device call of at most ~8 minutes
# (docs/gpu.md). Prepared here with scripts/prepare_device.sh (carry [".whl", ".device-tools"]);
# each step runs under `timeout`, a failed step does not stop the later ones, and the steps' timeouts
# shrink so the whole script ends within GE_BUDGET (450 s):
#
#   1 setup    what the machine lacks: the carried Debian 12 ip/tc/nft first on PATH (.device-tools/bin),
#              the carried wheels and the C helper (scripts/device_check.sh's setup step), the machine's facts;
#   2 emu      scenarios/microburst.py on NAMESPACE hosts (no Mininet) with the workers on CUDA (3 sharing
#              the one GPU): scenarios/experiments/gpu_check_efficientnet_b0.toml - EfficientNet-B0, 150
#              iterations, 70% bursts at 45 and 105, baseline and dblp, 4 Gbit/s TBF links; Tables II, IV, V;
#   3 xemu     the simulator calibrated on that run (its baseline), cross-checked against it
#              (scenarios/crosscheck.py --from-run: relative error of every term, bounds marked);
#   4 hosts    the same configuration as a physical-host run: the real-host launcher (emulation.hosts,
#              transport local: the machine's own stack, no emulated links, no bursts), 3 CUDA workers,
#              baseline and dblp, paced as in step 2; its own simulator cross-check (scenarios/gpu_hosts.py);
#   5 xhosts   the EMULATION's calibration transferred to the physical-host run (its settings put in, the
#              emulation's host constants and compute kept) and cross-checked against it;
#   6 compute  each paper model's compute per iteration on this GPU (EfficientNet-B0, ResNet50; batch 128,
#              one process alone and three at once), for step 7;
#   7 predict  python -m dblp.sim predict: the paper's 930/1395-iteration runs simulated on the emulation's
#              calibration with the measured compute: Tables II/III and V beside the paper's 4.68x/5.88x and
#              23.86%/19.78%.
#
# Output in $OUT: summary.txt (one line per step), gpu_emu_check.log (everything), emu.tar.gz and
# hosts.tar.gz (the run folders: config.json, records, tables CSV, plots PNG), predict.tar.gz.
#
# Usage (device machine, repository root):  bash scripts/gpu_emu_check.sh
# CPU dry run here (every step but setup, tiny: 6 iterations of batch 128 on the CPU; root for the namespaces):
#   OUT=/tmp/ge GE_DRY=1 GE_SCALE=4 GE_BUDGET=2400 GE_STEPS="emu xemu hosts xhosts compute predict" \
#     bash scripts/gpu_emu_check.sh
set -uo pipefail  # no -e: every step is guarded
cd "$(dirname "$0")/.."
source scripts/lib/check_steps.sh  # check_log, note, want, budget: the steps' rules, shared with the other checks
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_emu_check_out}
RES=${GE_RESULTS:-/tmp/ge_results}
rm -rf "$RES" && mkdir -p "$RES"
STEPS=${GE_STEPS:-setup emu xemu hosts xhosts compute predict}
BUDGET=${GE_BUDGET:-450}
DRY=${GE_DRY:-0}
SCALE=${GE_SCALE:-1}  # the caps times this (a CPU dry run is slower than the GPU run the caps are sized for)
check_log gpu_emu_check
carried_tools_first
PY=${GE_PY:-$(default_python)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1
CONFIG=scenarios/experiments/gpu_check_efficientnet_b0.toml
if [[ "$DRY" == 1 ]]; then  # every step, tiny: 3 epochs of 2 iterations on the CPU
  MB_ARGS="--device cpu --data-size 768 --iterations 6 --bursts 2,4 --bandwidth 500M"
  HOST_ITERS=3; GPU=false; COMPUTE_ARGS="--device cpu --batch 8 --steps 2"
else
  MB_ARGS="--device cuda"; HOST_ITERS=75; GPU=true; COMPUTE_ARGS="--device cuda --batch 128 --steps 10"
fi
note "gpu_emu_check: steps [$STEPS], python $PY, OUT $OUT, budget $BUDGET s, dry run $DRY"
for t in ip tc nft mnexec; do echo "  $t: $(command -v $t || echo missing)"; done

# ---- 1. setup ------------------------------------------------------------------------------------------------
if want setup; then
  note "1 setup: start"
  if [[ -d .whl ]]; then
    timeout -k 5 "$(budget 150 300)" env OUT="$OUT/setup" DC_STEPS=setup DC_PY="$PY" ${GE_SITE:+DC_SITE=$GE_SITE} \
      ${GE_PTH:+DC_PTH=$GE_PTH} bash scripts/device_check.sh >/dev/null 2>&1
    note "1 setup: device_check setup rc=$? ($(tr '\n' ';' <"$OUT/setup/summary.txt" 2>/dev/null | tail -c 400))"
  else
    note "1 setup: no .whl/ carried: using the machine's packages as they are"
  fi
  "$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
  nproc; uptime
  note "1 setup: done"
fi

# ---- 2. the microburst experiment on namespace hosts, CUDA workers ----------------------------------------------
EMU=""
if want emu; then
  note "2 emu: start (microburst.py --config $CONFIG --hosts netns $MB_ARGS)"
  # shellcheck disable=SC2086
  timeout -k 15 "$(budget 240 200)" "$PY" scenarios/microburst.py --config "$CONFIG" --hosts netns $MB_ARGS \
    --results "$RES/emu" --quiet
  rc=$?
  EMU=$(ls -d "$RES"/emu/microburst-* 2>/dev/null | tail -1)
  [[ -n "$EMU" ]] && tar -czf "$OUT/emu.tar.gz" --exclude=weights -C "$EMU" .
  note "2 emu: rc=$rc run folder ${EMU:-none}"
  ip netns list 2>/dev/null | grep -c dblpns- | xargs -I{} echo "  dblpns- namespaces left: {}"
fi

# ---- 3. the simulator calibrated on the emulation run, against it ------------------------------------------------
if want xemu && [[ -n "$EMU" ]]; then
  note "3 xemu: start"
  timeout -k 5 "$(budget 60 160)" "$PY" scenarios/crosscheck.py --from-run "$EMU" 2>&1 | tail -n 60
  note "3 xemu: rc=$? (calibration: $EMU/calibration.json)"
fi

# ---- 4. the same configuration on the physical host: the real-host launcher, no emulated links ------------------
HOSTS=""
if want hosts; then
  note "4 hosts: start"
  inv="$OUT/hosts_inventory.toml"
  # each sender's pacing as in the emulation run (its config.json; else the shortened config's)
  pace=$("$PY" -c "import json, sys, tomllib; from traces.units import parse_rate
e = sys.argv[1] + '/config.json'
try: c = json.load(open(e)); print(f\"{c['pace_share'] * float(c['bandwidth']) / c['workers']:.0f}\")
except OSError: c = tomllib.load(open('$CONFIG', 'rb')); print(f\"{c['pace-share'] * parse_rate(c['bandwidth']) / c['workers']:.0f}\")" "${EMU:-none}")
  echo "  senders paced at $pace bit/s (as in the emulation run)"
  cat >"$inv" <<EOF
# written by scripts/gpu_emu_check.sh: $CONFIG on this machine's own network stack (no emulated links,
# no bursts: loss rules need ssh or netns hosts), senders paced as there; random-label inputs of the same
# shapes (the launcher has no teacher data set; the compute per iteration is the same)
[run]
name = "gpuemu"
transport = "local"
policies = ["baseline", "dblp"]
p_low = 0.008
p_high = 0.408
mode = "train"
rate = "${pace}bit"
seed = 0
timeout_s = 240
[train]
workload = "efficientnet_b0"
epochs = 2
iterations = $HOST_ITERS
batch_size = $([[ "$DRY" == 1 ]] && echo 8 || echo 128)
synthetic_data = true
launcher = "python"
eval_batches = 2
[[hosts]]
name = "srv"
role = "server"
gpu = false
[[hosts]]
name = "w1"
role = "worker"
gpu = $GPU
[[hosts]]
name = "w2"
role = "worker"
gpu = $GPU
[[hosts]]
name = "w3"
role = "worker"
gpu = $GPU
EOF
  timeout -k 15 "$(budget 200 90)" "$PY" scenarios/gpu_hosts.py "$inv" --results "$RES/hosts" 2>&1 | tail -n 80
  rc=$?
  HOSTS=$(ls -d "$RES"/hosts/hosts-* 2>/dev/null | tail -1)
  [[ -n "$HOSTS" ]] && tar -czf "$OUT/hosts.tar.gz" -C "$HOSTS" .
  note "4 hosts: rc=$rc run folder ${HOSTS:-none}"
fi

# ---- 5. the emulation's calibration against the physical-host run ------------------------------------------------
if want xhosts && [[ -n "$EMU" && -n "$HOSTS" && -f "$EMU/calibration.json" ]]; then
  note "5 xhosts: start"
  timeout -k 5 "$(budget 60 70)" "$PY" - "$EMU/calibration.json" "$HOSTS" "$pace" "$OUT/xhosts" <<'PYEOF'
import json, sys
from pathlib import Path
from dblp.results import analysis
from dblp.sim.studies.crosscheck import compare, simulate_policies, transfer, write_report
cal_path, hosts, pace, out = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
pols = [p for p in ("baseline", "dblp") if (hosts / p / "records").is_dir()]
real = {p: analysis.load(hosts / p / "records") for p in pols}
rounds = 1 + max(r.round for r in real[pols[0]])
# the physical host's settings: loopback (no link to speak of: 100 Gbit/s), no loss, its pacing and rounds
cal = transfer(cal_path, {"rounds": rounds, "bandwidth_bps": 100e9, "send_rate_bps": pace, "loss": [],
                          "queue_bytes": 4 << 20})
print(f"emulation calibration {cal_path}: compute {cal.compute_s * 1e3:.2f} ms, worker {cal.send_pps:,.0f} / server "
      f"{cal.server_pps:,.0f} datagrams/s; simulated on the physical host's settings ({rounds} rounds, pacing "
      f"{pace / 1e6:.0f} Mbit/s, no bursts)")
sim = simulate_policies(cal, pols, 0.008, 0.408, out / "sim", "round")
cmp = compare(real, sim, [], real_label="hosts")
write_report(cmp, out, "Cross-check: physical host vs simulator calibrated on the EMULATION run", [])
hc = hosts / "sim_compute.json"
if hc.exists():
    c = json.loads(hc.read_text())
    print(f"compute per iteration: emulation {cal.compute_s * 1e3:.2f} ms, physical host {c['compute_s'] * 1e3:.2f} ms "
          f"({(cal.compute_s - c['compute_s']) / c['compute_s']:+.1%})")
PYEOF
  note "5 xhosts: rc=$?"
fi

# ---- 6. each paper model's compute per iteration on this device --------------------------------------------------
if want compute; then
  note "6 compute: start ($COMPUTE_ARGS)"
  # shellcheck disable=SC2086
  timeout -k 5 "$(budget 90 45)" "$PY" -m dblp.train.computetime --models efficientnet_b0,resnet50 --procs 1,3 \
    $COMPUTE_ARGS --output "$OUT/compute.json"
  note "6 compute: rc=$?"
fi

# ---- 7. the paper-scale runs predicted from the emulation's calibration ------------------------------------------
if want predict && [[ -n "$EMU" && -f "$EMU/calibration.json" ]]; then
  note "7 predict: start"
  for m in efficientnet_b0 resnet50; do
    c=$("$PY" -c "import json; print(json.load(open('$OUT/compute.json'))['$m']['3'])" 2>/dev/null)
    dev=$("$PY" -c "import json; d = json.load(open('$OUT/compute.json')); print(d['_device'], 'batch', d['_batch'])" 2>/dev/null)
    if [[ -n "$c" ]]; then
      timeout -k 5 "$(budget 45 5)" "$PY" -m dblp.sim predict --params "$EMU/calibration.json" --models "$m" \
        --compute "${c}s" --out "$OUT/predict" \
        --compute-source "measured in step 6 (python -m dblp.train.computetime: 3 processes at once on $dev)"
    else
      echo "predict $m: no measured compute (step 6): skipped"
    fi
  done
  [[ -d "$OUT/predict" ]] && tar -czf "$OUT/predict.tar.gz" --exclude='*.jsonl' -C "$OUT/predict" . && rm -rf "$OUT/predict"
  note "7 predict: done"
fi
note "gpu_emu_check: done in $((SECONDS - T0)) s"
echo "==== summary"; cat "$OUT/summary.txt"
sleep 1
