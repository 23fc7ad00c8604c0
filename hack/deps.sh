#!/usr/bin/env bash
# Installs the Debian packages Portico's build, tests, lab and demo use.
# Idempotent: packages already present are not fetched again, and apt-get update
# runs only when something is missing.
set -euo pipefail

pkgs=(
  clang-14 llvm-14 libbpf-dev bpftool    # compile the XDP program (make generate / verify): the clang dataplane/gen.go names
  iproute2 ethtool tcpdump arping iputils-ping netcat-openbsd  # namespace lab
  iptables                               # real-cluster lab: a liveness false positive (a node's probe port blocked)
  nginx-light                            # L7 layer: nginx -t on rendered configs, real serving
  libnginx-mod-http-lua                  # L7 layer: endpoint changes without a reload (balancer_by_lua; pulls NDK, lua-resty-core)
  libnginx-mod-stream                    # L4 Services: nginx's stream module (TCP/UDP proxying)
  libnginx-mod-stream-js                 # L4 Services: njs, for the PROXY protocol on UDP (nginx/js/portico.js)
  keepalived                             # VRRP interop peer
  frr                                    # BGP interop peer (bgp/): zebra, bgpd and bfdd, one instance per namespace
  unbound                                # federation DNS (federation/gslb): a caching resolver in front of the sites' servers
  openssl                                # certificates for TLS tests and the API server
  wrk                                    # bounded load in benchmarks
  containerd runc                        # real-cluster lab (test/cluster): one containerd per kubelet node; runc, not crun
  containernetworking-plugins            # real-cluster lab: bridge + host-local CNI for the pods that are not hostNetwork
  mmdebstrap                             # make image: the Debian rootfs of the container image (build/image/rootfs.sh)
  skopeo                                 # make image's test: the OCI and docker archives are readable by another tool
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing packages (${missing[*]}) and not root: install them or run as root" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 update -qq
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts these daemons on install; Portico's tests start their own.
for svc in nginx keepalived frr unbound; do
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now "$svc" >/dev/null 2>&1 || true; fi
  if [ -f "/run/$svc.pid" ]; then kill "$(cat /run/$svc.pid)" 2>/dev/null || true; fi
done
# FRR's init script keeps its pid files under /run/frr/ (watchfrr and each daemon).
if [ -f /run/frr/watchfrr.pid ] && [ -x /usr/lib/frr/frrinit.sh ]; then /usr/lib/frr/frrinit.sh stop >/dev/null 2>&1 || true; fi
