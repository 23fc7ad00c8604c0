package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// pccNode is one simulated edge node: its own xdp_lb and maps. Node id i has MAC
// 02:00:00:00:0a:<i> and address 10.0.1.<i>.
type pccNode struct {
	id      int
	mac     net.HardwareAddr
	addr    netip.Addr
	d       *Dataplane
	reasons []uint64 // reason_stats as last read
}

// loadPCCNodes loads the most nodes a sequence uses, once for the whole test.
func loadPCCNodes(t *testing.T) []*pccNode {
	t.Helper()
	var nodes []*pccNode
	for id := 1; id <= pccMaxNodes; id++ {
		pin := testPinPath()
		d, err := Load(Options{PinPath: pin, RingSize: testRing, FlowEntries: 4096, Transition: time.Hour, sockModel: 1 << 16})
		if err != nil {
			t.Fatalf("load node %d: %v", id, err)
		}
		t.Cleanup(func() {
			d.Close()
			if err := Uninstall(pin); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		})
		n := &pccNode{id: id, mac: mustMAC(fmt.Sprintf("02:00:00:00:0a:%02x", id)),
			addr: netip.AddrFrom4([4]byte{10, 0, 1, byte(id)}), d: d}
		if err := d.SetMAC(n.mac); err != nil {
			t.Fatal(err)
		}
		if err := n.checkFresh(); err != nil {
			t.Fatalf("node %d fresh from Load: %v", id, err)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// reset empties a node for the next sequence, as a fresh Load leaves it: no VIP,
// ring, transition, backend, peer, pin or socket, and no cached answer.
func (n *pccNode) reset() error {
	d := n.d
	if _, err := d.Apply(Desired{}); err != nil {
		return err
	}
	for vip := range d.st.prevUntil {
		if err := d.endTransition(vip); err != nil {
			return err
		}
	}
	if err := d.ClearFlows(); err != nil { // also retires every cached entry and memo
		return err
	}
	var k lbFlowKey
	for d.objs.SockModel.NextKey(nil, &k) == nil {
		if err := d.objs.SockModel.Delete(&k); err != nil {
			return fmt.Errorf("delete from sock_model: %w", err)
		}
	}
	for d.objs.UdpSeen.NextKey(nil, &k) == nil {
		if err := d.objs.UdpSeen.Delete(&k); err != nil {
			return fmt.Errorf("delete from udp_seen: %w", err)
		}
	}
	if err := d.objs.PinClock.Put(uint32(0), uint64(0)); err != nil {
		return err
	}
	d.st.nextID = 1
	return n.checkFresh()
}

// checkFresh says what a node holds that a freshly loaded one does not.
func (n *pccNode) checkFresh() error {
	d := n.d
	for _, m := range []*ebpf.Map{d.objs.Vips, d.objs.Flows, d.objs.NewPins, d.objs.SockModel, d.objs.Peers, d.objs.UdpSeen} {
		k, err := m.NextKeyBytes(nil)
		if err != nil {
			return err
		}
		if k != nil {
			return fmt.Errorf("map %v not empty", m)
		}
	}
	for vip := range uint32(4) {
		for _, outer := range []*ebpf.Map{d.objs.Rings, d.objs.PrevRings} {
			var inner *ebpf.Map
			err := outer.Lookup(vip, &inner)
			if err == nil {
				inner.Close()
				return fmt.Errorf("%v holds a ring for vip id %d", outer, vip)
			}
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
		var m lbRingMeta
		if err := d.objs.RingsMeta.Lookup(vip, &m); err != nil {
			return err
		}
		if m != (lbRingMeta{}) {
			return fmt.Errorf("vip id %d in a transition", vip)
		}
	}
	var clock uint64
	if err := d.objs.PinClock.Lookup(uint32(0), &clock); err != nil {
		return err
	}
	st, err := d.maps().read()
	if err != nil {
		return err
	}
	switch {
	case clock != 0:
		return fmt.Errorf("pin_clock %d", clock)
	case len(st.backends) > 0:
		return fmt.Errorf("%d backends", len(st.backends))
	case len(d.st.vipIDs)+len(d.st.vipKeys)+len(d.st.backends)+len(d.st.backendIDs)+len(d.st.rings)+
		len(d.st.prevUntil)+len(d.st.peers)+len(d.st.handing) > 0 || d.st.nextID != 1:
		return fmt.Errorf("applied state left: %+v", d.st)
	}
	n.reasons, err = n.countReasons()
	return err
}

// countReasons reads reason_stats, summed over CPUs.
func (n *pccNode) countReasons() ([]uint64, error) {
	cpus := ebpf.MustPossibleCPU()
	keys := make([]uint32, lbLbLimitsLB_MAX_REASONS)
	vals := make([]uint64, len(keys)*cpus)
	var cursor ebpf.MapBatchCursor
	got, err := n.d.objs.ReasonStats.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, err
	}
	out := make([]uint64, ReasonCount)
	for i := range got {
		if int(keys[i]) < ReasonCount {
			for c := range cpus {
				out[keys[i]] += vals[i*cpus+c]
			}
		}
	}
	return out, nil
}

// newReasons returns the reasons counted since the last call.
func (n *pccNode) newReasons() ([]Reason, error) {
	now, err := n.countReasons()
	if err != nil {
		return nil, err
	}
	var out []Reason
	for r := range now {
		if now[r] != n.reasons[r] {
			out = append(out, Reason(r))
		}
	}
	n.reasons = now
	return out, nil
}
