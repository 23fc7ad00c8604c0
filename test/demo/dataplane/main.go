// Command dataplane is `make demo` for Portico's L4 data plane: it builds a
// client, an edge node and two replica nodes out of network namespaces, loads
// xdp_lb on the edge node, gives it one VIP over both replicas, sends a bounded
// burst of UDP and TCP from the client to the VIP, prints which replica answered
// and the `portico` view of the maps, and removes everything it made.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/dataplane/xdpaux"
	"github.com/portico-edge/portico/test/netlab"
)

const (
	udpPort = 9000
	tcpPort = 8080
)

func main() {
	portico := flag.String("portico", "bin/portico", "the portico binary, for the operator view")
	flows := flag.Int("flows", 300, "UDP flows and TCP connections to send (each bounded)")
	flag.Parse()
	if err := run(*portico, *flows); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func run(portico string, flows int) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the demo needs root (network namespaces, XDP)")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	step("building the topology: client, edge node, replicas r1 and r2 on one bridge")
	lab, err := netlab.New("pd")
	if err != nil {
		return err
	}
	pin := "/sys/fs/bpf/" + lab.Prefix
	defer func() {
		step("cleaning up")
		if uerr := dataplane.Uninstall(pin); uerr != nil && err == nil {
			err = uerr
		}
		if cerr := lab.Close(); cerr != nil && err == nil {
			err = cerr
		}
		fmt.Println("removed namespaces", lab.Prefix+"*", "and", pin)
	}()
	vip := netip.MustParseAddr("10.214.0.100")
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	type node struct{ name, addr, mac string }
	nodes := map[string]*netlab.Node{}
	for _, n := range []node{
		{"cl", "10.214.0.2/24", "02:00:0a:d6:00:02"},
		{"ed", "10.214.0.10/24", "02:00:0a:d6:00:0a"},
		{"r1", "10.214.0.11/24", "02:00:0a:d6:00:0b"},
		{"r2", "10.214.0.12/24", "02:00:0a:d6:00:0c"},
	} {
		nn, err := lab.AddNode(n.name, netip.MustParsePrefix(n.addr), mac(n.mac))
		if err != nil {
			return err
		}
		nodes[n.name] = nn
		fmt.Printf("  %-3s %-15s %s (namespace %s)\n", n.name, n.addr, n.mac, nn.NS)
	}
	if err := netlab.IP("-n", nodes["ed"].NS, "addr", "add", vip.String()+"/32", "dev", "eth0"); err != nil {
		return err
	}
	for _, r := range []string{"r1", "r2"} {
		ns := nodes[r].NS
		if err := netlab.IP("-n", ns, "addr", "add", vip.String()+"/32", "dev", "lo"); err != nil {
			return err
		}
		for _, kv := range [][2]string{{"net.ipv4.conf.all.arp_ignore", "1"}, {"net.ipv4.conf.all.arp_announce", "2"}} {
			if err := netlab.Sysctl(ns, kv[0], kv[1]); err != nil {
				return err
			}
		}
	}
	fmt.Printf("  VIP %s: owned by the edge node (answers ARP), on lo of r1 and r2 (direct server return)\n", vip)
	if err := netlab.Do(lab.Switch, func() error {
		c, err := xdpaux.AttachPass(nodes["ed"].Port)
		if err == nil {
			lab.OnClose(c.Close)
		}
		return err
	}); err != nil {
		return err
	}

	step("loading xdp_lb on the edge node's eth0, maps pinned at %s", pin)
	d, err := dataplane.Load(dataplane.Options{PinPath: pin})
	if err != nil {
		return err
	}
	defer d.Close()
	if err := netlab.Do(nodes["ed"].NS, func() error { return d.Attach("eth0") }); err != nil {
		return err
	}
	want := dataplane.Desired{Seed: 0x5eed, Groups: []dataplane.Group{{
		Name:  "demo/web",
		VIPs:  []netip.Addr{vip},
		Ports: []model.Port{{Protocol: model.TCP, Port: tcpPort}, {Protocol: model.UDP, Port: udpPort}},
		Backends: []dataplane.Backend{
			{Addr: nodes["r1"].Addr.Addr(), MAC: nodes["r1"].MAC},
			{Addr: nodes["r2"].Addr.Addr(), MAC: nodes["r2"].MAC},
		},
	}}}
	if _, err := d.Apply(want); err != nil {
		return err
	}
	fmt.Printf("  VIP %s tcp/%d udp/%d -> r1, r2 (Maglev digest %s)\n", vip, tcpPort, udpPort, d.Digests()[vip])

	step("starting servers on r1 and r2 (UDP echo on %d, HTTP on %d)", udpPort, tcpPort)
	for _, r := range []string{"r1", "r2"} {
		if err := serve(lab, nodes[r], vip); err != nil {
			return err
		}
	}

	step("client sends %d UDP flows and %d TCP connections to the VIP", flows, flows)
	udpBy, udpFail := udpBurst(ctx, nodes["cl"], vip, flows)
	tcpBy, clientIPs, tcpFail := tcpBurst(ctx, nodes["cl"], vip, flows)
	report := func(proto string, by map[string]int, failed int) {
		names := make([]string, 0, len(by))
		for n := range by {
			names = append(names, n)
		}
		sort.Strings(names)
		var parts []string
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s=%d", n, by[n]))
		}
		fmt.Printf("  %s answers by replica: %s (failed %d)\n", proto, strings.Join(parts, " "), failed)
	}
	report("UDP", udpBy, udpFail)
	report("TCP", tcpBy, tcpFail)
	fmt.Printf("  client address seen by the replicas: %s (direct server return keeps it)\n", strings.Join(clientIPs, ", "))

	step("portico vips -pin %s", pin)
	if err := show(portico, "vips", "-pin", pin); err != nil {
		return err
	}
	step("portico flows -pin %s -n 8", pin)
	if err := show(portico, "flows", "-pin", pin, "-n", "8"); err != nil {
		return err
	}
	step("portico counters -pin %s", pin)
	if err := show(portico, "counters", "-pin", pin); err != nil {
		return err
	}
	if udpFail+tcpFail > 0 || len(udpBy) != 2 || len(tcpBy) != 2 {
		return fmt.Errorf("traffic did not reach both replicas cleanly")
	}
	return nil
}

func show(portico string, args ...string) error {
	cmd := exec.Command(portico, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", filepath.Base(portico), strings.Join(args, " "), err)
	}
	return nil
}

// serve starts a UDP echo and an HTTP server in a replica's namespace. Both
// answer with the replica's name; the HTTP one also with the client address.
func serve(lab *netlab.Lab, n *netlab.Node, vip netip.Addr) error {
	var uc *net.UDPConn
	var tl net.Listener
	err := netlab.Do(n.NS, func() (err error) {
		// Bound to the VIP, so replies leave from it (a wildcard socket would
		// answer from the node's own address, which the client rejects).
		if uc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: vip.AsSlice(), Port: udpPort}); err != nil {
			return err
		}
		tl, err = net.Listen("tcp4", fmt.Sprintf(":%d", tcpPort))
		return err
	})
	if err != nil {
		return err
	}
	lab.OnClose(uc.Close)
	lab.OnClose(tl.Close)
	netlab.ReadPackets(uc, 512, func(_ []byte, from net.Addr) { uc.WriteTo([]byte(n.Name), from) })
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "%s %s\n", n.Name, host)
	})}
	go srv.Serve(tl)
	return nil
}

func udpBurst(ctx context.Context, cl *netlab.Node, vip netip.Addr, flows int) (map[string]int, int) {
	by := map[string]int{}
	failed := 0
	for i := 0; i < flows && ctx.Err() == nil; i++ {
		var c *net.UDPConn
		if err := netlab.Do(cl.NS, func() (err error) {
			c, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: vip.AsSlice(), Port: udpPort})
			return err
		}); err != nil {
			failed++
			continue
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 64)
		n := 0
		_, err := c.Write([]byte("hello"))
		if err == nil {
			n, err = c.Read(buf)
		}
		c.Close()
		if err != nil {
			failed++
			continue
		}
		by[string(buf[:n])]++
	}
	return by, failed
}

func tcpBurst(ctx context.Context, cl *netlab.Node, vip netip.Addr, conns int) (map[string]int, []string, int) {
	var dialer net.Dialer
	var client *http.Client
	client = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, // one connection, one flow, per request
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = netlab.Do(cl.NS, func() error {
				c, err = dialer.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	by := map[string]int{}
	ips := map[string]bool{}
	failed := 0
	url := fmt.Sprintf("http://%s:%d/", vip, tcpPort)
	for i := 0; i < conns && ctx.Err() == nil; i++ {
		resp, err := client.Get(url)
		if err != nil {
			failed++
			continue
		}
		line, err := bufio.NewReader(io.LimitReader(resp.Body, 256)).ReadString('\n')
		resp.Body.Close()
		f := strings.Fields(line)
		if err != nil || len(f) != 2 {
			failed++
			continue
		}
		by[f[0]]++
		ips[f[1]] = true
	}
	var list []string
	for ip := range ips {
		list = append(list, ip)
	}
	sort.Strings(list)
	return by, list, failed
}
