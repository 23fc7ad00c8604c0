package lease

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/portico-edge/portico/api/agentstatus"
)

// TestStatusLeases: states published in Leases read back as written, renewed in
// place, stale once not renewed in time; an unreadable report is left out.
func TestStatusLeases(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	write := func(st agentstatus.State) {
		t.Helper()
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if err := Write(ctx, client, "portico-system", st.Node, b, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC().Truncate(time.Second)
	a := agentstatus.State{Node: "a", Group: "edge/web", Healthy: true, VRRP: map[string]string{"edge/web/v4": "master"}, Updated: now}
	b := agentstatus.State{Node: "b", Group: "edge/web", Reason: "starting", VRRP: map[string]string{}, Updated: now}
	write(b)
	write(agentstatus.State{Node: "a", Group: "edge/web", Reason: "starting", VRRP: map[string]string{}, Updated: now})
	write(a) // a renewal
	if err := Write(ctx, client, "portico-system", "c", []byte("not json"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// b stopped renewing long ago.
	leases := client.CoordinationV1().Leases("portico-system")
	l, err := leases.Get(ctx, agentstatus.LeaseName("b"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Minute)}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	states, stale, err := ReadStates(ctx, client, "portico-system")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]agentstatus.State{a, b}, states); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]bool{"a": false, "b": true}, stale); diff != "" {
		t.Errorf("stale (-want +got):\n%s", diff)
	}
}
