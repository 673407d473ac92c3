#!/usr/bin/env bash
# One-command setup for a fresh Debian 12 machine (or the Vagrant VM).
#
# Installs the system tools the testbed drives (Mininet's mnexec, nftables,
# iproute2, iperf3, sudo, tcpdump) and a project virtual environment in
# ./.venv holding torch, torchvision and the project with its test extras.
# Scenarios re-exec themselves into ./.venv, so `sudo python scenarios/...`
# and plain `python scenarios/...` as root both find it.
#
# Usage (as root, from anywhere):  bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: run as root (it installs system packages)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# The C helper needs a compiler and the headers of the Python the venv is made from (gcc alone is not enough).
py_headers="$("${DBLP_PYTHON:-python3}" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)"
if ! command -v mnexec >/dev/null || ! command -v nft >/dev/null || ! command -v iperf3 >/dev/null \
   || ! command -v sudo >/dev/null || ! [ -e /usr/bin/python ] || ! command -v tcpdump >/dev/null \
   || ! command -v gcc >/dev/null || ! [ -e "$py_headers/Python.h" ] || ! command -v ping >/dev/null \
   || ! /usr/bin/python3 -c 'import numpy' 2>/dev/null || ! [ -e /usr/include/openssl/evp.h ]; then
  apt-get update -q
  # --no-install-recommends: Mininet recommends Open vSwitch, whose kernel module this
  # testbed does not need (it uses Linux bridges).
  apt-get install -y -q --no-install-recommends \
    mininet nftables iproute2 iperf3 sudo python-is-python3 python3-venv tcpdump ethtool procps iputils-ping \
    gcc python3-dev libssl-dev \
    python3-numpy  # numpy: for `mn --custom topologies/... --link tc` (the testbed's TBF link) under mn's own Python
  # gcc, python3-dev: the transport's C helper (dblp/_fastpath_c/); without a compiler the numpy path runs.
  # libssl-dev: the authenticated datagram's AES-GMAC (OpenSSL's GCM)
fi
# Intel's ipsec-mb computes the same tags ~4x faster than OpenSSL 3.0 (AVX-512 VAES/VPCLMULQDQ where the
# CPU has them); best effort: without it the C helper uses OpenSSL's GCM (dblp/_fastpath_c/mac.c).
if ! [ -e /usr/include/intel-ipsec-mb.h ]; then
  { apt-get install -y -q --no-install-recommends libipsec-mb-dev \
    || { apt-get update -q && apt-get install -y -q --no-install-recommends libipsec-mb-dev; }; } \
    || echo "setup.sh: libipsec-mb-dev not installed: datagram tags use OpenSSL's GCM (slower, same bytes)" >&2
fi

PY=${DBLP_PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch/torchvision pinned together: torch 2.13.0 alone takes a CPU build beside which torchvision
# does not import; 2.14.1 + 0.29.1 install as a pair (the CUDA build, ~5.5 GB, which also runs on CPU).
.venv/bin/python -m pip install -q torch==2.14.1 torchvision==0.29.1
.venv/bin/python -m pip install -q -e '.[dev,all]'  # all: train, gpt2, stats - the test suite uses every extra
# The helper's build is optional (the install succeeds without it), so say here when a compiler was found
# and the helper still did not build; tests/test_fastpath.py fails on the same condition.
if command -v gcc >/dev/null && ! .venv/bin/python -c 'import dblp._fastpath' 2>/dev/null; then
  echo "setup.sh: gcc is installed but the C helper dblp._fastpath did not build; rerun" \
       ".venv/bin/python -m pip install -v -e '.[dev,all]' and read the compiler output" >&2
  exit 1
fi
echo "setup.sh: ready. Test with: .venv/bin/python -m pytest"
