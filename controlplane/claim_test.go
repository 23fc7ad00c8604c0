package controlplane

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/deploy"
)

// agentFlags reads --name=value arguments after the subcommand into a map.
func agentFlags(args []string) map[string]string {
	flags := map[string]string{}
	for _, a := range args[1:] {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		flags[k] = v
	}
	return flags
}

// TestClaimDaemonSetDerivesFromAgentManifest: a claim's DaemonSet is the one of
// deploy/agent.yaml (update strategy, tolerations, priority, grace period, the whole
// pod) with only what a claim changes: its name, namespace, labels, selector and
// owner, its nodes (the operator's selector narrowed by the template's) and the
// operator's interface (never the template's, nor its ServiceAccount), the group,
// the Lease namespace, the image, API server, log level and XDP mode (when given) and the
// leader's pools.
func TestClaimDaemonSetDerivesFromAgentManifest(t *testing.T) {
	pool4, err := ParsePool("203.0.113.0/28!203.0.113.1")
	if err != nil {
		t.Fatal(err)
	}
	pool6, err := ParsePool("2001:db8::/120")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		template v1alpha1.ReplicaTemplate
		pools    []Pool
		groupNS  []string
		reserved map[model.Port]string
		image    string // "": the manifest's
		api      string // the leader's --apiserver ("": none)
		logLevel string // the leader's --log-level ("": the manifest's)
		iface    string // the operator's --claim-iface
		xdpMode  string // the leader's --xdp-mode ("": the manifest's)
		nodes    map[string]string
		// selector and flags are what the claim changes in the manifest's pod.
		selector map[string]string
		flags    map[string]string
	}{
		{
			name: "template, operator's placement and pools",
			// The template asks for another interface, ServiceAccount and
			// edge label: the operator's are used; its zone narrows.
			template: v1alpha1.ReplicaTemplate{NodeSelector: map[string]string{"portico.io/edge": "false", "zone": "a"}, Interface: "bond0", ServiceAccountName: "shop-admin"},
			pools:    []Pool{pool4, pool6},
			groupNS:  []string{"portico-system", "shop"},
			reserved: map[model.Port]string{{Protocol: model.UDP, Port: 53}: "dns", {Protocol: model.TCP, Port: 10247}: "liveness"},
			image:    "example/portico:test",
			api:      "https://10.251.0.1:6443",
			logLevel: "debug",
			iface:    "bond1",
			xdpMode:  "native",
			nodes:    map[string]string{"portico.io/edge": "true"},
			selector: map[string]string{"portico.io/edge": "true", "zone": "a"},
			flags: map[string]string{"group": "shop/edge", "iface": "bond1", "pod-namespace": "portico-system", "apiserver": "https://10.251.0.1:6443", "log-level": "debug",
				"vip-pool": "203.0.113.0/28!203.0.113.1/32;2001:db8::/120", "claim-image": "example/portico:test",
				"group-namespaces": "portico-system,shop", "reserved-ports": "10247/tcp,53/udp",
				"claim-iface": "bond1", "claim-node-selector": "portico.io/edge=true", "xdp-mode": "native"},
		},
		{
			name: "manifest defaults, no pools",
			flags: map[string]string{"group": "shop/edge", "pod-namespace": "portico-system",
				"vip-pool": "", "claim-iface": "", "claim-node-selector": ""}, // "" = removed
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := &v1alpha1.IngressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "edge", UID: "claim-uid"},
				Spec: v1alpha1.IngressClaimSpec{Template: tc.template}}
			got, err := claimDaemonSet(claim, Config{AgentImage: tc.image, AgentAPIServer: tc.api, AgentLogLevel: tc.logLevel, LeaseNamespace: "portico-system", Pools: tc.pools,
				GroupNamespaces: tc.groupNS, ReservedPorts: tc.reserved, ClaimIface: tc.iface, ClaimNodeSelector: tc.nodes,
				AgentXDPMode: tc.xdpMode})
			if err != nil {
				t.Fatal(err)
			}
			want, err := deploy.AgentDaemonSet()
			if err != nil {
				t.Fatal(err)
			}
			labels := map[string]string{v1alpha1.LabelClaim: "edge"}
			want.ObjectMeta = metav1.ObjectMeta{Namespace: "shop", Name: "edge", Labels: labels,
				OwnerReferences: []metav1.OwnerReference{claimOwnerRef(claim)}}
			want.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
			want.Spec.Template.Labels = labels
			pod := &want.Spec.Template.Spec
			pod.NodeSelector = tc.selector
			agent := &pod.Containers[0]
			if tc.image != "" {
				agent.Image = tc.image
			}
			wantFlags := agentFlags(agent.Args)
			for k, v := range tc.flags {
				wantFlags[k] = v
				if v == "" {
					delete(wantFlags, k)
				}
			}
			gotArgs := got.Spec.Template.Spec.Containers[0].Args
			if gotArgs[0] != agent.Args[0] {
				t.Errorf("subcommand %q, want %q", gotArgs[0], agent.Args[0])
			}
			if d := cmp.Diff(wantFlags, agentFlags(gotArgs)); d != "" {
				t.Errorf("agent flags (-want +got):\n%s", d)
			}
			agent.Args = gotArgs // compared above, as flags
			if d := cmp.Diff(want, got, cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })); d != "" {
				t.Errorf("DaemonSet beyond what the claim changes (-manifest +claim):\n%s", d)
			}
			// What claim agents lacked while the DaemonSet was a hand copy.
			spec := got.Spec.Template.Spec
			if len(spec.Tolerations) == 0 || spec.PriorityClassName == "" || spec.TerminationGracePeriodSeconds == nil ||
				got.Spec.UpdateStrategy.RollingUpdate == nil {
				t.Errorf("no tolerations, priority class, grace period or rolling update: %+v", got.Spec)
			}
		})
	}
}

// TestClaimTemplateOverridden: what a claim's template asks of the operator's
// placement is reported, field by field; what agrees, or only narrows, is not.
func TestClaimTemplateOverridden(t *testing.T) {
	cfg := Config{ClaimIface: "bond1", ClaimNodeSelector: map[string]string{"portico.io/edge": "true"}}
	got := overridden(v1alpha1.ReplicaTemplate{NodeSelector: map[string]string{"portico.io/edge": "false", "zone": "a"}, Interface: "bond0",
		ServiceAccountName: "shop-admin"}, cfg, "portico-agent")
	var fields []string
	for _, o := range got {
		fields = append(fields, o[0])
	}
	want := []string{"spec.template.serviceAccountName", "spec.template.interface", "spec.template.nodeSelector"}
	if d := cmp.Diff(want, fields); d != "" {
		t.Errorf("overridden fields (-want +got):\n%s\n%v", d, got)
	}
	if got := overridden(v1alpha1.ReplicaTemplate{NodeSelector: map[string]string{"portico.io/edge": "true", "zone": "a"}, Interface: "bond1",
		ServiceAccountName: "portico-agent"}, cfg, "portico-agent"); len(got) != 0 {
		t.Errorf("a template that agrees or narrows: %v", got)
	}
}

func TestParseNodeSelector(t *testing.T) {
	got, err := ParseNodeSelector("portico.io/edge=true,zone=a")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]string{"portico.io/edge": "true", "zone": "a"}, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if s := FormatNodeSelector(got); s != "portico.io/edge=true,zone=a" {
		t.Errorf("formatted %q", s)
	}
	for _, bad := range []string{"zone", "=a", "zone=a b", "bad key=x"} {
		if _, err := ParseNodeSelector(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
