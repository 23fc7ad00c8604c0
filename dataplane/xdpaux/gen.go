package xdpaux

//go:generate go tool bpf2go -tags linux -cc clang -target bpfel -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -I../../bpf/include" aux ../../bpf/aux.bpf.c
