#!/usr/bin/env bash
# The packaged_tree fixture: scripts/package's tarball, made from this build tree and unpacked
# into an empty directory, which the `packaged` test runs take gpuproxyd, gpuproxyctl and the stub
# from (GPUPROXY_TEST_INSTALL_ROOT).
# usage: unpack_package.sh PACKAGE_SCRIPT BUILD_DIR ROOT
set -euo pipefail
package_script=$1 build_dir=$2 root=$3
tarball=$build_dir/package/gpuproxy-under-test.tar.gz
GPUPROXY_BUILD_DIR=$build_dir "$package_script" --output "$tarball" >/dev/null
rm -rf "$root"
mkdir -p "$root"
tar -xzf "$tarball" -C "$root"
echo "unpacked $tarball into $root"
