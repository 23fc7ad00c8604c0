package controlplane

import (
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/portico-edge/portico/api/agentstatus"
)

// Every edge of a group builds the same Maglev table from the same replicas, so
// a new VRRP owner or another ECMP edge sends an established flow where it
// already goes. The agents publish each VIP's table digest in their status
// Leases; the leader compares them per group and counts the agents whose tables
// differ from the rest (portico_controlplane_agents), for the alert "digests
// disagree".

// The state label of portico_controlplane_agents.
const (
	// AgentsAgreeing: every VIP's table digest is the one most of the group's
	// reporting agents have.
	AgentsAgreeing = "agreeing"
	// AgentsDisagreeing: some VIP's digest differs from the one most of the
	// group's agents have (on a tie, from the smallest of the most common).
	AgentsDisagreeing = "disagreeing"
	// AgentsStale: the Lease was not renewed within its duration: the agent is
	// gone or cannot reach the API server. Its tables are not compared.
	AgentsStale = "stale"
)

// AgentStates lists the state label's values.
var AgentStates = []string{AgentsAgreeing, AgentsDisagreeing, AgentsStale}

var agentsDesc = prometheus.NewDesc("portico_controlplane_agents",
	"Agents reporting in their status Leases, by group and state, as the leader reads them: agreeing (each VIP's table digest is the one most of the group's agents report), "+
		"disagreeing (some VIP's is not: established flows may move at a failover or an ECMP rehash), stale (the Lease was not renewed in time: the agent is gone or cannot reach the API server). "+
		"Only the leader serves it.",
	[]string{"group", "state"}, nil)

// agentTables is the part of an agent's report the comparison reads.
type agentTables struct {
	Group string `json:"group"`
	VIPs  []struct {
		VIP    string `json:"vip"`
		Digest string `json:"digest"`
	} `json:"vips"`
}

// agentsCollector serves portico_controlplane_agents from the status Leases
// at each scrape, on the leader only (one series per group and state however
// many controllers run).
type agentsCollector struct {
	leader func() bool
	leases func() []any // the Lease cache's objects; nil: not watched
	now    func() time.Time

	mu sync.Mutex
	// decoded are the Leases' reports, by Lease name, with the annotation
	// they were read from: a renewal that changes nothing is not decoded again.
	decoded map[string]decodedTables
}

type decodedTables struct {
	annotation string
	tables     agentTables
	ok         bool
}

func (a *agentsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- agentsDesc }

func (a *agentsCollector) Collect(ch chan<- prometheus.Metric) {
	if a.leader == nil || a.leases == nil || !a.leader() {
		return
	}
	objs := a.leases()
	if objs == nil {
		return
	}
	now := a.now()
	a.mu.Lock()
	seen := map[string]bool{}
	var reports []agentReportTables
	for _, o := range objs {
		l, ok := o.(*coordinationv1.Lease)
		if !ok {
			continue
		}
		seen[l.Name] = true
		ann := l.Annotations[agentstatus.AnnotationState]
		d, ok := a.decoded[l.Name]
		if !ok || d.annotation != ann {
			d = decodedTables{annotation: ann}
			d.ok = ann != "" && json.Unmarshal([]byte(ann), &d.tables) == nil && d.tables.Group != ""
			if a.decoded == nil {
				a.decoded = map[string]decodedTables{}
			}
			a.decoded[l.Name] = d
		}
		if d.ok {
			reports = append(reports, agentReportTables{tables: d.tables, fresh: renewed(l, now)})
		}
	}
	for name := range a.decoded {
		if !seen[name] {
			delete(a.decoded, name)
		}
	}
	a.mu.Unlock()
	for k, n := range agentStates(reports) {
		ch <- prometheus.MustNewConstMetric(agentsDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

// agentReportTables is one agent's tables and whether its Lease is fresh.
type agentReportTables struct {
	tables agentTables
	fresh  bool
}

// agentStates counts the agents of each group by state (AgentStates): every
// state of a group that has an agent, zeros included, so an alert on
// disagreeing has a series to compare.
func agentStates(reports []agentReportTables) map[[2]string]int {
	// votes[group][vip][digest]: fresh agents reporting that digest.
	votes := map[string]map[string]map[string]int{}
	for _, r := range reports {
		if !r.fresh {
			continue
		}
		g := votes[r.tables.Group]
		if g == nil {
			g = map[string]map[string]int{}
			votes[r.tables.Group] = g
		}
		for _, v := range r.tables.VIPs {
			if g[v.VIP] == nil {
				g[v.VIP] = map[string]int{}
			}
			g[v.VIP][v.Digest]++
		}
	}
	// majority[group][vip]: the most common digest; on a tie the smallest, so
	// the verdict does not depend on the order of the Leases.
	majority := map[string]map[string]string{}
	for group, vips := range votes {
		majority[group] = map[string]string{}
		for vip, digests := range vips {
			keys := make([]string, 0, len(digests))
			for d := range digests {
				keys = append(keys, d)
			}
			slices.Sort(keys)
			best := keys[0]
			for _, d := range keys[1:] {
				if digests[d] > digests[best] {
					best = d
				}
			}
			majority[group][vip] = best
		}
	}
	out := map[[2]string]int{}
	for _, r := range reports {
		g := r.tables.Group
		for _, s := range AgentStates {
			out[[2]string{g, s}] += 0
		}
		state := AgentsAgreeing
		switch {
		case !r.fresh:
			state = AgentsStale
		default:
			for _, v := range r.tables.VIPs {
				if majority[g][v.VIP] != v.Digest {
					state = AgentsDisagreeing
					break
				}
			}
		}
		out[[2]string{g, state}]++
	}
	return out
}
