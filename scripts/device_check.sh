#!/usr/bin/env bash
# One GPU-machine session of checks, prepared so that a single call of at most ~8 minutes covers them:
#   1.  setup: the runtime packages that machine lacks (crc32c, simpy, scapy, cryptography, cffi, pycparser:
#       carried as wheels in .whl/), the C helper dblp._fastpath built there for its Python (with the
#       OpenSSL 3.0 and Python 3.12 headers carried in .whl/ where the machine has none), and what the
#       machine is (OS, Python, torch, CUDA, GPU);
#   2.  scripts/gpu_check.sh: the paper's four models train a few steps on CUDA over the real DBLP
#       transport on loopback (pinned staging, step and exchange time, finite loss);
#   2b. CUDA gradients (one flat fp32 tensor; a list of fp16 + fp32 tensors, as DDP's buckets) through a
#       real server and 2 workers under the reliable policy: the exact mean, back on the GPU, pinned staging;
#   3.  the training tests (tests/train, tests/test_fastpath.py, tests/test_sharded.py) under that
#       machine's Python, torch and numpy, with a GPU present;
#   4.  scenarios/train.py: baseline vs DBLP, small_cnn, 2 workers on loopback, the workers on CUDA.
# Each step runs under `timeout` and a failed step does not stop the later ones; the steps' timeouts
# shrink so that the whole script ends within DC_BUDGET (450 s). Logs in $OUT, 7 files: summary.txt
# (one line per step), device_check.log (everything), gpu_check.log, pytest_train.log, pytest_train.xml,
# train_scenario.log, train_results.tar.gz.
#
# Why the wheels go to /tmp/site AND a .pth file: subprocesses that the tests and the scenario start
# set PYTHONPATH to the repository alone (tests/train/test_ddp_dblp.py, test_ddp_torchrun.py,
# scenarios/train.py), so PYTHONPATH=/tmp/site does not reach them; a .pth file in the interpreter's
# site-packages does.
#
# Usage (device machine, repository root, `.whl` carried):  bash scripts/device_check.sh
# Local dry run (CPU; in a copy of the tree, since setup rebuilds dblp/_fastpath*.so in place):
#   OUT=/tmp/dc DC_PY=/work/main/.venv/bin/python DC_PTH=0 DC_SITE=/tmp/dc_none \
#   DC_GC_ARGS="--device cpu --steps 2 --batch 2" bash /copy/scripts/device_check.sh
# (DC_SITE elsewhere than a /tmp/site holding cp312 wheels: those would shadow a Python 3.11 venv's own packages.)
set -uo pipefail  # no -e: every step is guarded, and a failed step must not stop the later ones
cd "$(dirname "$0")/.."
source scripts/lib/check_steps.sh  # check_log, note, want, budget: the steps' rules, shared with the other checks
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device_check_out}
rm -f /tmp/dc_exchange.txt
PY=${DC_PY:-python3}
SITE=${DC_SITE:-/tmp/site}
STEPS=${DC_STEPS:-setup gpu exchange pytest train}
TRAIN_ARGS=${DC_TRAIN_ARGS:---workload small_cnn --workers 2 --epochs 20}
BUDGET=${DC_BUDGET:-450}  # seconds for the whole script; the run call's timeout_s leaves ~30 s beyond it
FLOOR=10  # the shortest timeout a step gets
check_log device_check
export PYTHON=$PY  # scripts/gpu_check.sh takes its interpreter from here
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there: never wait on the hub
note "device_check: steps [$STEPS], python $PY, OUT $OUT, budget $BUDGET s"

# ---- 1. setup -------------------------------------------------------------------------------------
build_ext() {  # the C helper for this interpreter; optional=True in setup.py, so success = it imports
  # this interpreter's .so only, and a fresh build folder: setuptools would copy a stale .so in place
  rm -rf "dblp/_fastpath$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" /tmp/dc_build
  timeout -k 5 "$(budget 90 280)" "$PY" setup.py -q build_ext --inplace --force --build-temp /tmp/dc_build/temp \
    --build-lib /tmp/dc_build/lib >/tmp/dc_build_ext.txt 2>&1
  tail -n 25 /tmp/dc_build_ext.txt
  "$PY" -c 'import dblp._fastpath as f; print("dblp._fastpath:", f.__file__, "crc:", f.BEST, "gmac:", f.MAC)'
}
if want setup; then
  note "1 setup: start"
  uname -a; grep -E '^PRETTY_NAME=' /etc/os-release; nproc; free -g | head -2
  timeout 30 nvidia-smi || echo "nvidia-smi failed"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && note "1 setup: wheels installed in $SITE" || note "1 setup: WHEEL INSTALL FAILED"
  if [[ "${DC_PTH:-1}" == 1 ]]; then
    pth="$("$PY" -c 'import site; print(site.getsitepackages()[0])')/dblp_device_site.pth"
    echo "$SITE" >"$pth" && note "1 setup: $pth -> $SITE" || note "1 setup: could not write $pth"
  fi
  # the check that matters: a subprocess whose PYTHONPATH is the repository alone finds the packages
  if ! env PYTHONPATH="$PWD" "$PY" -c 'import crc32c, simpy, cryptography.hazmat.primitives.ciphers.aead' 2>/dev/null; then
    note "1 setup: .pth not effective: installing the wheels into the repository root instead"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$PWD" .whl/*.whl
  fi
  timeout 60 env PYTHONPATH="$PWD" "$PY" -c 'import crc32c, simpy, scapy, cryptography, numpy, torch
print("imports with PYTHONPATH=repo only: ok; cryptography", cryptography.__version__, "numpy", numpy.__version__)' \
    && note "1 setup: packages importable by subprocesses" || note "1 setup: PACKAGES NOT IMPORTABLE by subprocesses"
  timeout 60 "$PY" - <<'PYEOF'
import sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "cudnn", torch.backends.cudnn.version())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.0f} GiB", f"cc {p.major}.{p.minor}", p.multi_processor_count, "SMs")
try:
    import transformers; print("transformers", transformers.__version__)
except Exception as e: print("transformers missing:", e)
PYEOF
  # C helper: as the machine is; else with the carried OpenSSL 3.0 / Python 3.12 headers (used only where the
  # machine has none: -idirafter), linked against the machine's own libcrypto.so.3; else the numpy/crc32c path.
  if out=$(build_ext 2>&1); then
    echo "$out"; note "1 setup: C helper built with the machine's headers"
  else
    echo "$out"
    echo "C helper did not build as the machine is: retrying with the carried headers"
    hdr=/tmp/dc_hdr; rm -rf "$hdr"; mkdir -p "$hdr/lib"
    dpkg-deb -x .whl/libssl-dev_*.deb "$hdr/ssl" || echo "dpkg-deb failed"
    tar -xzf .whl/python3.12-include.tar.gz -C "$hdr" || echo "tar failed"
    crypto=$(ldconfig -p | awk '/libcrypto\.so\.3 .*x86-64/ {print $NF; exit}')
    [[ -n "$crypto" ]] || crypto=$(ls /usr/lib/x86_64-linux-gnu/libcrypto.so.3 /lib/x86_64-linux-gnu/libcrypto.so.3 2>/dev/null | head -1)
    echo "libcrypto: ${crypto:-none found}"
    [[ -n "$crypto" ]] && ln -sf "$crypto" "$hdr/lib/libcrypto.so"
    if out=$(CFLAGS="-idirafter $hdr/ssl/usr/include -idirafter $hdr/ssl/usr/include/x86_64-linux-gnu -idirafter $hdr/python3.12" \
             LDFLAGS="-L$hdr/lib" build_ext 2>&1); then
      echo "$out"; note "1 setup: C helper built with the carried headers"
    else
      echo "$out"
      note "1 setup: C helper NOT built: the numpy/crc32c paths run (same bytes, ~10x slower exchange)"
    fi
  fi
  note "1 setup: done"
fi

# ---- 2. the four paper models on CUDA over DBLP ----------------------------------------------------
# 10 steps each: ~1-2 min with the C helper (gpt2_s's 124M-float exchange, ~2 s a round, dominates);
# without it the exchange is ~10x slower, so 4 steps then.
if "$PY" -c 'import dblp._fastpath' 2>/dev/null; then GC_ARGS=${DC_GC_ARGS:---steps 10 --batch 64}
else GC_ARGS=${DC_GC_ARGS:---steps 4 --batch 64}; fi
if want gpu; then
  note "2 gpu_check: start ($GC_ARGS)"
  # shellcheck disable=SC2086
  timeout -k 10 "$(budget 200 165)" bash scripts/gpu_check.sh $GC_ARGS 2>&1 | tee "$OUT/gpu_check.log"
  note "2 gpu_check: rc=$?"
fi

# ---- 2b. CUDA gradients through the real exchange: exact mean, back on the GPU, pinned staging ----
if want exchange; then
  note "2b cuda exchange: start"
  timeout -k 10 "$(budget 60 150)" "$PY" - <<'PYEOF' 2>&1 | tee /tmp/dc_exchange.txt
import sys, threading, time, torch
from dblp.protocol.policy import ReliablePolicy
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.transport.worker import Worker

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
n, rounds = 4_000_037, 3  # not a multiple of a chunk
gen = torch.Generator().manual_seed(0)
flat = [torch.randn(n, generator=gen) for _ in range(2)]
parts = [[torch.randn(1_000_003, generator=gen).half(), torch.randn(n - 1_000_003, generator=gen)] for _ in range(2)]
srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=2, rounds=rounds, policy=ReliablePolicy(),
                                   peer_timeout=60))
threading.Thread(target=srv.serve, daemon=True).start()
got, errs = {}, []

def work(rank):
    try:
        with Worker("127.0.0.1", srv.port, elements=n, worker_id=rank, peer_timeout=60, secret=srv.secret) as w:
            t = time.perf_counter()
            a = w.allreduce(flat[rank].to(dev))                   # one flat gradient (the training loop)
            b = w.allreduce([p.to(dev) for p in parts[rank]])     # a list of mixed dtypes (DDP buckets)
            c = w.allreduce(flat[rank].to(dev))                   # the pinned buffers reused
            got[rank] = (a, b, c, w.staging.pinned, time.perf_counter() - t)
    except BaseException as e:  # noqa: BLE001
        errs.append(e)

ts = [threading.Thread(target=work, args=(r,)) for r in range(2)]
[t.start() for t in ts]; [t.join(120) for t in ts]
if errs:
    raise errs[0]
want_flat = (flat[0] + flat[1]) * 0.5  # the reliable policy's mean, as DDP's (g0 + g1) / 2
want_parts = [((p0.float() + p1.float()) * 0.5).to(p0.dtype) for p0, p1 in zip(*parts)]
ok = len(got) == 2
for r, (a, b, c, pinned, secs) in sorted(got.items()):
    same = [torch.equal(a.cpu(), want_flat), torch.equal(c.cpu(), want_flat),
            all(torch.equal(x.cpu(), y) for x, y in zip(b, want_parts))]
    where = {str(x.device) for x in (a, c, *b)}
    diff = max(float((a.cpu() - want_flat).abs().max()), float((b[1].cpu() - want_parts[1]).abs().max()))
    print(f"rank {r}: exact {same}, max |diff| {diff:g}, on {sorted(where)}, list dtypes {[str(x.dtype) for x in b]}, "
          f"pinned {pinned}, 3 rounds of {n} floats in {secs:.2f} s")
    ok &= all(same) and where == {"cpu" if dev.type == "cpu" else "cuda:0"} and (pinned or dev.type == "cpu")
print("cuda_exchange:", "OK" if ok else "MISMATCH", "on", dev)
sys.exit(0 if ok else 1)
PYEOF
  note "2b cuda exchange: rc=$?"
fi

# ---- 3. training tests with the GPU present ------------------------------------------------------
if want pytest; then
  note "3 pytest: start"
  timeout -k 10 "$(budget 150 75)" "$PY" -m pytest -q tests/train tests/test_fastpath.py tests/test_sharded.py \
    -p no:cacheprovider --timeout 120 -rs --durations=10 --junitxml="$OUT/pytest_train.xml" 2>&1 \
    | tee "$OUT/pytest_train.log"
  rc=$?
  note "3 pytest: rc=$rc ($(tail -n 1 "$OUT/pytest_train.log"))"
fi

# ---- 4. baseline vs DBLP, real training, workers on CUDA -------------------------------------------
if want train; then
  note "4 train scenario: start ($TRAIN_ARGS)"
  res=/tmp/dc_train_results; rm -rf "$res"
  # shellcheck disable=SC2086
  timeout -k 10 "$(budget 110 10)" "$PY" scenarios/train.py $TRAIN_ARGS --results "$res" 2>&1 \
    | tee "$OUT/train_scenario.log"
  rc=$?
  if [[ -d "$res" ]]; then  # the run folder: summary.csv/json, curves.png, config, records and worker logs
    tar -czf "$OUT/train_results.tar.gz" -C "$res" . && ls -la "$OUT/train_results.tar.gz"
  fi
  note "4 train scenario: rc=$rc"
fi
note "device_check: done in $((SECONDS - T0)) s"
# the essentials again at the end, where the run tool's output tail shows them
echo "==== summary"; cat "$OUT/summary.txt"
echo "==== gpu_check"; cat "$OUT/gpu_check.log" 2>/dev/null
echo "==== cuda exchange"; tail -n 3 /tmp/dc_exchange.txt 2>/dev/null
sleep 1  # let the tee behind `exec` write the last lines before $OUT is collected
