package dataplane

import (
	"net"
	"net/netip"
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

var (
	r4MAC = mustMAC("02:00:00:00:01:04")
	r4    = Backend{Addr: netip.MustParseAddr("10.0.0.14"), MAC: r4MAC}
)

// director is one edge node's xdp_lb for the transition tests, which send the same
// changes to two of them.
type director struct {
	name string
	d    *Dataplane
}

func newDirector(t *testing.T, name string) director {
	t.Helper()
	d := loadForTest(t)
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	return director{name, d}
}

// newModelDirector is newDirector whose stack is a model (sock_model): a test
// says which connections it has.
func newModelDirector(t *testing.T, name string) director {
	t.Helper()
	d := loadWith(t, Options{RingSize: testRing, FlowEntries: 4096, sockModel: 64})
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	return director{name, d}
}

// retireCaches retires every CPU's flow cache (a new generation), keeping the
// pins: the next packet of each flow takes the slow path, as one on another CPU
// or after a ring change does.
func (dr director) retireCaches(t *testing.T) {
	t.Helper()
	dr.d.cfg.Generation++
	if err := dr.d.writeConfig(); err != nil {
		t.Fatal(err)
	}
}

func (dr director) apply(t *testing.T, want Desired) {
	t.Helper()
	if _, err := dr.d.Apply(want); err != nil {
		t.Fatalf("%s: apply: %v", dr.name, err)
	}
}

// send runs p through the director and returns the backend it went to.
func (dr director) send(t *testing.T, p xdptest.Packet, bs ...Backend) Backend {
	t.Helper()
	return dr.sendFrame(t, p.Bytes(), bs...)
}

func (dr director) sendFrame(t *testing.T, frame []byte, bs ...Backend) Backend {
	t.Helper()
	verdict, out, err := xdptest.Run(dr.d.Program(), frame)
	if err != nil {
		t.Fatalf("%s: run: %v", dr.name, err)
	}
	if verdict != xdptest.TX {
		t.Fatalf("%s: verdict %s, want TX", dr.name, xdptest.VerdictName(verdict))
	}
	for _, b := range bs {
		if net.HardwareAddr(out[0:6]).String() == b.MAC.String() {
			return b
		}
	}
	t.Fatalf("%s: sent to %s, none of the backends", dr.name, net.HardwareAddr(out[0:6]))
	return Backend{}
}

// run sends a frame through the director, wants verdict, and returns what it sent.
func (dr director) run(t *testing.T, name string, frame []byte, verdict uint32) []byte {
	t.Helper()
	v, out, err := xdptest.Run(dr.d.Program(), frame)
	if err != nil {
		t.Fatal(err)
	}
	if v != verdict {
		t.Fatalf("%s: %s: verdict %s, want %s", dr.name, name, xdptest.VerdictName(v), xdptest.VerdictName(verdict))
	}
	return out
}

// state counts the entries of flows and new_pins.
func (dr director) state(t *testing.T) (pinned, news int) {
	t.Helper()
	return entries(t, dr.d.objs.Flows), entries(t, dr.d.objs.NewPins)
}

// endTransitions makes every previous ring stop counting, as time would.
func (dr director) endTransitions(t *testing.T) {
	t.Helper()
	for vip := range dr.d.st.prevUntil {
		if err := dr.d.endTransition(vip); err != nil {
			t.Fatal(err)
		}
	}
}

// flowWhere finds a TCP flow (IPv4, ACK) from start on whose picks over the
// successive replica sets are want[i].
func flowWhere(t *testing.T, start uint16, sets [][]Backend, want ...Backend) xdptest.Packet {
	t.Helper()
	return flowWhereOf(t, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }, start, sets, want...)
}

// flowWhereOf is flowWhere for the flows mk makes.
func flowWhereOf(t *testing.T, mk func(uint16) xdptest.Packet, start uint16, sets [][]Backend, want ...Backend) xdptest.Packet {
	t.Helper()
	for sport := start; sport < start+5000; sport++ {
		p := mk(sport)
		ok := true
		for i, set := range sets {
			if pick(t, p, set...) != want[i].Addr {
				ok = false
				break
			}
		}
		if ok {
			return p
		}
	}
	t.Fatalf("no flow goes %v over %d replica sets", want, len(sets))
	return xdptest.Packet{}
}

func syn(p xdptest.Packet) xdptest.Packet { p.Flags = xdptest.SYN; return p }
