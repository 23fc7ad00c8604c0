package steer

// Compiled like package dataplane's objects (see its gen.go): clang 14, the
// multiarch include directory that clang names.
//go:generate sh -c "go tool bpf2go -tags linux -cc clang-14 -target bpfel -cflags \"-O2 -g -Wall -Werror -I/usr/include/$(clang-14 -print-multiarch) -I../../bpf/include\" -type steer_key -type steer_cfg -type steer_reason -type steer_class steer ../../bpf/steer.bpf.c"
