package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/dataplane/pins"
)

// Reason is why xdp_lb gave a packet its verdict (bpf/lb_types.h, enum reason).
type Reason = lbReason

// The reasons of a site hand-over (Dataplane.Handover): a packet sent to another
// site's edge through a tunnel, and one taken out of a tunnel here.
const (
	ReasonSiteOut = lbReasonREASON_SITE_OUT
	ReasonSiteIn  = lbReasonREASON_SITE_IN
)

// ReasonCount is the number of reasons; reasons are 0..ReasonCount-1.
const ReasonCount = int(lbReasonREASON_MAX)

// reasonNames holds each reason's label, read from the BTF of the embedded object
// so the C enum stays the only list of reasons.
var reasonNames = sync.OnceValue(func() []string {
	names := make([]string, ReasonCount)
	for i := range names {
		names[i] = fmt.Sprintf("reason_%d", i)
	}
	spec, err := loadLb()
	if err != nil {
		return names
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName("reason", &e); err != nil {
		return names
	}
	for _, v := range e.Values {
		if v.Value < uint64(len(names)) {
			names[v.Value] = strings.ToLower(strings.TrimPrefix(v.Name, "REASON_"))
		}
	}
	return names
})

// ReasonName returns a reason's label: the C name without REASON_, lower case.
func ReasonName(r Reason) string {
	if int(r) < ReasonCount {
		return reasonNames()[r]
	}
	return fmt.Sprintf("reason_%d", r)
}

// Counters are the program's per-CPU counters, summed over CPUs.
type Counters struct {
	Reasons  [ReasonCount]uint64
	VIPs     map[uint32]VIPCounters     // by VIP id
	Backends map[uint32]BackendCounters // by backend id
}

// VIPCounters are one VIP's counters.
type VIPCounters struct{ Packets, Bytes, NewFlows, FlowHits uint64 }

// BackendCounters are one backend's counters.
type BackendCounters struct{ Packets, Bytes uint64 }

// maps is the set of pinned maps the readers need, whether this process loaded
// the program (Dataplane) or only opened the pins (Inspector).
type maps struct {
	vips, backends, flows, rings, cfg, vipStats, backendStats, reasonStats, ringsMeta *ebpf.Map
	prevRings, midRings, newPins                                                      *ebpf.Map
}

func (d *Dataplane) maps() maps {
	o := d.objs.lbMaps
	return maps{o.Vips, o.Backends, o.Flows, o.Rings, o.LbCfg, o.VipStats, o.BackendStats, o.ReasonStats, o.RingsMeta,
		o.PrevRings, o.MidRings, o.NewPins}
}

// Counters reads every counter.
func (d *Dataplane) Counters() (Counters, error) {
	m := d.maps()
	st, err := m.read()
	if err != nil {
		return Counters{}, err
	}
	return m.counters(st)
}

// NewFlows sums the new connections (SYNs) this node directed to the given VIP
// addresses (their vip_stats new_flows), for a load estimate; VIPs not in the
// maps count nothing.
func (d *Dataplane) NewFlows(vips []netip.Addr) (uint64, error) {
	var n uint64
	var vs []lbVipCounters
	for _, a := range vips {
		id, ok := d.st.vipIDs[a.Unmap()]
		if !ok {
			continue
		}
		if err := d.objs.VipStats.Lookup(id, &vs); err != nil {
			return n, &mapReadError{lbMapVipStats, err}
		}
		for _, v := range vs {
			n += v.NewFlows
		}
	}
	return n, nil
}

// mapReadError is a failed read of one map. Its map name is the label of
// portico_xdp_scrape_errors, bounded by the maps a scrape reads.
type mapReadError struct {
	name string
	err  error
}

func (e *mapReadError) Error() string { return fmt.Sprintf("read map %s: %v", e.name, e.err) }
func (e *mapReadError) Unwrap() error { return e.err }

// mapState is what vips and backends hold, read once per scrape or view.
type mapState struct {
	vips     map[lbVipKey]lbVipVal
	backends map[uint32]lbBackend // active entries only
	retired  map[uint32]lbBackend // cleared entries that keep a removed replica's address
}

// vipAddrs maps VIP ids to their addresses.
func (st mapState) vipAddrs() map[uint32]netip.Addr {
	out := map[uint32]netip.Addr{}
	for k, v := range st.vips {
		out[v.VipId] = addrFrom16(k.Addr)
	}
	return out
}

// read reads vips (a small hash) and backends (an array: one batch lookup).
func (m maps) read() (mapState, error) {
	st := mapState{vips: map[lbVipKey]lbVipVal{}, backends: map[uint32]lbBackend{}, retired: map[uint32]lbBackend{}}
	var vk lbVipKey
	var vv lbVipVal
	it := m.vips.Iterate()
	for it.Next(&vk, &vv) {
		st.vips[vk] = vv
	}
	if err := it.Err(); err != nil {
		return st, &mapReadError{lbMapVips, err}
	}
	n := int(m.backends.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]lbBackend, n)
	var cursor ebpf.MapBatchCursor
	for got := 0; got < n; {
		c, err := m.backends.BatchLookup(&cursor, keys[got:], vals[got:], nil)
		for i := got; i < got+c; i++ {
			switch {
			case vals[i].Flags&uint16(lbBackendFlagsBACKEND_F_ACTIVE) != 0:
				st.backends[keys[i]] = vals[i]
			case vals[i].Addr != [16]byte{}:
				st.retired[keys[i]] = vals[i]
			}
		}
		got += c
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return st, &mapReadError{lbMapBackends, err}
		}
	}
	return st, nil
}

func (m maps) counters(st mapState) (Counters, error) {
	c := Counters{VIPs: map[uint32]VIPCounters{}, Backends: map[uint32]BackendCounters{}}
	var perCPU []uint64
	for r := range ReasonCount {
		if err := m.reasonStats.Lookup(uint32(r), &perCPU); err != nil {
			return c, &mapReadError{lbMapReasonStats, err}
		}
		for _, v := range perCPU {
			c.Reasons[r] += v
		}
	}
	// Only ids in use are read: VIP ids from vips, backend ids from backends.
	for _, vv := range st.vips {
		if _, seen := c.VIPs[vv.VipId]; seen {
			continue
		}
		var vs []lbVipCounters
		if err := m.vipStats.Lookup(vv.VipId, &vs); err != nil {
			return c, &mapReadError{lbMapVipStats, err}
		}
		var sum VIPCounters
		for _, v := range vs {
			sum.Packets += v.Packets
			sum.Bytes += v.Bytes
			sum.NewFlows += v.NewFlows
			sum.FlowHits += v.FlowHits
		}
		c.VIPs[vv.VipId] = sum
	}
	for id := range st.backends {
		var bs []lbBackendCounters
		if err := m.backendStats.Lookup(id, &bs); err != nil {
			return c, &mapReadError{lbMapBackendStats, err}
		}
		var sum BackendCounters
		for _, v := range bs {
			sum.Packets += v.Packets
			sum.Bytes += v.Bytes
		}
		c.Backends[id] = sum
	}
	return c, nil
}

// Collector exports the BPF counters as Prometheus metrics, read from the maps on
// every scrape, and the mode the program is attached in. Labels are bounded:
// reasons and modes are fixed enums, VIPs and backends are bounded by the map
// sizes, failed reads are labelled by map name.
type Collector struct {
	m                                   maps
	log                                 *zap.Logger
	mode                                func() AttachMode // nil: not exported
	pinned                              []pins.Result     // what Load did with the pinned maps
	attachMode, pinnedMaps, lostEntries *prometheus.Desc
	reasons, vipPackets, vipBytes       *prometheus.Desc
	vipNewFlows, vipFlowHits, bePackets *prometheus.Desc
	beBytes, scrapeErrors               *prometheus.Desc
}

// NewCollector returns a collector over d's maps. Register it with a
// prometheus.Registerer.
// A failed read is logged to d's logger.
func NewCollector(d *Dataplane) *Collector {
	c := newCollector(d.maps())
	c.log, c.mode, c.pinned = d.log, d.AttachMode, d.PinnedMaps()
	return c
}

func newCollector(m maps) *Collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("portico", "xdp", name), help, labels, nil)
	}
	return &Collector{
		m:            m,
		log:          zap.NewNop(),
		reasons:      desc("packets_total", "Packets seen by xdp_lb, by the reason for their verdict.", "reason"),
		vipPackets:   desc("vip_packets_total", "Packets steered for a VIP.", "vip"),
		vipBytes:     desc("vip_bytes_total", "Bytes steered for a VIP (whole frames).", "vip"),
		vipNewFlows:  desc("vip_new_flows_total", "Flows created in the flow table for a VIP.", "vip"),
		vipFlowHits:  desc("vip_flow_hits_total", "Packets of a VIP that found their flow in the flow table.", "vip"),
		bePackets:    desc("backend_packets_total", "Packets sent to a backend.", "vip", "backend"),
		beBytes:      desc("backend_bytes_total", "Bytes sent to a backend.", "vip", "backend"),
		scrapeErrors: desc("scrape_errors", "1 if reading a BPF map failed on this scrape, by map.", "map"),
		pinnedMaps: desc("pinned_maps", "The pinned maps by what this agent's start did with them: new (none was pinned), kept (pinned "+
			"in this layout), adopted (pinned without a layout version, of this layout), migrated (copied entry by entry from an older "+
			"layout), lost (an older layout with no conversion: the map started empty).", "outcome"),
		lostEntries: desc("pinned_entries_lost", "Entries of an older layout of a pinned map that this agent's start left behind "+
			"(no conversion, or one that dropped them): 0 unless an upgrade lost state.", "map"),
		attachMode: desc("attach_mode", "1 for the mode xdp_lb runs in on the edge interface, 0 for the other: "+
			"native (in the driver) or generic (after the kernel allocated the packet; --xdp-mode=best-effort where native failed).", "mode"),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.reasons, c.vipPackets, c.vipBytes, c.vipNewFlows, c.vipFlowHits, c.bePackets, c.beBytes, c.scrapeErrors,
		c.attachMode, c.pinnedMaps, c.lostEntries} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.pinned != nil {
		n := map[pins.Outcome]int{}
		for _, r := range c.pinned {
			n[r.Outcome]++
			lost := r.Dropped
			if r.Outcome == pins.Lost {
				lost += r.Entries
			}
			ch <- prometheus.MustNewConstMetric(c.lostEntries, prometheus.GaugeValue, float64(lost), r.Map)
		}
		for _, o := range pins.Outcomes {
			ch <- prometheus.MustNewConstMetric(c.pinnedMaps, prometheus.GaugeValue, float64(n[o]), string(o))
		}
	}
	if c.mode != nil {
		// Neither is 1 before Attach, or when the mode of a pinned link could
		// not be read.
		cur := c.mode()
		for _, m := range AttachModes {
			v := 0.0
			if m == cur {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.attachMode, prometheus.GaugeValue, v, string(m))
		}
	}
	st, err := c.m.read()
	if err != nil {
		c.scrapeError(ch, err)
		return
	}
	cnt, err := c.m.counters(st)
	if err != nil {
		c.scrapeError(ch, err)
		return
	}
	addrs := st.vipAddrs()
	for r, v := range cnt.Reasons {
		ch <- prometheus.MustNewConstMetric(c.reasons, prometheus.CounterValue, float64(v), ReasonName(Reason(r)))
	}
	for id, v := range cnt.VIPs {
		vip := addrs[id].String()
		ch <- prometheus.MustNewConstMetric(c.vipPackets, prometheus.CounterValue, float64(v.Packets), vip)
		ch <- prometheus.MustNewConstMetric(c.vipBytes, prometheus.CounterValue, float64(v.Bytes), vip)
		ch <- prometheus.MustNewConstMetric(c.vipNewFlows, prometheus.CounterValue, float64(v.NewFlows), vip)
		ch <- prometheus.MustNewConstMetric(c.vipFlowHits, prometheus.CounterValue, float64(v.FlowHits), vip)
	}
	for id, be := range st.backends {
		v := cnt.Backends[id]
		vip, backend := addrs[be.VipId].String(), addrFrom16(be.Addr).String()
		ch <- prometheus.MustNewConstMetric(c.bePackets, prometheus.CounterValue, float64(v.Packets), vip, backend)
		ch <- prometheus.MustNewConstMetric(c.beBytes, prometheus.CounterValue, float64(v.Bytes), vip, backend)
	}
}

// scrapeError reports a failed read: logged, and counted under the map's name.
func (c *Collector) scrapeError(ch chan<- prometheus.Metric, err error) {
	c.log.Warn("read bpf maps for metrics failed", zap.Error(err))
	name := "unknown"
	if me, ok := errors.AsType[*mapReadError](err); ok {
		name = me.name
	}
	ch <- prometheus.MustNewConstMetric(c.scrapeErrors, prometheus.GaugeValue, 1, name)
}

// reasonSummary renders the non-zero reason counters as "name=n ...".
func (c Counters) reasonSummary() string {
	var parts []string
	for r, v := range c.Reasons {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", ReasonName(Reason(r)), v))
		}
	}
	return strings.Join(parts, " ")
}

// DescribeMetrics registers on reg a Collector's series, with no data plane
// behind them (Describe alone works): for the generated metrics table
// (hack/metricsdoc).
func DescribeMetrics(reg prometheus.Registerer) error {
	return reg.Register(newCollector(maps{}))
}
