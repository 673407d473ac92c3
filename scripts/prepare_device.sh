#!/usr/bin/env bash
# Prepare, on this (Debian 12, registry-connected) machine, what a GPU machine without ip/tc/nft,
# Mininet or a package registry needs for scripts/gpu_emu_check.sh; both folders are git-ignored and
# travel with the run tool's `carry`:
#
#   .device-tools/  Debian 12's iproute2 and nftables and the shared libraries they link (apt-get
#                   download, unpacked with dpkg-deb -x into .device-tools/root - never into /), and
#                   wrappers .device-tools/bin/{ip,tc,nft,bridge} that start each binary through the
#                   machine's own dynamic loader with --library-path: the carried libraries serve these
#                   programs only, and nothing they start (`ip netns exec ... python`) inherits them
#                   (no LD_LIBRARY_PATH);
#   .whl/           the runtime wheels the check imports that a bare torch install lacks (crc32c, simpy,
#                   scapy, cryptography, cffi, pycparser, matplotlib and its dependencies), for
#                   CPython 3.12 on manylinux x86-64 (pip download --only-binary), installed there by
#                   scripts/device_check.sh's setup step.
#
# Usage:  bash scripts/prepare_device.sh            # then: run(carry=[".whl", ".device-tools"], ...)
#         DEVICE_PY=3.11 bash scripts/prepare_device.sh    # wheels for another CPython
# Check here (no GPU needed):  .device-tools/bin/ip -V; .device-tools/bin/nft -v; .device-tools/bin/tc -V
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${DEVICE_PY:-3.12}
PIP=${PIP:-.venv/bin/pip}
T=.device-tools
rm -rf "$T" && mkdir -p "$T/debs" "$T/root" "$T/bin"

# -- 1. iproute2 + nftables and every shared library they link that is not glibc's --------------------------
progs=(/usr/sbin/ip /usr/sbin/tc /usr/sbin/bridge /usr/sbin/nft)
for p in "${progs[@]}"; do [[ -x "$p" ]] || { echo "prepare_device: $p missing here (apt-get install iproute2 nftables)" >&2; exit 2; }; done
libs=$(ldd "${progs[@]}" | awk '/=> \// {print $3}' | sort -u \
       | grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so' || true)
pkgs="iproute2 nftables"
for l in $libs; do
  pkg=$(dpkg -S "$(readlink -f "$l")" 2>/dev/null | head -1 | cut -d: -f1) || pkg=""
  [[ -z "$pkg" ]] && pkg=$(dpkg -S "$l" 2>/dev/null | head -1 | cut -d: -f1) || true
  [[ -n "$pkg" ]] && pkgs="$pkgs $pkg"
done
pkgs=$(echo "$pkgs" | tr ' ' '\n' | sort -u | tr '\n' ' ')
echo "prepare_device: Debian packages: $pkgs"
(cd "$T/debs" && apt-get download $pkgs 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
for d in "$T"/debs/*.deb; do dpkg-deb -x "$d" "$T/root"; done
libpath="\$R/lib/x86_64-linux-gnu:\$R/usr/lib/x86_64-linux-gnu:\$R/lib:\$R/usr/lib"
for name in ip tc bridge nft; do
  bin=""
  for c in sbin/$name bin/$name usr/sbin/$name usr/bin/$name; do
    if [[ -f "$T/root/$c" && ! -L "$T/root/$c" ]]; then bin=$c; break; fi
  done
  [[ -n "$bin" ]] || { echo "prepare_device: $name not in the unpacked packages" >&2; exit 2; }
  cat >"$T/bin/$name" <<EOF
#!/bin/sh
# Debian 12's $name, carried (scripts/prepare_device.sh): its own libraries, the machine's loader.
R=\$(CDPATH= cd -- "\$(dirname -- "\$0")/../root" && pwd)
for L in /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do [ -x "\$L" ] && break; done
exec "\$L" --library-path "$libpath" "\$R/$bin" "\$@"
EOF
  chmod +x "$T/bin/$name"
done
"$T/bin/ip" -V && "$T/bin/tc" -V && "$T/bin/nft" -v

# -- 2. wheels --------------------------------------------------------------------------------------------------
mkdir -p .whl
"$PIP" download -q --only-binary=:all: --python-version "$PYV" --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 -d .whl \
  crc32c simpy scapy cryptography cffi pycparser matplotlib
# numpy is the machine's own (torch's): a carried one would shadow it
rm -f .whl/numpy-*.whl
ls -la .whl "$T/bin"
du -sh .whl "$T"
echo "prepare_device: done; carry [\".whl\", \".device-tools\"] and run: bash scripts/gpu_emu_check.sh"
