package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// setSelf writes this node's own replica address to self_addr, where chains
// are walked from (chain_next), which tags are on (tagsExact) and whether
// every new connection is pinned (Desired.Differ), if st does not hold them
// already.
func (d *Dataplane) setSelf(st *applied, self netip.Addr, tags lbSelfTags, differ bool) error {
	if st.self == self && st.tags == tags && st.differ == differ {
		return nil
	}
	sa := lbSelfAddr{Addr: addr16(self), Set: 1, Tags: tags}
	if differ {
		sa.Differ = 1
	}
	if err := d.objs.SelfAddr.Put(uint32(0), &sa); err != nil {
		return fmt.Errorf("update map self_addr: %w", err)
	}
	st.self, st.tags, st.differ = self, tags, differ
	return nil
}

// setTagMACs makes tag_macs hold the MAC of every other edge of this site
// whose replica is a backend, by its tag, where tags are on (none where not):
// where a frame marked LB_MARK_DOWNPIN goes on to; and mac_tags their tags by
// MAC: whose tag a frame a director sent by its pin carries on a walk.
func (d *Dataplane) setTagMACs(backends map[uint32]lbBackend) error {
	want := map[uint32]lbTagMac{}
	if d.st.tags != 0 {
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

// tagsExact says which tags tell apart this node (self) and every backend of
// the maps: SELF_TAGS where the last 16 bits of their addresses do (xdp_lb's
// addr_tag), SELF_TAGS_SHORT too where the last 12 do (an IPv4 UDP walk's
// tag). Only then does a walked frame carry its director's tag, for the edges
// along the walk to skip (bpf/README.md). On a segment of a /20 or less both
// always hold.
func tagsExact(self netip.Addr, sets ...map[uint32]lbBackend) lbSelfTags {
	out := lbSelfTagsSELF_TAGS | lbSelfTagsSELF_TAGS_SHORT
	for _, tc := range []struct {
		bit  lbSelfTags
		mask uint16
	}{{lbSelfTagsSELF_TAGS, 0xffff}, {lbSelfTagsSELF_TAGS_SHORT, 0x0fff}} {
		tags := map[uint16]netip.Addr{addrTag(self.Unmap().As16()) & tc.mask: self.Unmap()}
		for _, set := range sets {
			for _, be := range set {
				a := addrFrom16(be.Addr).Unmap()
				tag := addrTag(be.Addr) & tc.mask
				if other, ok := tags[tag]; ok && other != a {
					out &^= tc.bit
				}
				tags[tag] = a
			}
		}
	}
	return out
}
