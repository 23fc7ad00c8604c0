package dataplane

// The committed objects are what clang 14 (Debian's clang-14, which
// hack/deps.sh installs) makes of bpf/: another clang emits other bytes, and
// make verify would fail, so the compiler is named with its version. linux/types.h
// includes asm/types.h from the host's multiarch include directory, which that
// clang names (x86_64-linux-gnu, aarch64-linux-gnu, ...).
//go:generate sh -c "go tool bpf2go -tags linux -cc clang-14 -target bpfel -cflags \"-O2 -mcpu=v3 -g -Wall -Werror -I/usr/include/$(clang-14 -print-multiarch) -I../bpf/include\" -type vip_key -type vip_val -type backend -type flow_key -type flow_val -type flow_cache_entry -type lb_config -type vip_counters -type backend_counters -type reason -type lb_limits -type backend_flags -type vip_flags -type peer_key -type site_peer_key -type ring_meta -type cache_pin -type self_tags -type tunnel_cfg lb ../bpf/lb.bpf.c"
