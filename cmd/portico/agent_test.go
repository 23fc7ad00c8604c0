package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap/zapcore"

	"github.com/portico-edge/portico/agent"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/liveness"
)

func TestParseAgentFlags(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c agentFlags)
	}{
		{name: "flags", args: []string{"-group", "edge/web", "-iface", "eth0", "-node-name", "n1", "-vip-pool", "10.0.0.0/24!10.0.0.1; 2001:db8::/120"},
			check: func(t *testing.T, c agentFlags) {
				if c.Group != "edge/web" || c.Iface != "eth0" || c.Node != "n1" || len(c.Pools) != 2 {
					t.Errorf("config %+v", c)
				}
				if len(c.Pools[0].Exclude) != 1 {
					t.Errorf("pool exclusions %v", c.Pools[0].Exclude)
				}
			}},
		{name: "numbers and defaults", args: []string{"-group", "edge/web", "-iface", "eth0", "-node-name", "n1", "-hash-seed", "7",
			"-nginx-status-port", "10248", "-liveness-rise", "3", "-vrrp-priority", "150", "-vrrp-degraded-priority", "20", "-vrrp-version", "2"},
			check: func(t *testing.T, c agentFlags) {
				want := agent.Config{Group: "edge/web", Iface: "eth0", Node: "n1", PodNamespace: "portico-system",
					Seed: 7, PinPath: dataplane.DefaultPinPath, RingSize: dataplane.DefaultRingSize, NginxDir: "/var/lib/portico/nginx",
					AccessLog: "stdout", AccessLogSample: 0.01,
					HTTPPort: 80, HTTPSPort: 443, StatusPort: 10248, MetricsAddr: ":9101", LivenessPort: 10247, L4SteerPort: 10242,
					Liveness:     liveness.Timing{Interval: 20 * time.Millisecond, DeadAfter: 200 * time.Millisecond, Rise: 3, FlapWindow: 10 * time.Second, ReloadGrace: time.Second},
					VRRPPriority: 150, VRRPDegraded: 20, VRRPVersion: 2, VRRPInterval: 100 * time.Millisecond, VRRPUnicast: true,
					StateDir: agent.DefaultStateDir, ShutdownDelay: 5 * time.Second, Announce: "vrrp", BGPPeerObjects: true, ClaimIface: "eth0", ClaimLogLevel: "info",
					XDPMode: dataplane.XDPBestEffort, Transition: dataplane.DefaultTransition}
				if diff := cmp.Diff(want, c.Config, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
					t.Errorf("config (-want +got):\n%s", diff)
				}
				if c.logLevel.Level != zapcore.InfoLevel || c.kubeconfig != "" {
					t.Errorf("log level %v, kubeconfig %q", c.logLevel, c.kubeconfig)
				}
			}},
		{name: "L4 TCP ports with listeners of their own", args: []string{"-group", "edge/web", "-iface", "eth0", "-node-name", "n1", "-l4-steer-port", "0"},
			check: func(t *testing.T, c agentFlags) {
				if c.L4SteerPort != 0 {
					t.Errorf("L4SteerPort %d, want 0", c.L4SteerPort)
				}
			}},
		{name: "downward API environment", args: []string{"-group", "edge/web"},
			env: map[string]string{"NODE_NAME": "n2", "POD_NAMESPACE": "portico", "PORTICO_IFACE": "eno1", "PORTICO_VRRP_INTERVAL": "50ms"},
			check: func(t *testing.T, c agentFlags) {
				if c.Node != "n2" || c.PodNamespace != "portico" || c.Iface != "eno1" || c.VRRPInterval.Milliseconds() != 50 {
					t.Errorf("config %+v", c)
				}
			}},
		{name: "flag beats environment", args: []string{"-group", "edge/web", "-iface", "eth1", "-node-name", "n3"},
			env: map[string]string{"PORTICO_IFACE": "eno1", "NODE_NAME": "other"},
			check: func(t *testing.T, c agentFlags) {
				if c.Iface != "eth1" || c.Node != "n3" {
					t.Errorf("config %+v", c)
				}
			}},
		{name: "own pod", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-pod", "portico-system/portico-agent-x7k2p"},
			check: func(t *testing.T, c agentFlags) {
				if c.Pod != "portico-system/portico-agent-x7k2p" {
					t.Errorf("pod %q", c.Pod)
				}
			}},
		{name: "own pod without namespace", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-pod", "portico-agent-x7k2p"},
			wantErr: "-pod"},
		{name: "API server", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-apiserver", "https://10.251.0.1:6443"},
			check: func(t *testing.T, c agentFlags) {
				if c.APIServer != "https://10.251.0.1:6443" {
					t.Errorf("API server %q", c.APIServer)
				}
			}},
		{name: "metrics and liveness on the node's address (IPv6)", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n"},
			env: map[string]string{"PORTICO_NODE_IP": "fd00:251::11", "PORTICO_METRICS_ADDR": ":9102"},
			check: func(t *testing.T, c agentFlags) {
				if c.MetricsAddr != "[fd00:251::11]:9102" || c.NodeIP != netip.MustParseAddr("fd00:251::11") {
					t.Errorf("metrics address %q, node IP %v; want [fd00:251::11]:9102, fd00:251::11", c.MetricsAddr, c.NodeIP)
				}
			}},
		{name: "log level", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-log-level", "debug"},
			check: func(t *testing.T, c agentFlags) {
				// The agents of the IngressClaims it provisions log alike.
				if c.logLevel.Level != zapcore.DebugLevel || c.ClaimLogLevel != "debug" {
					t.Errorf("log level %v, claim agents' %q; want debug", c.logLevel, c.ClaimLogLevel)
				}
			}},
		{name: "log level from the environment", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n"},
			env: map[string]string{"PORTICO_LOG_LEVEL": "error"},
			check: func(t *testing.T, c agentFlags) {
				if c.logLevel.Level != zapcore.ErrorLevel {
					t.Errorf("log level %v, want error", c.logLevel)
				}
			}},
		{name: "log level unknown", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-log-level", "loud"},
			wantErr: `invalid value "loud" for flag -log-level: want debug, info, warn or error`},
		{name: "log level zap has but the chart does not offer", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-log-level", "fatal"},
			wantErr: "-log-level"},
		{name: "log level unknown in the environment", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n"},
			env: map[string]string{"PORTICO_LOG_LEVEL": "loud"}, wantErr: "environment for -log-level"},
		{name: "interface candidates", args: []string{"-group", "a/b", "-iface", "bond0, eth0", "-node-name", "n"},
			check: func(t *testing.T, c agentFlags) {
				// The agent picks among them on its node (agent.ChooseIface); a
				// claim's agents get the same list.
				if c.Iface != "bond0, eth0" || c.ClaimIface != "bond0, eth0" {
					t.Errorf("iface %q, claim iface %q", c.Iface, c.ClaimIface)
				}
			}},
		{name: "interface name Linux refuses", args: []string{"-group", "a/b", "-iface", "eth0,eth0:1", "-node-name", "n"}, wantErr: "-iface"},
		{name: "empty interface candidate", args: []string{"-group", "a/b", "-iface", "eth0,", "-node-name", "n"}, wantErr: "-iface"},
		{name: "claim interface Linux refuses", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-claim-iface", "a-name-of-20-bytes.."}, wantErr: "-claim-iface"},
		{name: "an argument that is no flag", args: []string{"-group", "a/b", "-iface", "eth0", "pprof", "-node-name", "n"}, wantErr: `"pprof": not a flag`},
		{name: "node IP not an address", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-node-ip", "node-1"}, wantErr: "-node-ip"},
		{name: "API server not https", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-apiserver", "http://10.0.0.1"}, wantErr: "-apiserver"},
		{name: "API server with a path", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-apiserver", "https://k/api"}, wantErr: "-apiserver"},
		{name: "L4 steer port leaves no room for the PROXY listener", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-l4-steer-port", "65535"}, wantErr: "-l4-steer-port"},
		{name: "seed too big", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-hash-seed", "4294967296"}, wantErr: "-hash-seed"},
		{name: "seed file not a number", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-hash-seed-file", seedFile(t, "0xnope")}, wantErr: "-hash-seed-file"},
		{name: "seed file", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-hash-seed", "7", "-hash-seed-file", seedFile(t, " 3141592653\n")},
			check: func(t *testing.T, c agentFlags) {
				if c.Seed != 3141592653 {
					t.Errorf("seed %d, want the file's 3141592653", c.Seed)
				}
			}},
		{name: "seed file with leading zeros (decimal, not octal)", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-hash-seed-file", seedFile(t, "000000089")},
			check: func(t *testing.T, c agentFlags) {
				if c.Seed != 89 {
					t.Errorf("seed %d, want 89", c.Seed)
				}
			}},
		{name: "seed file in hex", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-hash-seed-file", seedFile(t, "0x706F7275")},
			check: func(t *testing.T, c agentFlags) {
				if c.Seed != 0x706f7275 {
					t.Errorf("seed %#x, want 0x706f7275", c.Seed)
				}
			}},
		{name: "seed file absent (an install older than per-install seeds)", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n",
			"-hash-seed-file", filepath.Join(t.TempDir(), "seed")},
			check: func(t *testing.T, c agentFlags) {
				if c.Seed != legacySeed {
					t.Errorf("seed %#x, want the legacy %#x", c.Seed, legacySeed)
				}
			}},
		{name: "group required", args: []string{"-iface", "eth0", "-node-name", "n"}, wantErr: "-group"},
		{name: "group needs a namespace", args: []string{"-group", "web", "-iface", "eth0", "-node-name", "n"}, wantErr: "-group"},
		{name: "node required", args: []string{"-group", "a/b", "-iface", "eth0"}, wantErr: "-node-name"},
		{name: "bad pool", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-vip-pool", "10.0.0.0/33"}, wantErr: "-vip-pool"},
		{name: "bad environment value", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n"},
			env: map[string]string{"PORTICO_VRRP_PRIORITY": "high"}, wantErr: "vrrp-priority"},
		{name: "port out of range", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-https-port", "70000"}, wantErr: "ports"},
		{name: "liveness off", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-liveness-port", "0", "-liveness-rise", "0"},
			check: func(t *testing.T, c agentFlags) {
				if c.LivenessPort != 0 {
					t.Errorf("liveness port %d", c.LivenessPort)
				}
			}},
		{name: "liveness dead-after below the interval", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-liveness-dead-after", "10ms"}, wantErr: "liveness"},
		{name: "liveness rise zero", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-liveness-rise", "0"}, wantErr: "liveness"},
		{name: "bgp", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n1", "-announce", "bgp", "-bgp-config", bgpFile(t, goodBGP)},
			check: func(t *testing.T, c agentFlags) {
				if c.Announce != "bgp" || c.BGP.ASN != 64512 || len(c.BGP.Peers) != 2 || c.BGP.BFDProfiles[0].TransmitInterval.Duration != 50*time.Millisecond {
					t.Errorf("bgp config %+v", c.BGP)
				}
				sc, err := agent.SpeakerConfig(c.BGP, "n1", netip.MustParseAddr("10.0.0.11"), netip.Addr{})
				if err != nil || len(sc.Peers) != 1 || sc.Peers[0].BFD == nil || sc.Peers[0].BFD.Multiplier != 3 || sc.GracefulRestart {
					t.Errorf("n1's speaker config %+v (%v): want the one peer for every node, with BFD, no graceful restart", sc, err)
				}
				sc, err = agent.SpeakerConfig(c.BGP, "n2", netip.MustParseAddr("10.0.0.12"), netip.Addr{})
				if err != nil || len(sc.Peers) != 2 {
					t.Errorf("n2's speaker config %+v (%v): want both peers", sc, err)
				}
			}},
		{name: "bgp without a file", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-announce", "bgp"}, wantErr: "-bgp-config"},
		{name: "bgp unknown field", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-announce", "bgp", "-bgp-config", bgpFile(t, goodBGP+"\nholdtime: 3s\n")}, wantErr: "holdtime"},
		{name: "bgp unknown profile", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-announce", "bgp",
			"-bgp-config", bgpFile(t, "asn: 64512\npeers:\n- {address: 10.0.0.1, asn: 65000, bfdProfile: nope}\n")}, wantErr: "nope"},
		{name: "bgp no peer for this node", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n9", "-announce", "bgp", "-bgp-peer-objects=false",
			"-bgp-config", bgpFile(t, "asn: 64512\npeers:\n- {address: 10.0.0.1, asn: 65000, nodes: [n1]}\n")}, wantErr: "no peer"},
		// BGPPeer objects may bring its peers.
		{name: "bgp no file peer for this node, peer objects", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n9", "-announce", "bgp",
			"-bgp-config", bgpFile(t, "asn: 64512\npeers: []\n")},
			check: func(t *testing.T, c agentFlags) {
				if !c.BGPPeerObjects || c.BGP.ASN != 64512 {
					t.Errorf("BGPPeerObjects %v, asn %d: want true, 64512", c.BGPPeerObjects, c.BGP.ASN)
				}
			}},
		{name: "bgp bad community", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-announce", "bgp",
			"-bgp-config", bgpFile(t, "asn: 64512\npeers:\n- {address: 10.0.0.1, asn: 65000, communities: [\"x:y\"]}\n")}, wantErr: "communit"},
		{name: "unknown announcer", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-announce", "ospf"}, wantErr: "-announce"},
		{name: "reserved ports", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-metrics-addr", "10.0.0.1:9200"},
			env: map[string]string{"PORTICO_RESERVED_PORTS": "9100/tcp, 53/UDP"},
			check: func(t *testing.T, c agentFlags) {
				r := agent.ReservedPorts(c.Config)
				for p, what := range map[model.Port]string{
					{Protocol: model.TCP, Port: 9100}: "reserved by the operator (-reserved-ports)", {Protocol: model.UDP, Port: 53}: "reserved by the operator (-reserved-ports)",
					{Protocol: model.TCP, Port: 80}: "nginx's HTTP", {Protocol: model.TCP, Port: 443}: "nginx's HTTPS",
					{Protocol: model.TCP, Port: 10246}: "nginx's status", {Protocol: model.TCP, Port: 10247}: "the liveness checks",
					{Protocol: model.TCP, Port: 9200}: "the agent's metrics", {Protocol: model.TCP, Port: 22}: "ssh",
					{Protocol: model.TCP, Port: 10250}: "the kubelet", {Protocol: model.UDP, Port: 3784}: "BFD",
				} {
					if r[p] != what {
						t.Errorf("%s/%d reserved for %q, want %q", p.Protocol, p.Port, r[p], what)
					}
				}
				if by, ok := r[model.Port{Protocol: model.UDP, Port: 9100}]; ok {
					t.Errorf("9100/udp reserved (%s): only 9100/tcp was asked", by)
				}
			}},
		{name: "reserved port without a protocol", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-reserved-ports", "9100"}, wantErr: "-reserved-ports"},
		{name: "reserved port zero", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-reserved-ports", "0/tcp"}, wantErr: "-reserved-ports"},
		{name: "reserved port sctp", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-reserved-ports", "9/sctp"}, wantErr: "-reserved-ports"},
		{name: "xdp mode native", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-xdp-mode=native"},
			check: func(t *testing.T, c agentFlags) {
				if c.XDPMode != dataplane.XDPNative {
					t.Errorf("xdp mode %q, want native", c.XDPMode)
				}
			}},
		{name: "xdp mode from the environment", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n"},
			env: map[string]string{"PORTICO_XDP_MODE": "native"},
			check: func(t *testing.T, c agentFlags) {
				if c.XDPMode != dataplane.XDPNative {
					t.Errorf("xdp mode %q, want native", c.XDPMode)
				}
			}},
		{name: "xdp mode unknown", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-xdp-mode", "generic"},
			wantErr: `-xdp-mode "generic": want native or best-effort`},
		{name: "xdp mode empty", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-xdp-mode="},
			wantErr: `-xdp-mode "": want native or best-effort`},
		{name: "degraded not below priority", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-vrrp-priority", "10"}, wantErr: "priority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseAgentFlags(tc.args, env(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// goodBGP is a BGP configuration with a peer for every node and one for n2 only.
const goodBGP = `asn: 64512
bfdProfiles:
- {name: fast, transmitInterval: 50ms, receiveInterval: 50ms, detectMultiplier: 3}
peers:
- address: 10.0.0.1
  asn: 65000
  holdTime: 3s
  keepaliveInterval: 1s
  bfdProfile: fast
- {address: 10.0.0.2, asn: 65000, nodes: [n2]}
`

// bgpFile writes a BGP configuration file for one test case.
func bgpFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bgp.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// seedFile is a file holding text, for -hash-seed-file.
func seedFile(t *testing.T, text string) string {
	p := filepath.Join(t.TempDir(), "seed")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
