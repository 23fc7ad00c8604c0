package controlplane

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

func TestParseUnmatchedHost(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        model.UnmatchedHost
		err         bool
	}{
		{name: "close", value: "close", want: model.UnmatchedHostClose},
		{name: "not found", value: "not-found", want: model.UnmatchedHostNotFound},
		{name: "spaces around", value: " not-found\n", want: model.UnmatchedHostNotFound},
		{name: "empty", value: "", err: true},
		{name: "status code", value: "404", err: true},
		{name: "upper case", value: "Not-Found", err: true},
		{name: "model spelling", value: "NotFound", err: true},
		{name: "ingress-nginx spelling", value: "default-backend", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseUnmatchedHost(tc.value)
			if (err != nil) != tc.err {
				t.Fatalf("parseUnmatchedHost(%q) error %v, want error %v", tc.value, err, tc.err)
			}
			if got != tc.want {
				t.Errorf("parseUnmatchedHost(%q) = %q, want %q", tc.value, got, tc.want)
			}
		})
	}
}

// TestUnmatchedHostAnnotation: the annotation reaches the published snapshot; a bad
// value keeps the default and is reported as the other annotations' errors are: in
// Problems() and the problems metric on every instance, and as one Warning Event on
// the group Service by the leader.
func TestUnmatchedHostAnnotation(t *testing.T) {
	c, rec := fakeController(t)
	for name, v := range map[string]string{"nf": "not-found", "bad": "not found"} {
		s := groupSvc("ns", name, 0, v1alpha1.AnnotationUnmatchedHost, v, v1alpha1.AnnotationVIP, "192.0.2.1", v1alpha1.AnnotationVRID, "7")
		if name == "bad" {
			s.Annotations[v1alpha1.AnnotationVIP], s.Annotations[v1alpha1.AnnotationVRID] = "192.0.2.2", "8"
		}
		if err := c.services.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := c.sync(ctx); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	snap := c.last
	c.mu.Unlock()
	got := map[string]model.UnmatchedHost{}
	for _, g := range snap.Groups {
		got[g.Name] = g.UnmatchedHost
	}
	if got["ns/nf"] != model.UnmatchedHostNotFound || got["ns/bad"] != model.UnmatchedHostClose {
		t.Errorf("groups' unmatched-host answers %q, want ns/nf NotFound and ns/bad the default", got)
	}
	bad := func(p model.Problem) bool {
		return p.Object == "Service ns/bad" && p.Reason == model.ReasonInvalidAnnotation &&
			p.Field == "metadata.annotations["+v1alpha1.AnnotationUnmatchedHost+"]"
	}
	if !slices.ContainsFunc(c.Problems(), bad) {
		t.Errorf("Problems() %v do not report ns/bad's annotation", c.Problems())
	}
	if slices.ContainsFunc(c.Problems(), func(p model.Problem) bool { return p.Object == "Service ns/nf" }) {
		t.Errorf("Problems() %v report ns/nf, whose annotation is valid", c.Problems())
	}
	if n := testutil.ToFloat64(c.metrics.problems.WithLabelValues(string(model.ReasonInvalidAnnotation))); n != 1 {
		t.Errorf("problems metric for InvalidAnnotation %v, want 1", n)
	}

	c.leader.Store(true)
	for range 2 {
		if err := c.sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var warnings []string
	for _, e := range drain(rec) {
		if strings.HasPrefix(e, corev1.EventTypeWarning+" "+string(model.ReasonInvalidAnnotation)) {
			warnings = append(warnings, e)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], v1alpha1.AnnotationUnmatchedHost) {
		t.Errorf("leader, two syncs: InvalidAnnotation Events %q, want one naming %s", warnings, v1alpha1.AnnotationUnmatchedHost)
	}
}
