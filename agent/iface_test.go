package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/portico-edge/portico/api/v1alpha1"
)

func TestParseIfaces(t *testing.T) {
	for _, tc := range []struct {
		list    string
		want    []string
		wantErr string
	}{
		{list: "eth0", want: []string{"eth0"}},
		{list: "bond0,eth0", want: []string{"bond0", "eth0"}},
		{list: " bond0 , eth0.100 ", want: []string{"bond0", "eth0.100"}},
		{list: "a-name-of-15-by", want: []string{"a-name-of-15-by"}},
		{list: "", wantErr: "empty"},
		{list: "eth0,", wantErr: "empty"},
		{list: "a-name-of-16-byt", wantErr: "longer than 15"},
		{list: "eth0:1", wantErr: "not an interface name"},
		{list: "a/b", wantErr: "not an interface name"},
		{list: "eth 0", wantErr: "not an interface name"},
		{list: "..", wantErr: "not an interface name"},
	} {
		got, err := ParseIfaces(tc.list)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseIfaces(%q) = %v, %v; want an error with %q", tc.list, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseIfaces(%q) = %q, %v; want %q", tc.list, got, err, tc.want)
		}
	}
}

// TestPickIface: the node's annotation, when set, names the candidates in
// place of --iface; the first candidate on the node is chosen, and the ones
// skipped are reported; none on the node is an error that says which list
// named them.
func TestPickIface(t *testing.T) {
	onNode := func(names ...string) func(string) bool {
		return func(n string) bool { return slices.Contains(names, n) }
	}
	for _, tc := range []struct {
		name       string
		iface      string
		annotation string
		annotated  bool
		present    func(string) bool
		want       IfaceChoice
		wantErr    string
	}{
		{name: "flag", iface: "eth0", present: onNode("lo", "eth0"),
			want: IfaceChoice{Name: "eth0", Source: IfaceFromFlag, Candidates: []string{"eth0"}}},
		{name: "flag, the first candidate on the node", iface: "bond0,eth1,eth0", present: onNode("eth0", "eth1"),
			want: IfaceChoice{Name: "eth1", Source: IfaceFromFlag, Candidates: []string{"bond0", "eth1", "eth0"}, Absent: []string{"bond0"}}},
		{name: "annotation replaces the flag", iface: "eth0", annotation: "eth1", annotated: true, present: onNode("eth0", "eth1"),
			want: IfaceChoice{Name: "eth1", Source: IfaceFromAnnotation, Candidates: []string{"eth1"}}},
		{name: "annotation with candidates", iface: "eth0", annotation: "bond1, eth2", annotated: true, present: onNode("eth0", "eth2"),
			want: IfaceChoice{Name: "eth2", Source: IfaceFromAnnotation, Candidates: []string{"bond1", "eth2"}, Absent: []string{"bond1"}}},
		{name: "flag, none on the node", iface: "bond0,eth9", present: onNode("eth0"),
			wantErr: "edge interface of node n1: none of bond0, eth9 (--iface) is on the node; name the node's own in its annotation portico.io/iface"},
		// The operator named this node's interface: the agent does not fall
		// back to --iface's, even when that one is on the node.
		{name: "annotation, none on the node", iface: "eth0", annotation: "bond1", annotated: true, present: onNode("eth0"),
			wantErr: "edge interface of node n1: none of bond1 (node annotation portico.io/iface) is on the node"},
		{name: "annotation not a name", iface: "eth0", annotation: "eth0:1", annotated: true, present: onNode("eth0"),
			wantErr: `edge interface of node n1, node annotation portico.io/iface "eth0:1": "eth0:1" is not an interface name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pickIface("n1", tc.iface, tc.annotation, tc.annotated, tc.present)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("choice (-want +got):\n%s", d)
			}
		})
	}
}

// TestChooseIface reads the Node as the agent does at start (a fake
// clientset): its annotation, none, no such Node, and the API server failing
// (retried) or refusing (not retried).
func TestChooseIface(t *testing.T) {
	node := func(name string, annotations map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}}
	}
	present := func(n string) bool { return n == "eth0" || n == "eth1" }
	fast := wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 5, Cap: 10 * time.Millisecond}
	unavailable := apierrors.NewServiceUnavailable("starting")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "", errors.New("no rule"))
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		fail    []error // the first lists' errors
		want    IfaceChoice
		lists   int // lists made
		wantErr string
	}{
		{name: "annotated node", objects: []runtime.Object{node("n1", map[string]string{v1alpha1.AnnotationIface: "bond0,eth1"}), node("n2", nil)},
			want:  IfaceChoice{Name: "eth1", Source: IfaceFromAnnotation, Candidates: []string{"bond0", "eth1"}, Absent: []string{"bond0"}},
			lists: 1},
		// Another node's annotation is not this one's (the fake clientset
		// ignores the field selector; the API server applies it).
		{name: "node without the annotation", objects: []runtime.Object{node("n1", map[string]string{"other": "x"}), node("n2", map[string]string{v1alpha1.AnnotationIface: "eth1"})},
			want: IfaceChoice{Name: "eth0", Source: IfaceFromFlag, Candidates: []string{"eth0"}}, lists: 1},
		{name: "empty annotation", objects: []runtime.Object{node("n1", map[string]string{v1alpha1.AnnotationIface: ""})},
			want: IfaceChoice{Name: "eth0", Source: IfaceFromFlag, Candidates: []string{"eth0"}}, lists: 1},
		{name: "no such Node", want: IfaceChoice{Name: "eth0", Source: IfaceFromFlag, Candidates: []string{"eth0"}}, lists: 1},
		{name: "API server unavailable, then the node", objects: []runtime.Object{node("n1", map[string]string{v1alpha1.AnnotationIface: "eth1"})},
			fail: []error{unavailable, unavailable}, want: IfaceChoice{Name: "eth1", Source: IfaceFromAnnotation, Candidates: []string{"eth1"}}, lists: 3},
		{name: "refused", fail: []error{forbidden}, lists: 1, wantErr: "read node n1 for its annotation portico.io/iface: nodes is forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objects...)
			lists := 0
			client.PrependReactor("list", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
				lists++
				if f := a.(k8stesting.ListAction).GetListRestrictions().Fields.String(); f != "metadata.name=n1" {
					t.Errorf("nodes listed with the field selector %q, want this node's name alone", f)
				}
				if lists <= len(tc.fail) {
					return true, nil, tc.fail[lists-1]
				}
				return false, nil, nil
			})
			got, err := chooseIface(context.Background(), client, "n1", "eth0", present, fast, zaptest.NewLogger(t))
			if lists != tc.lists {
				t.Errorf("%d lists of nodes, want %d", lists, tc.lists)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("choice (-want +got):\n%s", d)
			}
		})
	}

	// Retries end with the context (SIGTERM while the API server is away).
	client := fake.NewClientset()
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, unavailable })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := chooseIface(ctx, client, "n1", "eth0", present, fast, zaptest.NewLogger(t)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v after the context ended, want context.DeadlineExceeded", err)
	}
}
