package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// setSelf writes this node's own replica address to self_addr, where chains
// are walked from (chain_next), and whether tags are on, if st does not hold
// them already.
func (d *Dataplane) setSelf(st *applied, self netip.Addr, tags bool) error {
	if st.self == self && st.tags == tags {
		return nil
	}
	sa := lbSelfAddr{Addr: addr16(self), Set: 1}
	if tags {
		sa.Tags = 1
	}
	if err := d.objs.SelfAddr.Put(uint32(0), &sa); err != nil {
		return fmt.Errorf("update map self_addr: %w", err)
	}
	st.self, st.tags = self, tags
	return nil
}

// setTagMACs makes tag_macs hold the MAC of every other edge of this site
// whose replica is a backend, by its tag, where tags are on (none where not):
// where a frame marked LB_MARK_DOWNPIN goes on to; and mac_tags their tags by
// MAC: whose tag a frame a director sent by its pin carries on a walk.
func (d *Dataplane) setTagMACs(backends map[uint32]lbBackend) error {
	want := map[uint32]lbTagMac{}
	if d.st.tags {
		for _, be := range backends {
			if be.Flags&uint16(lbBackendFlagsBACKEND_F_LOCAL|lbBackendFlagsBACKEND_F_REMOTE) != 0 || be.Mac == ([6]uint8{}) {
				continue
			}
			want[uint32(addrTag(be.Addr))] = lbTagMac{Mac: be.Mac}
		}
	}
	if d.st.tagMACs == nil {
		d.st.tagMACs = map[uint32]lbTagMac{}
	}
	for k, v := range want {
		if old, ok := d.st.tagMACs[k]; ok && old == v {
			continue
		}
		if err := d.objs.TagMacs.Put(k, &v); err != nil {
			return fmt.Errorf("update map tag_macs: %w", err)
		}
		// mac_tags is tag_macs the other way round, written with it.
		if err := d.objs.MacTags.Put(&lbPeerKey{Mac: v.Mac}, k); err != nil {
			return fmt.Errorf("update map mac_tags: %w", err)
		}
		d.st.tagMACs[k] = v
	}
	for k, v := range d.st.tagMACs {
		if _, ok := want[k]; ok {
			continue
		}
		if err := d.objs.TagMacs.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from map tag_macs: %w", err)
		}
		delete(d.st.tagMACs, k)
		// Its MAC's tag too, unless another tag has that MAC now.
		stillThere := false
		for _, w := range want {
			stillThere = stillThere || w.Mac == v.Mac
		}
		if !stillThere {
			if err := d.objs.MacTags.Delete(&lbPeerKey{Mac: v.Mac}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete from map mac_tags: %w", err)
			}
		}
	}
	return nil
}

// addrTag is an address's tag, as xdp_lb's addr_tag reads it: its last 16 bits.
func addrTag(a [16]byte) uint16 { return uint16(a[14])<<8 | uint16(a[15]) }

// tagsExact reports whether the last 16 bits of an address (xdp_lb's
// addr_tag) tell apart this node (self) and every backend of the maps: only
// then does a walked frame carry its director's tag, for the edges along the
// walk to skip (bpf/README.md). On a segment of a /16 or less it always holds.
func tagsExact(self netip.Addr, sets ...map[uint32]lbBackend) bool {
	tags := map[uint16]netip.Addr{addrTag(self.Unmap().As16()): self.Unmap()}
	for _, set := range sets {
		for _, be := range set {
			a := addrFrom16(be.Addr).Unmap()
			tag := addrTag(be.Addr)
			if other, ok := tags[tag]; ok && other != a {
				return false
			}
			tags[tag] = a
		}
	}
	return true
}
