package dataplane

import (
	"fmt"
	"net/netip"
	"slices"

	"go.uber.org/zap"
)

// remoteID is a remote edge's backend for one VIP.
type remoteID struct {
	site string
	addr netip.Addr
	id   uint32
}

// Handover starts a site hand-over for the VIPs of the named group that have
// remote edges (Group.Remotes) of the named sites (all of them if none is
// named): for Options.Transition, a TCP packet that no replica of this site has
// a connection for is sent, in a tunnel, to those sites' edges (by a Maglev
// ring of them), which serve it and never send it on; this node pins what it
// sent, so the connection keeps going there after the transition. A site calls
// it when the routers may bring it connections that live at another site: as it
// starts to announce a VIP again after being away, and while another site
// drains. A VIP already in the same hand-over has its lease extended; one in
// another transition has its previous ring replaced (this site's replicas are
// asked first either way). It returns how many VIPs are in a hand-over.
func (d *Dataplane) Handover(group string, sites ...string) (int, error) {
	n, started := 0, 0
	defer func() {
		if started > 0 {
			// Every CPU's flow cache holds the rings' answers of before.
			d.cfg.Generation++
			if err := d.writeConfig(); err != nil {
				d.log.Warn("hand-over: write lb_cfg", zap.Error(err))
			}
		}
	}()
	for vip, remotes := range d.st.remotes {
		if d.st.handGroup[vip] != group {
			continue
		}
		if _, ok := d.st.rings[vip]; !ok {
			continue // no ring: nothing steers the VIP here
		}
		var members []MaglevBackend
		ids := map[netip.Addr]uint32{}
		for _, r := range remotes {
			if len(sites) == 0 || slices.Contains(sites, r.site) {
				members = append(members, MaglevBackend{Addr: r.addr})
				ids[r.addr] = r.id
			}
		}
		if len(members) == 0 {
			continue
		}
		tab, err := BuildTable(members, d.opts.RingSize)
		if err != nil {
			return n, err
		}
		slots := make([]uint32, len(tab.Slots))
		for i, s := range tab.Slots {
			slots[i] = ids[tab.Backends[s]]
		}
		if slices.Equal(d.st.handing[vip], slots) && d.st.prevUntil[vip] > monotonicNow() {
			// Renewed: the lease only (writeMeta keeps where the mid
			// rings are).
			d.st.prevUntil[vip] = monotonicNow() + d.opts.Transition
			if err := d.writeMeta(vip); err != nil {
				return n, err
			}
		} else {
			if err := d.startArrival(vip, slots); err != nil {
				return n, err
			}
			started++
		}
		d.st.handing[vip] = slots
		n++
	}
	return n, nil
}

// setTunnel writes this node's tunnel address (Desired.Tunnel) to tunnel if it
// changed.
func (d *Dataplane) setTunnel(addr netip.Addr) error {
	if addr == d.st.tunnel {
		return nil
	}
	var tc lbTunnelCfg
	if addr.IsValid() {
		tc.Src4 = addr.Unmap().As4()
	}
	if err := d.objs.Tunnel.Put(uint32(0), &tc); err != nil {
		return fmt.Errorf("update map tunnel: %w", err)
	}
	d.st.tunnel = addr
	return nil
}
