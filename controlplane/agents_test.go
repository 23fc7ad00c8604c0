package controlplane

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/agentstatus"
)

// statusLease is an agent's status Lease publishing st, renewed at renew for
// 15 s.
func statusLease(t *testing.T, name string, st agentstatus.State, renew time.Time) *coordinationv1.Lease {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	d := int32(15)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "portico-system",
			Labels: map[string]string{agentstatus.LabelAgent: "true"}, Annotations: map[string]string{agentstatus.AnnotationState: string(b)}},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renew}, LeaseDurationSeconds: &d},
	}
}

func vips(pairs ...string) []agentstatus.VIPState {
	var out []agentstatus.VIPState
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, agentstatus.VIPState{VIP: pairs[i], Digest: pairs[i+1]})
	}
	return out
}

// TestAgentStates: agents whose table digests differ from the majority of
// their group are disagreeing, a tie is broken the same way whatever the order
// of the Leases, a stale Lease is neither compared nor counted in the majority,
// and every state of a group has a series.
func TestAgentStates(t *testing.T) {
	tables := func(group string, fresh bool, pairs ...string) agentReportTables {
		b, _ := json.Marshal(agentstatus.State{Node: "n", Group: group, VIPs: vips(pairs...)})
		var at agentTables
		if err := json.Unmarshal(b, &at); err != nil {
			t.Fatal(err)
		}
		return agentReportTables{tables: at, fresh: fresh}
	}
	type counts = map[[2]string]int
	all := func(group string, agreeing, disagreeing, stale int) counts {
		return counts{{group, AgentsAgreeing}: agreeing, {group, AgentsDisagreeing}: disagreeing, {group, AgentsStale}: stale}
	}
	merge := func(cs ...counts) counts {
		out := counts{}
		for _, c := range cs {
			for k, v := range c {
				out[k] = v
			}
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		reports []agentReportTables
		want    counts
	}{
		{name: "none", want: counts{}},
		{name: "all agree", reports: []agentReportTables{
			tables("ns/edge", true, "192.0.2.80", "aa", "192.0.2.81", "bb"),
			tables("ns/edge", true, "192.0.2.80", "aa", "192.0.2.81", "bb"),
			tables("ns/edge", true, "192.0.2.80", "aa", "192.0.2.81", "bb"),
		}, want: all("ns/edge", 3, 0, 0)},
		{name: "one differs on one VIP", reports: []agentReportTables{
			tables("ns/edge", true, "192.0.2.80", "aa", "192.0.2.81", "bb"),
			tables("ns/edge", true, "192.0.2.80", "aa", "192.0.2.81", "cc"),
			tables("ns/edge", true, "192.0.2.80", "aa", "192.0.2.81", "bb"),
		}, want: all("ns/edge", 2, 1, 0)},
		{name: "tie", reports: []agentReportTables{
			tables("ns/edge", true, "192.0.2.80", "bb"),
			tables("ns/edge", true, "192.0.2.80", "aa"),
		}, want: all("ns/edge", 1, 1, 0)},
		{name: "tie, other order", reports: []agentReportTables{
			tables("ns/edge", true, "192.0.2.80", "aa"),
			tables("ns/edge", true, "192.0.2.80", "bb"),
		}, want: all("ns/edge", 1, 1, 0)},
		{name: "stale agent neither compared nor voting", reports: []agentReportTables{
			tables("ns/edge", true, "192.0.2.80", "aa"),
			tables("ns/edge", false, "192.0.2.80", "old"),
			tables("ns/edge", false, "192.0.2.80", "old"),
		}, want: all("ns/edge", 1, 0, 2)},
		{name: "groups apart", reports: []agentReportTables{
			tables("ns/edge", true, "192.0.2.80", "aa"),
			tables("ns/edge", true, "192.0.2.80", "aa"),
			tables("other/public", true, "192.0.2.80", "zz"),
			tables("other/public", true, "192.0.2.80", "yy"),
			tables("other/public", true, "192.0.2.80", "yy"),
		}, want: merge(all("ns/edge", 2, 0, 0), all("other/public", 2, 1, 0))},
		{name: "a VIP only some agents have yet", reports: []agentReportTables{
			tables("ns/edge", true, "192.0.2.80", "aa", "192.0.2.81", "bb"),
			tables("ns/edge", true, "192.0.2.80", "aa"),
		}, want: all("ns/edge", 2, 0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, agentStates(tc.reports)); d != "" {
				t.Errorf("agentStates (-want +got):\n%s", d)
			}
		})
	}
}

// TestAgentsCollector: the leader serves portico_controlplane_agents from the
// status Leases it caches (a Lease that is no agent's or cannot be read is left
// out, one not renewed in time is stale); any other instance serves nothing.
func TestAgentsCollector(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	fresh, old := now.Add(-5*time.Second), now.Add(-time.Minute)
	leases := []any{
		statusLease(t, "a", agentstatus.State{Node: "a", Group: "portico-system/edge", VIPs: vips("192.0.2.80", "aa")}, fresh),
		statusLease(t, "b", agentstatus.State{Node: "b", Group: "portico-system/edge", VIPs: vips("192.0.2.80", "aa")}, fresh),
		statusLease(t, "c", agentstatus.State{Node: "c", Group: "portico-system/edge", VIPs: vips("192.0.2.80", "ff")}, fresh),
		statusLease(t, "d", agentstatus.State{Node: "d", Group: "portico-system/edge", VIPs: vips("192.0.2.80", "ff")}, old),
	}
	bad := statusLease(t, "e", agentstatus.State{}, fresh)
	bad.Annotations[agentstatus.AnnotationState] = "{not json"
	leases = append(leases, bad)
	leader := false
	c := &agentsCollector{leader: func() bool { return leader }, now: func() time.Time { return now }, leases: func() []any { return leases }}
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg, func() float64 { return 0 }, c); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "portico_controlplane_agents"); err != nil || n != 0 {
		t.Errorf("not the leader: %d series (%v), want none", n, err)
	}
	leader = true
	check := func(agreeing, disagreeing, stale float64) {
		t.Helper()
		for state, v := range map[string]float64{AgentsAgreeing: agreeing, AgentsDisagreeing: disagreeing, AgentsStale: stale} {
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := -1.0
			for _, mf := range mfs {
				if mf.GetName() != "portico_controlplane_agents" {
					continue
				}
				for _, m := range mf.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					if labels["group"] == "portico-system/edge" && labels["state"] == state {
						got = m.GetGauge().GetValue()
					}
				}
			}
			if got != v {
				t.Errorf("portico_controlplane_agents{state=%q} = %v, want %v", state, got, v)
			}
		}
	}
	check(2, 1, 1)
	// c catches up; d's agent is gone and its Lease deleted.
	leases = leases[:2]
	leases = append(leases, statusLease(t, "c", agentstatus.State{Node: "c", Group: "portico-system/edge", VIPs: vips("192.0.2.80", "aa")}, fresh))
	check(3, 0, 0)
	if len(c.decoded) != 3 {
		t.Errorf("%d decoded reports kept, want 3 (the Leases there are)", len(c.decoded))
	}
}
