package deploy_test

import (
	"bytes"
	"context"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/agent"
	"github.com/portico-edge/portico/api/bgpfile"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/testenv"
)

// chart is the Helm chart the manifests under deploy/ are generated from.
const chart = "helm/portico"

// helmBinary returns the helm hack/helm.sh builds (make helm), or skips the test
// (fails it in CI) when it is not built.
func helmBinary(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("../hack/helm.sh", "path").Output()
	if err != nil {
		t.Fatalf("hack/helm.sh path: %v", err)
	}
	p := strings.TrimSpace(string(out))
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		testenv.Unavailable(t, "helm is not built (make helm): %s", p)
	}
	return p
}

// run runs a program and returns its standard output, failing t with its standard
// error when it fails.
func run(t testing.TB, stdin []byte, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(name), strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

// otherValues are settings away from every default of values.yaml, for lint and the
// dry run: another namespace and group, interface candidates, no VIP or pool, a
// digest, no node selector, tolerations or priority class, a memory limit, OnDelete
// updates, VRRP v2 and no liveness checks.
var otherValues = []string{
	"createNamespace=true", `iface=bond0\,eth0`, "vipPool=", "group.name=public", "group.vip=",
	"group.ingressClass.name=portico-public", "group.ingressClass.default=true",
	"image.repository=registry.example/portico", "image.tag=sha256:" + strings.Repeat("ab", 32), "image.pullPolicy=Always",
	"nodeSelector=null", "tolerations=null", "priorityClassName=", "resources.limits.memory=512Mi",
	"updateStrategy.type=OnDelete", "updateStrategy.rollingUpdate=null",
	"vrrp.priority=200", "vrrp.degradedPriority=20", "vrrp.version=2", "vrrp.interval=1s", "vrrp.unicast=false",
	"claims.nodeSelector.pool=shop", "claims.iface=bond1", "liveness.port=0", "apiServer=https://10.0.0.1:6443",
	"xdpMode=native", "nginx.accessLog=", "nginx.accessLogSample=0.05", "nginx.telemetry=false",
}

// podValues set every value that reaches the agent and controller pods beyond
// the flags of otherValues: the log level, pull secrets, pod annotations and
// labels, affinity, extra arguments and environment.
var podValues = []string{
	"logLevel=debug", "imagePullSecrets[0].name=regcred", "imagePullSecrets[1].name=mirror",
	`podAnnotations.example\.com/owner=edge`, "podLabels.team=edge",
	"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=node.kubernetes.io/exclude-from-external-load-balancers",
	"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=DoesNotExist",
	"extraArgs[0]=--pprof", "extraArgs[1]=--vrrp-interval=50ms",
	"extraEnv[0].name=GODEBUG", "extraEnv[0].value=madvdontneed",
	"extraEnv[1].name=PORTICO_RING_SIZE", "extraEnv[1].valueFrom.configMapKeyRef.name=portico-tuning", "extraEnv[1].valueFrom.configMapKeyRef.key=ring-size",
	"controller.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight=100",
	"controller.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey=kubernetes.io/hostname",
	`controller.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.labelSelector.matchLabels.app\.kubernetes\.io/name=portico-controller`,
	`controller.podAnnotations.example\.com/owner=control`, "controller.podLabels.team=control",
	"controller.extraArgs[0]=--pprof", "controller.extraEnv[0].name=GODEBUG", "controller.extraEnv[0].value=gctrace",
}

func setArgs(sets []string) []string {
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return args
}

// TestChartLint runs helm lint --strict on the chart with its defaults, with
// otherValues, bgpValues and podValues, and checks that values.schema.json refuses
// bad values.
func TestChartLint(t *testing.T) {
	helm := helmBinary(t)
	for name, sets := range map[string][]string{"defaults": nil, "other values": otherValues, "bgp": bgpValues, "pod values": podValues} {
		t.Run(name, func(t *testing.T) {
			out := run(t, nil, helm, append([]string{"lint", "--strict", chart}, setArgs(sets)...)...)
			t.Logf("%s", out)
		})
	}
	for _, bad := range []string{"ifac=eth1", "nginx.accessLog=/var/log/x", "nginx.accessLogSample=2", "nginx.accessLogSample=0", "xdpMode=generic", "xdpMode=", "vrrp.version=4", "vrrp.priority=255", "vrrp.interval=100", "vrrp.unicast=maybe", "claims.bogus=1",
		"liveness.port=70000", "group.name=Edge", "image.pullPolicy=Sometimes", "iface=", "apiServer=http://10.0.0.1",
		"apiServer=https://k/api", "announce=ospf", "bgp.peers[0].address=10.0.0.1", "bgp.asn=0", "bgp.peers[0].communities[0]=x:y", "federation.members=true",
		"hashSeed=12345678901", "hashSeed=0x10", "iface=eth0:1", `iface=bond0\,`, "iface=a-name-of-16-byt", "claims.iface=a/b",
		"logLevel=loud", "logLevel=fatal", "imagePullSecrets[0]=regcred", "imagePullSecrets[0].nam=regcred",
		"podAnnotations=x", `podAnnotations.portico\.io/bgp-config=x`, `podLabels.app\.kubernetes\.io/name=web`,
		"affinity.nodeAfinity.x=y", "extraArgs=x", "extraArgs[0]=pprof", "extraEnv[0].name=NODE_NAME", "extraEnv[0].value=x",
		"controller.extraArgs=--pprof", `controller.podLabels.app\.kubernetes\.io/part-of=x`, "controller.extraEnv[0].name=POD_NAME"} {
		out, err := exec.Command(helm, "template", "portico", chart, "--set", bad).CombinedOutput()
		if err == nil || !bytes.Contains(out, []byte("schema")) {
			t.Errorf("helm template --set %s: %v %s, want the values refused by values.schema.json", bad, err, out)
		}
	}
}

// TestHashSeedNotDrawnWithoutACluster: rendered without a cluster (helm
// template, as Argo CD renders charts), the chart draws no flow hash seed, which
// would change at every render and split the edges' hashing as agents
// restart; a seed given in the values is rendered as it is.
func TestHashSeedNotDrawnWithoutACluster(t *testing.T) {
	helm := helmBinary(t)
	secret := []byte("name: portico-hash-seed\n")
	for _, tc := range []struct {
		sets []string
		want bool
	}{{nil, false}, {[]string{"--set-string", "hashSeed=3141592653"}, true}} {
		out := run(t, nil, helm, append([]string{"template", "portico", chart, "--namespace", namespace}, tc.sets...)...)
		if got := bytes.Contains(out, []byte("kind: Secret\nmetadata:\n  "+string(secret))); got != tc.want {
			t.Errorf("helm template %v: a hash seed Secret %v, want %v", tc.sets, got, tc.want)
		}
		if tc.want && !bytes.Contains(out, []byte(`seed: "MzE0MTU5MjY1Mw=="`)) {
			t.Errorf("helm template %v: the seed is not the value's", tc.sets)
		}
	}
}

// TestManifestsGenerated renders the chart as make manifests does and fails when a
// generated manifest under deploy/ differs (make verify does the same with git diff):
// the chart is their single source.
func TestManifestsGenerated(t *testing.T) {
	helm := helmBinary(t)
	out := t.TempDir()
	run(t, nil, goTool(), "run", "./manifests", "-helm", helm, "-chart", chart, "-out", out)
	var generated []string
	err := filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(out, p)
		generated = append(generated, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(generated)
	for _, f := range generated {
		want, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Errorf("%s: %v (run make manifests)", f, err)
			continue
		}
		if d := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(string(got), "\n")); d != "" {
			t.Errorf("deploy/%s is not the chart's rendering; edit deploy/helm/portico and run make manifests (-chart +file):\n%s", f, d)
		}
	}
	// Every manifest in the kustomization is generated but the example backend.
	for _, f := range readKustomization(t).Resources {
		if !slices.Contains(generated, f) && f != "examples/web.yaml" {
			t.Errorf("kustomization resource %s is not generated from the chart", f)
		}
	}
}

// testChartDryRun renders the chart with its defaults and with otherValues, and
// server-side applies the result with kubectl in dry-run mode (admission and
// validation, nothing stored): what helm install would send. The chart's Namespace is
// created for real first (a dry run cannot create the namespace of the objects that
// follow).
func testChartDryRun(t *testing.T, ctx context.Context, srv *kapi.Server, a *applier) {
	helm := helmBinary(t)
	kubectl := filepath.Join(kapi.BinDir(), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		testenv.Unavailable(t, "kubectl is not built (make kapi): %v", err)
	}
	for _, tc := range []struct {
		name, namespace string
		sets            []string
		check           func(t *testing.T, objs []*unstructured.Unstructured)
	}{
		{name: "defaults", namespace: namespace},
		{name: "other values", namespace: "edge-infra", sets: otherValues, check: checkOtherValues},
		{name: "bgp", namespace: namespace, sets: bgpValues, check: checkBGPValues},
		{name: "federation member", namespace: namespace, sets: append(slices.Clone(bgpValues), "federation.member=true"), check: checkFederationValues},
		{name: "pod values, bgp", namespace: namespace, sets: append(slices.Clone(podValues), bgpValues...), check: checkPodValues},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "portico", chart, "--namespace", tc.namespace, "--include-crds"}, setArgs(tc.sets)...)
			rendered := run(t, nil, helm, args...)
			objs, err := decodeAll(rendered)
			if err != nil {
				t.Fatalf("helm template output: %v", err)
			}
			for _, u := range objs {
				if u.GetKind() == "Namespace" {
					if err := a.apply(ctx, u); err != nil {
						t.Fatal(err)
					}
				}
			}
			out := run(t, rendered, kubectl, "--kubeconfig", srv.Kubeconfig, "apply", "--server-side", "--dry-run=server",
				"--force-conflicts", "--field-manager=helm-dry-run", "-f", "-")
			applied := strings.Count(string(out), "(server dry run)")
			if applied != len(objs) {
				t.Errorf("kubectl applied %d objects of %d:\n%s", applied, len(objs), out)
			}
			if tc.check != nil {
				tc.check(t, objs)
			}
		})
	}
}

// bgpValues turn on --announce=bgp with one peer and a BFD profile.
var bgpValues = []string{
	"announce=bgp", "bgp.asn=64600", "bgp.peers[0].address=10.0.0.1", "bgp.peers[0].asn=65000",
	"bgp.peers[0].bfdProfile=fast", "bgp.peers[0].holdTime=3s", "bgp.bfdProfiles[0].name=fast",
	"bgp.bfdProfiles[0].transmitInterval=50ms", "bgp.bfdProfiles[0].receiveInterval=50ms", "bgp.bfdProfiles[0].detectMultiplier=3",
	"bgpObjects.peers[0].name=tor-a", "bgpObjects.peers[0].address=10.0.0.2", "bgpObjects.peers[0].asn=65001",
	"bgpObjects.peers[0].bfdProfile=fast", "bgpObjects.peers[0].nodeSelectors[0].matchLabels.rack=r1",
	"bgpObjects.peers[0].passwordSecret.name=tor-a-bgp", "bgpObjects.bfdProfiles[0].name=fast", "bgpObjects.bfdProfiles[0].transmitInterval=50",
}

// checkBGPValues: with announce: bgp the agents get --announce=bgp and the
// Secret (it holds the peers' passwords) the agent can read, mounted where
// --bgp-config says, readable by its owner alone, and the pod
// template changes with it (a change of peers rolls the agents).
func checkBGPValues(t *testing.T, objs []*unstructured.Unstructured) {
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "portico-agent")
	c := ds.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--announce=bgp") || !slices.Contains(c.Args, "--bgp-config=/etc/portico/bgp/bgp.yaml") {
		t.Errorf("agent args %v, want --announce=bgp and --bgp-config", c.Args)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "bgp" && m.MountPath == "/etc/portico/bgp" }) {
		t.Errorf("volume mounts %v, want the bgp Secret at /etc/portico/bgp", c.VolumeMounts)
	}
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "bgp" && v.Secret != nil && v.Secret.SecretName == "portico-bgp" && v.Secret.DefaultMode != nil && *v.Secret.DefaultMode == 0o400
	}) {
		t.Errorf("volumes %v, want the Secret portico-bgp, mode 0400", ds.Spec.Template.Spec.Volumes)
	}
	if slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "ConfigMap" && o.GetName() == "portico-bgp"
	}) {
		t.Error("the BGP configuration (with its passwords) is also a ConfigMap")
	}
	if m := federationPeers(ds); m != [3]bool{} {
		t.Errorf("federation peers (flag, mount, optional volume) %v without federation.member", m)
	}
	if ds.Spec.Template.Annotations["portico.io/bgp-config"] == "" {
		t.Errorf("pod template annotations %v, want the bgp config's checksum", ds.Spec.Template.Annotations)
	}
	sec := find[corev1.Secret](t, objs, "Secret", "portico-bgp")
	p := filepath.Join(t.TempDir(), "bgp.yaml")
	if err := os.WriteFile(p, []byte(sec.StringData["bgp.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := bgpfile.Load(p)
	if err != nil {
		t.Fatalf("the agent cannot read the rendered Secret: %v\n%s", err, sec.StringData["bgp.yaml"])
	}
	sc, err := agent.SpeakerConfig(f, "n1", netip.MustParseAddr("10.0.0.11"), netip.Addr{})
	if err != nil || sc.ASN != 64600 || len(sc.Peers) != 1 || sc.Peers[0].BFD == nil || sc.Peers[0].HoldTime != 3*time.Second {
		t.Errorf("speaker config from the Secret: %+v, %v", sc, err)
	}
	// bgpObjects: a BGPPeer and a BFDProfile in the release namespace.
	peer := find[v1alpha1.BGPPeer](t, objs, "BGPPeer", "tor-a")
	want := v1alpha1.BGPPeerSpec{Address: "10.0.0.2", ASN: 65001, BFDProfile: "fast",
		NodeSelectors:  []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "r1"}}},
		PasswordSecret: &corev1.SecretReference{Name: "tor-a-bgp"}}
	if d := cmp.Diff(want, peer.Spec); d != "" || peer.Namespace != namespace {
		t.Errorf("BGPPeer tor-a in %q, spec (-want +got):\n%s", peer.Namespace, d)
	}
	if prof := find[v1alpha1.BFDProfile](t, objs, "BFDProfile", "fast"); prof.Spec.TransmitInterval == nil || *prof.Spec.TransmitInterval != 50 {
		t.Errorf("BFDProfile fast: %+v, want transmitInterval 50", prof.Spec)
	}
}

// TestChartBGPObjectsDoNotRoll: the agents follow BGPPeer and BFDProfile objects
// live, so changing bgpObjects must leave the agents' pod template alone (no
// rolling update), while a change of the file (bgp) rolls them.
func TestChartBGPObjectsDoNotRoll(t *testing.T) {
	helm := helmBinary(t)
	template := func(sets ...string) *appsv1.DaemonSet {
		t.Helper()
		objs, err := decodeAll(run(t, nil, helm, append([]string{"template", "portico", chart, "--namespace", namespace}, setArgs(append(slices.Clone(bgpValues), sets...))...)...))
		if err != nil {
			t.Fatal(err)
		}
		return find[appsv1.DaemonSet](t, objs, "DaemonSet", "portico-agent")
	}
	base := template()
	if d := cmp.Diff(base.Spec.Template, template("bgpObjects.peers[0].asn=65002", "bgpObjects.bfdProfiles[0].transmitInterval=300").Spec.Template); d != "" {
		t.Errorf("changing bgpObjects changes the agents' pod template (-before +after):\n%s", d)
	}
	if cmp.Equal(base.Spec.Template, template("bgp.peers[0].asn=65002").Spec.Template) {
		t.Error("changing the file's peers leaves the agents' pod template alone: they would not read it")
	}
}

// federationPeers reports whether the agents get --federation-peers, the
// ConfigMap portico-federation-peers mounted where it says, and that volume
// optional (the federation controller writes it later).
func federationPeers(ds *appsv1.DaemonSet) [3]bool {
	c := ds.Spec.Template.Spec.Containers[0]
	return [3]bool{
		slices.Contains(c.Args, "--federation-peers=/etc/portico/federation/peers.yaml"),
		slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "federation" && m.MountPath == "/etc/portico/federation"
		}),
		slices.ContainsFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
			return v.Name == "federation" && v.ConfigMap != nil && v.ConfigMap.Name == "portico-federation-peers" &&
				v.ConfigMap.Optional != nil && *v.ConfigMap.Optional
		}),
	}
}

// checkFederationValues: a federation member's agents read the peers the
// federation controller writes.
func checkFederationValues(t *testing.T, objs []*unstructured.Unstructured) {
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "portico-agent")
	if m := federationPeers(ds); m != [3]bool{true, true, true} {
		t.Errorf("federation peers (flag, mount, optional volume) %v, want all", m)
	}
}

// checkOtherValues: what otherValues change reaches the rendered objects.
func checkOtherValues(t *testing.T, objs []*unstructured.Unstructured) {
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "portico-agent")
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	if want := "registry.example/portico@sha256:" + strings.Repeat("ab", 32); c.Image != want || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %s (%s), want %s (Always)", c.Image, c.ImagePullPolicy, want)
	}
	shared := []string{"--group=edge-infra/public",
		"--claim-image=registry.example/portico@sha256:" + strings.Repeat("ab", 32), "--claim-iface=bond1", "--claim-node-selector=pool=shop", "--metrics-addr=:9101", "--liveness-port=0",
		"--xdp-mode=native"}
	wantArgs := append(append([]string{"agent"}, shared...), "--read-only", "--log-level=info", "--iface=bond0,eth0", "--node-name=$(NODE_NAME)", "--node-ip=$(HOST_IP)",
		"--announce=vrrp", "--vrrp-priority=200", "--vrrp-degraded-priority=20", "--vrrp-version=2", "--vrrp-interval=1s", "--vrrp-unicast=false",
		"--liveness-interval=20ms", "--liveness-dead-after=200ms", "--liveness-rise=5", "--liveness-reload-grace=1s",
		"--hash-seed-file=/etc/portico/hash-seed/seed", "--pod=$(POD_NAMESPACE)/$(POD_NAME)", "--state-dir=/run/portico",
		"--access-log=", "--access-log-sample=0.05", "--no-telemetry")
	if d := cmp.Diff(wantArgs, c.Args); d != "" {
		t.Errorf("agent args (-want +got):\n%s", d)
	}
	// The controller decides from the same flags as the agents.
	ctl := find[appsv1.Deployment](t, objs, "Deployment", "portico-controller").Spec.Template.Spec
	if d := cmp.Diff(append(append([]string{"controller"}, shared...), "--log-level=info"), ctl.Containers[0].Args); d != "" {
		t.Errorf("controller args (-want +got):\n%s", d)
	}
	if i := slices.IndexFunc(ctl.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "PORTICO_APISERVER" }); i < 0 ||
		ctl.Containers[0].Env[i].Value != "https://10.0.0.1:6443" {
		t.Errorf("controller env %v, want PORTICO_APISERVER=https://10.0.0.1:6443", ctl.Containers[0].Env)
	}
	if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "PORTICO_APISERVER" }); i < 0 || c.Env[i].Value != "https://10.0.0.1:6443" {
		t.Errorf("env %v, want PORTICO_APISERVER=https://10.0.0.1:6443", c.Env)
	}
	if pod.NodeSelector != nil || pod.Tolerations != nil || pod.PriorityClassName != "" ||
		ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType || c.Resources.Limits.Memory().String() != "512Mi" {
		t.Errorf("node selector %v, tolerations %v, priority class %q, update strategy %+v, limits %v",
			pod.NodeSelector, pod.Tolerations, pod.PriorityClassName, ds.Spec.UpdateStrategy, c.Resources.Limits)
	}
	group := find[corev1.Service](t, objs, "Service", "public")
	if _, ok := group.Annotations["portico.io/vip"]; ok || group.Namespace != "edge-infra" {
		t.Errorf("group Service %s/%s annotations %v, want no VIP", group.Namespace, group.Name, group.Annotations)
	}
	class := find[networkingv1.IngressClass](t, objs, "IngressClass", "portico-public")
	if p := class.Spec.Parameters; p == nil || p.Name != "public" || p.Namespace == nil || *p.Namespace != "edge-infra" ||
		class.Annotations["ingressclass.kubernetes.io/is-default-class"] != "true" {
		t.Errorf("IngressClass %+v (annotations %v), want the default class naming edge-infra/public", p, class.Annotations)
	}
	ns := find[corev1.Namespace](t, objs, "Namespace", "edge-infra")
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace labels %v, want Pod Security privileged", ns.Labels)
	}
}

// checkPodValues: what podValues set reaches the agent and controller pods: the
// log level, pull secrets, annotations (beside the BGP configuration's checksum)
// and labels (beside the ones the Services select), affinity, and the extra
// arguments (last, after the chart's) and environment (after the chart's).
func checkPodValues(t *testing.T, objs []*unstructured.Unstructured) {
	secrets := []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "mirror"}}
	for _, p := range []struct {
		name        string
		pod         corev1.PodTemplateSpec
		labels      map[string]string // beyond the chart's
		annotations map[string]string
		affinity    *corev1.Affinity
		extraArgs   []string
		extraEnv    []corev1.EnvVar
	}{
		{
			name: "agent", pod: find[appsv1.DaemonSet](t, objs, "DaemonSet", "portico-agent").Spec.Template,
			labels:      map[string]string{"app.kubernetes.io/name": "portico-agent", "app.kubernetes.io/part-of": "portico", "team": "edge"},
			annotations: map[string]string{"example.com/owner": "edge"},
			affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: "node.kubernetes.io/exclude-from-external-load-balancers", Operator: corev1.NodeSelectorOpDoesNotExist}}}}}}},
			extraArgs: []string{"--pprof", "--vrrp-interval=50ms"},
			extraEnv: []corev1.EnvVar{{Name: "GODEBUG", Value: "madvdontneed"}, {Name: "PORTICO_RING_SIZE", ValueFrom: &corev1.EnvVarSource{
				ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "portico-tuning"}, Key: "ring-size"}}}},
		},
		{
			name: "controller", pod: find[appsv1.Deployment](t, objs, "Deployment", "portico-controller").Spec.Template,
			labels:      map[string]string{"app.kubernetes.io/name": "portico-controller", "app.kubernetes.io/part-of": "portico", "team": "control"},
			annotations: map[string]string{"example.com/owner": "control"},
			affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
				Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname",
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "portico-controller"}}}}}}},
			extraArgs: []string{"--pprof"},
			extraEnv:  []corev1.EnvVar{{Name: "GODEBUG", Value: "gctrace"}},
		},
	} {
		spec, c := p.pod.Spec, p.pod.Spec.Containers[0]
		if d := cmp.Diff(secrets, spec.ImagePullSecrets); d != "" {
			t.Errorf("%s image pull secrets (-want +got):\n%s", p.name, d)
		}
		if d := cmp.Diff(p.labels, p.pod.Labels); d != "" {
			t.Errorf("%s pod labels (-want +got):\n%s", p.name, d)
		}
		for k, v := range p.annotations {
			if p.pod.Annotations[k] != v {
				t.Errorf("%s pod annotations %v, want %s=%s", p.name, p.pod.Annotations, k, v)
			}
		}
		if d := cmp.Diff(p.affinity, spec.Affinity); d != "" {
			t.Errorf("%s affinity (-want +got):\n%s", p.name, d)
		}
		if !slices.Contains(c.Args, "--log-level=debug") {
			t.Errorf("%s args %v, want --log-level=debug", p.name, c.Args)
		}
		if n := len(p.extraArgs); len(c.Args) < n || !slices.Equal(c.Args[len(c.Args)-n:], p.extraArgs) {
			t.Errorf("%s args %v, want them to end with extraArgs %v", p.name, c.Args, p.extraArgs)
		}
		if n := len(p.extraEnv); len(c.Env) <= n {
			t.Errorf("%s env %v, want the chart's then extraEnv", p.name, c.Env)
		} else if d := cmp.Diff(p.extraEnv, c.Env[len(c.Env)-n:]); d != "" {
			t.Errorf("%s env, last entries (-want extraEnv +got):\n%s", p.name, d)
		}
	}
	// With announce: bgp the agents' pod keeps the configuration's checksum
	// beside the operator's annotations.
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "portico-agent")
	if ds.Spec.Template.Annotations["portico.io/bgp-config"] == "" {
		t.Errorf("agent pod annotations %v, want the bgp config's checksum too", ds.Spec.Template.Annotations)
	}
}

// TestHelmInstall installs the chart the way the README says, on a real
// kube-apiserver of its own (Helm refuses to adopt objects it did not create): helm
// install with --create-namespace, an upgrade that changes a value, and an uninstall,
// which leaves the CRD (Helm never deletes what crds/ installed).
func TestHelmInstall(t *testing.T) {
	helm := helmBinary(t)
	srv := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	h := func(args ...string) []byte {
		return run(t, nil, helm, append(args, "--kubeconfig", srv.Kubeconfig)...)
	}
	h("install", "portico", chart, "-n", namespace, "--create-namespace", "--set", "iface=eth1")
	ds, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "portico-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after helm install: %v", err)
	}
	if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--iface=eth1") {
		t.Errorf("installed agent args %v, want --iface=eth1", ds.Spec.Template.Spec.Containers[0].Args)
	}
	dyn := dynamic.NewForConfigOrDie(srv.Config)
	for _, o := range []struct {
		gvr             schema.GroupVersionResource
		namespace, name string
	}{
		{schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, namespace, agentSA},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, "", agentSA},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, namespace, "portico-agent-leases"},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, namespace, "portico-agent-daemonsets"},
		{schema.GroupVersionResource{Version: "v1", Resource: "services"}, namespace, "edge"},
		{schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ingressclasses"}, "", "portico"},
		{crdResource, "", "ingressclaims.portico.io"},
	} {
		if _, err := dyn.Resource(o.gvr).Namespace(o.namespace).Get(ctx, o.name, metav1.GetOptions{}); err != nil {
			t.Errorf("after helm install: %v", err)
		}
	}

	// A fresh install draws its own flow hash seed (not a public constant),
	// which the agents read from the Secret's file.
	seed := hashSeed(ctx, t, cs)
	if seed == "" {
		t.Fatal("no flow hash seed after helm install")
	}
	if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--hash-seed-file=/etc/portico/hash-seed/seed") {
		t.Errorf("installed agent args %v, want --hash-seed-file", ds.Spec.Template.Spec.Containers[0].Args)
	}

	h("upgrade", "portico", chart, "-n", namespace, "--reuse-values", "--set", "vrrp.version=2")
	ds, err = cs.AppsV1().DaemonSets(namespace).Get(ctx, "portico-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := ds.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--vrrp-version=2") || !slices.Contains(args, "--iface=eth1") {
		t.Errorf("upgraded agent args %v, want --vrrp-version=2 and still --iface=eth1", args)
	}
	if got := hashSeed(ctx, t, cs); got != seed {
		t.Errorf("flow hash seed %q after an upgrade, want the install's %q (a new one moves every connection)", got, seed)
	}

	h("uninstall", "portico", "-n", namespace)
	if _, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "portico-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("DaemonSet after helm uninstall: %v, want not found", err)
	}
	if _, err := dyn.Resource(crdResource).Get(ctx, "ingressclaims.portico.io", metav1.GetOptions{}); err != nil {
		t.Errorf("the CRD after helm uninstall: %v, want kept", err)
	}
	if got := hashSeed(ctx, t, cs); got != seed {
		t.Errorf("flow hash seed %q after an uninstall, want the install's %q kept", got, seed)
	}

	// An install from before per-install seeds has no Secret: its upgrade keeps
	// the old seed (no Secret, the agents' default) rather than move every
	// connection.
	if err := cs.CoreV1().Secrets(namespace).Delete(ctx, "portico-hash-seed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h("install", "portico", chart, "-n", namespace, "--set", "hashSeed=legacy")
	h("upgrade", "portico", chart, "-n", namespace, "--reuse-values", "--set", "hashSeed=")
	if got := hashSeed(ctx, t, cs); got != "" {
		t.Errorf("an upgrade of an install without a seed made one (%q): held connections would move", got)
	}
	h("uninstall", "portico", "-n", namespace)
}

// hashSeed is the seed in the release's Secret, "" when there is none; it
// fails the test when the seed is not a number below 2^32.
func hashSeed(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	s, err := cs.CoreV1().Secrets(namespace).Get(ctx, "portico-hash-seed", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	v := string(s.Data["seed"])
	if _, err := strconv.ParseUint(v, 10, 32); err != nil {
		t.Errorf("flow hash seed %q: %v", v, err)
	}
	return v
}

// TestChartRendersWithoutLaterSections: helm upgrade --reuse-values renders the
// new chart with the old release's values alone, without the new chart's
// defaults, so a section an earlier release did not have is missing then (an
// upgrade from before bgpObjects failed: "nil pointer evaluating interface
// {}.bfdProfiles", TestUpgradeFromPrevious). Every section of values.yaml but
// those of the chart's first version, removed (--set key=null), must still
// render; the sections off or empty by default render as their defaults do.
func TestChartRendersWithoutLaterSections(t *testing.T) {
	helm := helmBinary(t)
	// The top-level values of the chart's first version (226e0b5): every
	// release has them.
	first := []string{"createNamespace", "image", "iface", "vipPool", "group", "vrrp", "liveness", "resources",
		"nodeSelector", "tolerations", "priorityClassName", "updateStrategy"}
	var values map[string]any
	if err := sigsyaml.Unmarshal(readFile(t, filepath.Join(chart, "values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	seed := []string{"--set-string", "hashSeed=00000001"} // drawn at each render otherwise
	want := string(run(t, nil, helm, append([]string{"template", "portico", chart}, seed...)...))
	later := 0
	for _, k := range slices.Sorted(maps.Keys(values)) {
		if slices.Contains(first, k) || k == "hashSeed" {
			continue
		}
		later++
		t.Run(k, func(t *testing.T) {
			out, err := exec.Command(helm, append([]string{"template", "portico", chart, "--set", k + "=null"}, seed...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("helm template --set %s=null: %v\n%s", k, err, out)
			}
			if (k == "metrics" || k == "bgpObjects") && string(out) != want {
				t.Errorf("helm template --set %s=null renders otherwise than the defaults (off or empty)", k)
			}
		})
	}
	if later < 10 {
		t.Errorf("%d sections later than the first chart's, want the 20 or so of values.yaml", later)
	}
}
