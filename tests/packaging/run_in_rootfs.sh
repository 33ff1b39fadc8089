#!/usr/bin/env bash
# Runs a program of this machine inside another root filesystem, as a container would run it:
#   run_in_rootfs.sh ROOTFS STUB_DIR SOCKET_DIR PROGRAM [ARGUMENTS...]
# In a private mount namespace (every mount goes with it; the root filesystem is left as it was):
# STUB_DIR read-only at /opt/gpuproxy/lib, SOCKET_DIR (where the daemon outside listens) at the
# same path, PROGRAM copied to /opt/gpuproxy/bin, /proc and /dev; then chroot, and PROGRAM runs
# with an empty environment but LD_LIBRARY_PATH=/opt/gpuproxy/lib and this one's GPUPROXY_*
# variables. GPUPROXY_ROOTFS_BIND, a list of directories separated by colons, mounts each
# read-only at the same path there (what an image would have at that path). Needs root. Exits
# with PROGRAM's status.
set -euo pipefail
if [[ -z ${GPUPROXY_ROOTFS_NAMESPACE:-} ]]; then
  exec env GPUPROXY_ROOTFS_NAMESPACE=1 unshare --mount --propagation private -- "$0" "$@"
fi
root=$1
stub=$2
sockets=$3
program=$4
shift 4

mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/tmp"
mkdir -p "$root/opt/gpuproxy/lib" "$root/opt/gpuproxy/bin" "$root$sockets"
mount --bind "$stub" "$root/opt/gpuproxy/lib"
mount -o remount,bind,ro "$root/opt/gpuproxy/lib"
mount --bind "$sockets" "$root$sockets"
IFS=: read -ra binds <<<"${GPUPROXY_ROOTFS_BIND:-}"
for directory in "${binds[@]}"; do
  mkdir -p "$root$directory"
  mount --bind "$directory" "$root$directory"
  mount -o remount,bind,ro "$root$directory"
done
mount -t tmpfs tmpfs "$root/opt/gpuproxy/bin"
cp "$program" "$root/opt/gpuproxy/bin/"

environment=(PATH=/usr/sbin:/usr/bin:/sbin:/bin LD_LIBRARY_PATH=/opt/gpuproxy/lib)
while IFS= read -r variable; do environment+=("$variable"); done < <(env | grep '^GPUPROXY_' |
  grep -v '^GPUPROXY_ROOTFS_' || true)
exec chroot "$root" /usr/bin/env -i "${environment[@]}" "/opt/gpuproxy/bin/$(basename "$program")" "$@"
