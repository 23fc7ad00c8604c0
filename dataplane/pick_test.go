package dataplane

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// pick says which of bs the ring sends a new flow to, computed in Go from the
// table and hash definitions; a fixture uses it to choose flows that make a test
// meaningful (e.g. a flow the new ring would move).
func pick(t testing.TB, p xdptest.Packet, bs ...Backend) netip.Addr {
	t.Helper()
	return pickIn(t, testRing, p, bs...)
}

// pickIn is pick for a ring of m slots.
func pickIn(t testing.TB, m uint32, p xdptest.Packet, bs ...Backend) netip.Addr {
	t.Helper()
	var in []MaglevBackend
	for _, b := range bs {
		in = append(in, MaglevBackend{Addr: b.Addr, Weight: b.Weight})
	}
	tab, err := BuildTable(in, m)
	if err != nil {
		t.Fatal(err)
	}
	f := Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto}
	return tab.Backends[tab.Slots[FlowHash(f, testSeed)%m]]
}

// sportFor returns a source port whose flow pick sends to want.
func sportFor(t testing.TB, mk func(uint16) xdptest.Packet, want Backend, bs ...Backend) uint16 {
	t.Helper()
	return sportFrom(t, 40000, mk, want, bs...)
}

// sportFrom is sportFor searching from the port start on.
func sportFrom(t testing.TB, start uint16, mk func(uint16) xdptest.Packet, want Backend, bs ...Backend) uint16 {
	t.Helper()
	for sport := start; sport < start+1000; sport++ {
		if pick(t, mk(sport), bs...) == want.Addr {
			return sport
		}
	}
	t.Fatalf("no source port maps to %s", want.Addr)
	return 0
}

// TestHashMatchesProgram checks that FlowHash and BuildTable in Go predict the
// backend the program picks, for random v4 and v6 flows over three backends.
func TestHashMatchesProgram(t *testing.T) {
	d := loadForTest(t)
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	r4 := Backend{Addr: netip.MustParseAddr("10.0.0.14"), MAC: mustMAC("02:00:00:00:01:04")}
	if _, err := d.Apply(desired(r1, r2, r4)); err != nil {
		t.Fatal(err)
	}
	byAddr := map[netip.Addr]Backend{r1.Addr: r1, r2.Addr: r2, r4.Addr: r4}
	rng := rand.New(rand.NewPCG(7, 7))
	seen := map[netip.Addr]int{}
	for i := range 300 {
		var p xdptest.Packet
		sport := uint16(1024 + rng.IntN(60000))
		switch i % 3 {
		case 0:
			p = tcp4(sport, xdptest.SYN)
			p.Src = netip.AddrFrom4([4]byte{198, 51, byte(rng.IntN(256)), byte(rng.IntN(256))})
		case 1:
			p = udp6(sport)
		default:
			p = tcp6(sport, xdptest.SYN)
		}
		want := byAddr[pick(t, p, r1, r2, r4)]
		seen[want.Addr]++
		verdict, out, err := xdptest.Run(d.Program(), p.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if verdict != xdptest.TX || net.HardwareAddr(out[0:6]).String() != want.MAC.String() {
			t.Fatalf("flow %d: program sent to %s (%s), Go predicts %s", i, net.HardwareAddr(out[0:6]), xdptest.VerdictName(verdict), want.MAC)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("300 flows reached %d backends, want 3", len(seen))
	}
}
