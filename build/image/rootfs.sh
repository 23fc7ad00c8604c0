#!/usr/bin/env bash
# Builds the Debian bookworm root filesystem of Portico's container image with
# mmdebstrap (minbase: Essential + apt, no Docker), as one uncompressed tar, and caches
# it; prints the tar's path. `make image` (build/image) adds the portico binary on top.
#
#   ${PORTICO_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/image}/rootfs-<key>.tar
#
# The key is a hash of this file (suite, package list, options), the mirror and the
# epoch, so a change to any of them builds a new rootfs; anything else finds the cached
# one (~0.1 s). A cold build takes 1-3 min on 2 shared cores and needs root and mmdebstrap
# (hack/deps.sh installs it).
#
#   rootfs.sh        build the rootfs unless it is cached, print its path
#   rootfs.sh path   print the path only (the file exists when it is cached)
#
# Reproducible: every timestamp is clamped to SOURCE_DATE_EPOCH, which is the commit
# time of this file (not of the whole tree, so ordinary commits keep the cache), or
# PORTICO_ROOTFS_EPOCH when set. Two builds from the same mirror state give the same
# bytes; the mirror moves with Debian's point and security updates, which a new key
# (or an emptied cache) picks up.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"

suite=bookworm
mirror=${PORTICO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What the agent runs besides itself: nginx (nginx/runner.go execs it) with the Lua
# module its configuration loads (nginx/templates: ndk + ngx_http_lua, lua-resty-core);
# the stream module for L4 Services and njs for their PROXY protocol on UDP
# (libnginx-mod-stream, libnginx-mod-stream-js); CA certificates; iproute2 (`ip`) to inspect a node's VIPs, neighbours and XDP
# attachments from `kubectl exec`.
packages=nginx-light,libnginx-mod-http-lua,libnginx-mod-stream,libnginx-mod-stream-js,ca-certificates,iproute2

epoch=${PORTICO_ROOTFS_EPOCH:-$(git -C "$here" log -1 --format=%ct -- "$self" 2>/dev/null || true)}
epoch=${epoch:-1700000000} # outside git, or before this file's first commit
cache=${PORTICO_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portico/image}
key=$( (cat "$self"; echo "$mirror $epoch") | sha256sum | cut -c1-16)
out=$cache/rootfs-$key.tar

if [ "${1:-}" = path ] || [ -f "$out" ]; then
  echo "$out"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "rootfs: $out is not cached, and building it needs root (mmdebstrap --mode=root)" >&2
  exit 1
fi
command -v mmdebstrap >/dev/null || { echo "rootfs: mmdebstrap is missing: run hack/deps.sh" >&2; exit 1; }

mkdir -p "$cache"
tmp=$(mktemp "$cache/.rootfs-XXXXXX.tar")
trap 'rm -f "$tmp"' EXIT
echo "rootfs: building $suite with $packages (epoch $epoch; 1-3 min)" >&2
t0=$SECONDS
# Docs, man pages and locales are never unpacked (dpkg path-exclude), copyright files
# are kept; apt's lists and caches and the install logs are removed at the end, and so
# are the host's /etc/resolv.conf and /etc/hostname, which mmdebstrap copies in (they
# would make the bytes differ between machines; the container runtime mounts its own).
SOURCE_DATE_EPOCH=$epoch nice mmdebstrap --quiet --mode=root --variant=minbase --format=tar \
  --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -f "$1"/etc/resolv.conf "$1"/etc/hostname' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/cache/debconf/*-old "$1"/var/log/*.log "$1"/var/log/apt/*' \
  "$suite" "$tmp" "$mirror" \
  "deb $mirror $suite-updates main" \
  "deb ${mirror%/debian}/debian-security $suite-security main" >&2
chmod 0644 "$tmp"
mv -f "$tmp" "$out"
trap - EXIT
# Rootfs tars of earlier recipes or epochs are never used again.
find "$cache" -maxdepth 1 -name 'rootfs-*.tar' ! -name "$(basename "$out")" -delete
echo "rootfs: built $(du -h "$out" | cut -f1) in $((SECONDS - t0)) s" >&2
echo "$out"
