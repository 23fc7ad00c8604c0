package dataplane

//go:generate go tool bpf2go -tags linux -cc clang -target bpfel -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -I../bpf/include" -type vip_key -type vip_val -type backend -type flow_key -type flow_val -type flow_cache_entry -type lb_config -type vip_counters -type backend_counters -type reason -type lb_limits -type backend_flags lb ../bpf/lb.bpf.c
