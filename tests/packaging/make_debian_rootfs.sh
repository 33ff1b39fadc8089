#!/usr/bin/env bash
# Makes a minimal Debian root filesystem for SUITE at DIR with debootstrap (minbase variant, from
# Debian's registry), once: a later run finds it complete and returns at once. Set-up for the
# packaging tests, which run programs through the stub on an older glibc and libstdc++ than the
# build machine's.
#
# Usage: make_debian_rootfs.sh SUITE DIR
# Exits 0 when DIR holds the root filesystem. Where it cannot be made (not root, no debootstrap,
# the registry unreachable), exits 77 (ctest's skip) and writes the reason to DIR.unavailable,
# which the tests report.
set -uo pipefail
suite=$1
dir=$2
mirror=${GPUPROXY_DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [[ -f $dir/.gpuproxy-complete ]]; then exit 0; fi
mkdir -p "$(dirname "$dir")"
rm -f "$dir.unavailable"
unavailable() {
  echo "no Debian $suite root filesystem: $*" | tee "$dir.unavailable" >&2 2>/dev/null
  exit 77
}
if [[ $(id -u) -ne 0 ]]; then unavailable "debootstrap and chroot need root"; fi
if ! command -v debootstrap >/dev/null; then
  unavailable "debootstrap is not installed (scripts/install-deps installs it)"
fi

echo "gpuproxy: debootstrap --variant=minbase $suite from $mirror (once; log: $dir.log)"
rm -rf "$dir.partial"
if ! debootstrap --variant=minbase "$suite" "$dir.partial" "$mirror" >"$dir.log" 2>&1; then
  rm -rf "$dir.partial"
  unavailable "debootstrap $suite from $mirror failed ($(tail -n 1 "$dir.log")); see $dir.log"
fi
touch "$dir.partial/.gpuproxy-complete"
rm -rf "$dir"
mv "$dir.partial" "$dir"
