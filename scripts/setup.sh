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
if ! command -v mnexec >/dev/null || ! command -v nft >/dev/null || ! command -v iperf3 >/dev/null \
   || ! command -v sudo >/dev/null || ! [ -e /usr/bin/python ] || ! command -v tcpdump >/dev/null \
   || ! command -v gcc >/dev/null; then
  apt-get update -q
  # --no-install-recommends: Mininet recommends Open vSwitch, whose kernel module this
  # testbed does not need (it uses Linux bridges).
  apt-get install -y -q --no-install-recommends \
    mininet nftables iproute2 iperf3 sudo python-is-python3 python3-venv tcpdump ethtool procps \
    gcc python3-dev  # the transport's optional C helper (dblp/_fastpath.c); without them the numpy path runs
fi

PY=${DBLP_PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch/torchvision pinned to the builds that pip takes from this machine's disk
# (see DESIGN.md); the CUDA build also runs on CPU.
.venv/bin/python -m pip install -q torch==2.14.1 torchvision==0.29.1
.venv/bin/python -m pip install -q -e '.[dev]'
echo "setup.sh: ready. Test with: .venv/bin/python -m pytest"
