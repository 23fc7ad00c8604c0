package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// tenantYAML is what a namespace admin tries against the others: an L4 Service
// on the client's own address, a group of its own that would attract other
// teams' Ingresses, a path on another team's host, and an L4 Service on the port
// the liveness checks use.
var tenantYAML = fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata:
  name: ip-thief
  annotations: {portico.io/group: %[1]s/edge, portico.io/vip: "%[2]s"}
spec:
  type: LoadBalancer
  loadBalancerClass: portico.io/vip
  allocateLoadBalancerNodePorts: false
  ports: [{name: x, port: 7100, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata:
  name: my-group
  labels: {portico.io/group: "true"}
  annotations: {portico.io/vip: "%[2]s"}
spec:
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: login-thief
spec:
  ingressClassName: portico
  rules:
  - host: web.example
    http:
      paths:
      - {path: /login, pathType: Prefix, backend: {service: {name: ip-thief, port: {number: 7100}}}}
---
apiVersion: v1
kind: Service
metadata:
  name: liveness-thief
  annotations: {portico.io/group: %[1]s/edge}
spec:
  type: LoadBalancer
  loadBalancerClass: portico.io/vip
  allocateLoadBalancerNodePorts: false
  ports: [{name: x, port: %[3]d, protocol: TCP}]
`, PorticoNamespace, ClientAddr, LivenessPort)

// testTenant: a tenant with namespace-admin rights only (kubectl --as) applies
// tenantYAML and an IngressClaim while other teams' connections are held and new
// ones keep coming: each object is refused with its Warning Event, an
// IngressClaim is refused by RBAC, no edge takes the client's address, and not
// one held or new connection of the others fails.
func testTenant(t *testing.T, ctx context.Context, p *Portico) {
	const ns, user = "tenant-mallory", "mallory"
	c := p.C
	if _, err := c.Kubectl(ctx, nil, "create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kubectl(context.Background(), nil, "delete", "namespace", ns, "--wait=false") })
	if _, err := c.Kubectl(ctx, nil, "-n", ns, "create", "rolebinding", "mallory-admin", "--clusterrole=admin", "--user="+user); err != nil {
		t.Fatal(err)
	}
	held := openHeld(t, p, 30, 10)
	stream := p.StartStream(ctx, "web.example", traffic.StreamOptions{Every: 20 * time.Millisecond, Timeout: slowAnswer})
	start := time.Now()
	if _, err := c.Kubectl(ctx, strings.NewReader(tenantYAML), "--as="+user, "-n", ns, "apply", "-f", "-"); err != nil {
		stream.Stop()
		t.Fatalf("the tenant's objects: %v", err)
	}
	claim := `{"apiVersion": "portico.io/v1alpha1", "kind": "IngressClaim", "metadata": {"name": "mine"}, "spec": {"ingresses": ["login-thief"]}}`
	if out, err := c.Kubectl(ctx, strings.NewReader(claim), "--as="+user, "-n", ns, "create", "-f", "-"); err == nil || !strings.Contains(err.Error()+out, "forbidden") {
		t.Errorf("a namespace admin's IngressClaim: %v %s, want forbidden (claims provision privileged DaemonSets)", err, out)
	}
	want := map[string]string{"ip-thief": "VIPNotInPool", "my-group": "GroupNotAllowed", "login-thief": "HostTaken", "liveness-thief": "PortReserved"}
	testenv.Eventually(t, time.Minute, func() string {
		evs, err := c.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		var missing []string
		for obj, reason := range want {
			found := false
			for _, e := range evs.Items {
				found = found || e.InvolvedObject.Name == obj && e.Reason == reason && e.Type == "Warning"
			}
			if !found {
				missing = append(missing, obj+": "+reason)
			}
		}
		if len(missing) > 0 {
			return fmt.Sprintf("no Warning Event %v (%d events)", missing, len(evs.Items))
		}
		return ""
	})
	for _, e := range p.Edges {
		out, err := exec.Command("ip", "-n", e.Net.NS, "-o", "addr", "show", "dev", "lo").CombinedOutput()
		if err != nil {
			t.Errorf("edge %s: ip addr: %v: %s", e.Name, err, out)
		} else if strings.Contains(string(out), " "+ClientAddr.String()+"/") {
			t.Errorf("edge %s put the client's address on lo:\n%s", e.Name, out)
		}
	}
	// The others' traffic: the owner of web.example keeps /login, every held
	// connection answers, and no new one failed.
	hc := p.HTTPClient(false, 2*time.Second)
	if r, err := p.Get(ctx, hc, "web.example", "/login"); err != nil || !strings.HasPrefix(r.Pod, "web-") {
		t.Errorf("GET web.example/login: %+v, %v; want the owner's web pod", r, err)
	}
	time.Sleep(2 * time.Second)
	checkHeld(t, ctx, p, "while a tenant attacks", held, 3*time.Second)
	atts := stream.Stop()
	if f := failures(t, p, atts, start); f.Failed > 0 {
		t.Errorf("%d of the other teams' new connections failed while a tenant attacked, want 0", f.Failed)
	}
}

// tokenCheck prints the agent's API token's mode and owner, then the user id of
// every nginx worker in the agent's container (its own PID namespace): a
// process whose command line starts "nginx: worker" (not this shell's, which
// holds the words too).
const tokenCheck = `stat -L -c '%a %u' /var/run/secrets/kubernetes.io/serviceaccount/token
for d in /proc/[0-9]*; do
  if [ "$(head -c 13 "$d/cmdline" 2>/dev/null)" = "nginx: worker" ]; then sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/worker \1/p' "$d/status"; fi
done`

// testAgentTokenRootOnly: on every edge, the agent's
// API token is its (root's) alone, and nginx's workers, in the same container,
// run as another user, so a worker taken over cannot read it.
func testAgentTokenRootOnly(t *testing.T, ctx context.Context, p *Portico) {
	agents, err := p.Agents(ctx, "portico-agent")
	if err != nil {
		t.Fatal(err)
	}
	if len(agents) == 0 {
		t.Fatal("no agent pods")
	}
	checked := 0
	for node, pod := range agents {
		out, err := p.C.Kubectl(ctx, nil, "-n", PorticoNamespace, "exec", pod, "-c", "agent", "--", "sh", "-c", tokenCheck)
		if err != nil && strings.Contains(strings.ToLower(err.Error()+out), "not found") {
			t.Logf("%s (%s): gone since the list (an earlier step's restart, or its node's death): %v", pod, node, err)
			continue
		}
		if err != nil {
			t.Errorf("%s (%s): %v: %s", pod, node, err, out)
			continue
		}
		checked++
		lines := strings.Split(strings.TrimSpace(out), "\n")
		workers := 0
		for _, l := range lines[1:] {
			if uid, ok := strings.CutPrefix(l, "worker "); ok {
				workers++
				if uid == "0" {
					t.Errorf("%s (%s): an nginx worker runs as root", pod, node)
				}
			}
		}
		if lines[0] != "400 0" || workers == 0 {
			t.Errorf("%s (%s): token mode and owner %q, %d nginx workers; want \"400 0\" and workers as another user:\n%s", pod, node, lines[0], workers, out)
		} else {
			t.Logf("%s (%s): token mode %s, owner uid %s; %d nginx workers, none as root", pod, node, strings.Fields(lines[0])[0], strings.Fields(lines[0])[1], workers)
		}
	}
	if checked < 2 {
		t.Errorf("%d agent pods checked, want at least 2", checked)
	}
}
