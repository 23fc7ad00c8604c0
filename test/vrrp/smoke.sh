#!/usr/bin/env bash
# Smoke test of the `portico vrrp` command on its own: two network namespaces
# joined by a veth, one announcer in each (run from flags, one from a config
# file), check the higher priority holds the VIP, serves metrics, and that the
# other takes over when it is killed. Needs root. Touches only the namespaces it
# creates (names pv<random>-a/-b) and removes them on exit.
set -euo pipefail

bin=${1:-bin/portico}
[[ $(id -u) == 0 ]] || { echo "smoke.sh: needs root" >&2; exit 1; }
[[ -x $bin ]] || { echo "smoke.sh: $bin not built (make build)" >&2; exit 1; }

p=pv$(head -c2 /dev/urandom | od -An -tx1 | tr -d ' \n')
a=$p-a b=$p-b vip=10.98.0.100
tmp=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	ip netns del "$a" 2>/dev/null || true
	ip netns del "$b" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

ip netns add "$a"
ip netns add "$b"
ip -n "$a" link add eth0 type veth peer name eth0 netns "$b"
ip -n "$a" addr add 10.98.0.1/24 dev eth0
ip -n "$b" addr add 10.98.0.2/24 dev eth0
ip -n "$a" link set lo up
ip -n "$b" link set lo up
ip -n "$a" link set eth0 up
ip -n "$b" link set eth0 up

has_vip() { ip -n "$1" -o addr show dev eth0 | grep -q " $vip/32 "; }
wait_for() { # wait_for SECONDS CMD...: poll every 50ms
	local n=$(($1 * 20)); shift
	for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.05; done
	return 1
}

ip netns exec "$a" "$bin" vrrp -iface eth0 -vrid 7 -priority 200 -advert-interval 100ms \
	-vip "$vip" -metrics-addr 127.0.0.1:9105 2>"$tmp/a.log" &
pids+=($!)
cat >"$tmp/b.json" <<JSON
{"interface": "eth0", "instances": [{"vrid": 7, "priority": 100, "advert_interval": "100ms", "vips": ["$vip"]}]}
JSON
ip netns exec "$b" "$bin" vrrp -config "$tmp/b.json" 2>"$tmp/b.log" &
pids+=($!)

wait_for 5 has_vip "$a" || { echo "FAIL: a never became Master"; cat "$tmp"/*.log; exit 1; }
sleep 0.5
has_vip "$b" && { echo "FAIL: both hold the VIP"; cat "$tmp"/*.log; exit 1; }
echo "ok: a (priority 200) is Master"
metrics=$(ip netns exec "$a" curl -fsS http://127.0.0.1:9105/metrics 2>/dev/null ||
	ip netns exec "$a" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9105; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3')
grep -q '^portico_vrrp_state{instance="vrid-7"} 2' <<<"$metrics" || { echo "FAIL: metrics do not say master"; exit 1; }
echo "ok: metrics report state 2 (master)"

kill -9 "${pids[0]}"
wait_for 5 has_vip "$b" || { echo "FAIL: b did not take over"; cat "$tmp"/*.log; exit 1; }
echo "ok: b took over after kill -9 of a"
grep -q '"msg":"vrrp state changed".*"from":"backup","to":"master"' "$tmp/b.log" || { echo "FAIL: no transition log line"; exit 1; }
echo "ok: transition logged"
kill -TERM "${pids[1]}"
wait_for 5 bash -c "! kill -0 ${pids[1]} 2>/dev/null" || { echo "FAIL: b did not stop on SIGTERM"; exit 1; }
has_vip "$b" && { echo "FAIL: b kept the VIP after a graceful stop"; exit 1; }
echo "ok: graceful stop removed the VIP"
echo PASS
