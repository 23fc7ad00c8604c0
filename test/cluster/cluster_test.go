package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/portico-edge/portico/test/testenv"
)

// hostSysctls are the host-wide entries the kubelet and kube-proxy would write
// (kube-proxy: the conntrack table's size, which every network namespace shares);
// the nodes must leave them alone.
var hostSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_buckets"}

func readSysctls(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, k := range hostSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		m[k] = strings.TrimSpace(string(b))
	}
	return m
}

// TestCluster brings up three real kubelet nodes and checks what Portico relies on:
// the DaemonSet controller puts a privileged hostNetwork pod on every node, and that
// pod lives in its node's network namespace, hostname and bpffs; the EndpointSlice
// controller publishes a Service's ready pods; the node lifecycle controller marks a
// dead node NotReady within its grace period.
func TestCluster(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sysctls := readSysctls(t)

	const nodes = 3
	// A lab value: Kubernetes' default is 50 s.
	const grace = 16 * time.Second
	c, err := Start(ctx, Options{Nodes: nodes, NodeMonitorGracePeriod: grace})
	if err != nil {
		t.Fatalf("start the cluster: %v", err)
	}
	defer func() {
		t0 := time.Now()
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		t.Logf("teardown: %.1f s", time.Since(t0).Seconds())
		left, _ := filepath.Glob("/sys/fs/cgroup/*/" + c.Prefix + "*")
		netns, _ := filepath.Glob("/run/netns/" + c.Prefix + "*")
		if _, err := os.Stat(c.Dir); err == nil {
			left = append(left, c.Dir)
		}
		if left = append(left, netns...); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
		if got := readSysctls(t); !maps.Equal(got, sysctls) {
			t.Errorf("host sysctls changed: %v, were %v", got, sysctls)
		}
	}()
	t.Logf("control plane ready: %.1f s, %d nodes Ready: %.1f s", c.Timings.ControlPlane.Seconds(), nodes, c.Timings.NodesReady.Seconds())
	kube := c.Kube

	// The real CLI sees the nodes as client-go does.
	out, err := c.Kubectl(ctx, nil, "get", "nodes", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, n := range c.Nodes {
		want = append(want, "node/"+n.Name)
	}
	if got := strings.Fields(out); !slices.Equal(got, want) {
		t.Errorf("kubectl get nodes: %v, want %v", got, want)
	}

	// A mark in each node's own bpffs, which its DaemonSet pod must see, alone.
	for _, n := range c.Nodes {
		if _, err := n.Exec("mkdir", "/sys/fs/bpf/"+n.Name); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("DaemonSet", func(t *testing.T) {
		t0 := time.Now()
		ds := echoDaemonSet()
		if _, err := kube.AppsV1().DaemonSets("default").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 2*time.Minute, func() string {
			got, err := kube.AppsV1().DaemonSets("default").Get(ctx, ds.Name, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			st := got.Status
			if st.DesiredNumberScheduled != nodes || st.NumberReady != nodes || st.UpdatedNumberScheduled != nodes {
				return fmt.Sprintf("desired %d, updated %d, ready %d", st.DesiredNumberScheduled, st.UpdatedNumberScheduled, st.NumberReady)
			}
			return ""
		})
		t.Logf("DaemonSet rolled out on %d nodes: %.1f s", nodes, time.Since(t0).Seconds())

		pods, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=ds-echo"})
		if err != nil {
			t.Fatal(err)
		}
		byNode := map[string]corev1.Pod{}
		for _, p := range pods.Items {
			byNode[p.Spec.NodeName] = p
		}
		hc := HTTPClient(c.Client.NS, 3*time.Second)
		for _, n := range c.Nodes {
			p, ok := byNode[n.Name]
			if !ok {
				t.Errorf("no DaemonSet pod on %s", n.Name)
				continue
			}
			if p.Status.Phase != corev1.PodRunning || !podReady(&p) {
				t.Errorf("pod %s on %s: phase %s, ready %v", p.Name, n.Name, p.Status.Phase, podReady(&p))
			}
			if p.Status.PodIP != n.IP.String() || p.Status.HostIP != n.IP.String() {
				t.Errorf("pod %s on %s: pod IP %s, host IP %s, want the node's %s", p.Name, n.Name, p.Status.PodIP, p.Status.HostIP, n.IP)
			}
			var info struct {
				Pod, Node, Hostname, NetNS, Client string
				BPFFS                              []string
			}
			if err := getJSON(hc, fmt.Sprintf("http://%s:%d/info", n.IP, dsPort), &info); err != nil {
				t.Errorf("ask the pod on %s: %v", n.Name, err)
				continue
			}
			netns, err := n.Exec("readlink", "/proc/self/ns/net")
			if err != nil {
				t.Fatal(err)
			}
			if info.Pod != p.Name || info.Node != n.Name || info.Hostname != n.Name || info.NetNS != strings.TrimSpace(netns) {
				t.Errorf("pod on %s sees pod %q node %q hostname %q netns %s, want %q %q %q %s",
					n.Name, info.Pod, info.Node, info.Hostname, info.NetNS, p.Name, n.Name, n.Name, strings.TrimSpace(netns))
			}
			for _, m := range c.Nodes {
				if slices.Contains(info.BPFFS, m.Name) != (m == n) {
					t.Errorf("pod on %s sees bpffs %v: want %s's mark and no other", n.Name, info.BPFFS, n.Name)
				}
			}
			if !strings.HasPrefix(info.Client, ClientAddr.String()+":") {
				t.Errorf("pod on %s saw client %s, want %s", n.Name, info.Client, ClientAddr)
			}
		}
	})

	t.Run("EndpointSlice", func(t *testing.T) {
		t0 := time.Now()
		dep, svc := echoDeployment()
		if _, err := kube.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var ready []string
		testenv.Eventually(t, 2*time.Minute, func() string {
			slices, err := kube.DiscoveryV1().EndpointSlices("default").List(ctx,
				metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
			if err != nil {
				return err.Error()
			}
			ready = ready[:0]
			for _, s := range slices.Items {
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						ready = append(ready, e.Addresses...)
					}
				}
			}
			if len(ready) != 2 {
				return fmt.Sprintf("%d EndpointSlices, ready addresses %v", len(slices.Items), ready)
			}
			return ""
		})
		t.Logf("Deployment's 2 pods ready in the Service's EndpointSlice: %.1f s", time.Since(t0).Seconds())
		pods, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=echo"})
		if err != nil {
			t.Fatal(err)
		}
		hc := HTTPClient(c.Client.NS, 3*time.Second)
		for _, p := range pods.Items {
			if !slices.Contains(ready, p.Status.PodIP) {
				t.Errorf("pod %s (%s) is not in the EndpointSlice %v", p.Name, p.Status.PodIP, ready)
				continue
			}
			// Pods are routed, not NATed: the backend sees the client's own address.
			body, err := get(hc, fmt.Sprintf("http://%s:%d/", p.Status.PodIP, EchoPort))
			if err != nil {
				t.Errorf("ask pod %s: %v", p.Name, err)
				continue
			}
			if want := fmt.Sprintf("pod=%s node=%s edge=%s ", p.Name, p.Spec.NodeName, ClientAddr); !strings.HasPrefix(body, want) {
				t.Errorf("pod %s answered %q, want %q…", p.Name, body, want)
			}
		}
		// kube-proxy on every node: the Service's cluster IP answers from each
		// node, once its rules are written.
		got, err := kube.CoreV1().Services("default").Get(ctx, svc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			hc := HTTPClient(n.Net.NS, 2*time.Second)
			testenv.Eventually(t, 30*time.Second, func() string {
				body, err := get(hc, fmt.Sprintf("http://%s/", got.Spec.ClusterIP))
				if err != nil {
					return fmt.Sprintf("cluster IP %s from %s: %v", got.Spec.ClusterIP, n.Name, err)
				}
				if !strings.HasPrefix(body, "pod=echo") {
					return fmt.Sprintf("cluster IP %s from %s answered %q", got.Spec.ClusterIP, n.Name, body)
				}
				return ""
			})
		}
		t.Logf("the Service's cluster IP %s answers from every node (kube-proxy)", got.Spec.ClusterIP)
	})

	t.Run("NodeDies", func(t *testing.T) {
		n := c.Nodes[len(c.Nodes)-1]
		t0 := time.Now()
		if err := c.Kill(n); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, grace+30*time.Second, func() string {
			node, err := kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if NodeReady(node) {
				return n.Name + " still Ready"
			}
			return ""
		})
		t.Logf("%s NotReady %.1f s after its kubelet and containerd were killed and its link cut (grace period %s)",
			n.Name, time.Since(t0).Seconds(), grace)
		for _, m := range c.Nodes[:len(c.Nodes)-1] {
			node, err := kube.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
			if err != nil || !NodeReady(node) {
				t.Errorf("%s is not Ready after %s died (%v)", m.Name, n.Name, err)
			}
		}
	})
}

const dsPort = 8081

// echoDaemonSet is shaped as Portico's: privileged, hostNetwork, the node's bpffs
// mounted with Bidirectional propagation, tolerating every taint.
func echoDaemonSet() *appsv1.DaemonSet {
	labels := map[string]string{"app": "ds-echo"}
	bidi := corev1.MountPropagationBidirectional
	dir := corev1.HostPathDirectory
	privileged, no := true, false
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ds-echo", Namespace: "default"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork:                  true,
					AutomountServiceAccountToken: &no,
					Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name:            "echo",
						Image:           EchoImage,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"-listen", fmt.Sprintf(":%d", dsPort)},
						Env:             downwardEnv(),
						SecurityContext: &corev1.SecurityContext{Privileged: &privileged},
						ReadinessProbe:  httpProbe(dsPort),
						VolumeMounts:    []corev1.VolumeMount{{Name: "bpffs", MountPath: "/sys/fs/bpf", MountPropagation: &bidi}},
					}},
					Volumes: []corev1.Volume{{Name: "bpffs", VolumeSource: corev1.VolumeSource{
						HostPath: &corev1.HostPathVolumeSource{Path: "/sys/fs/bpf", Type: &dir}}}},
				},
			},
		},
	}
}

// echoDeployment is two echo pods on the pod network behind a Service.
func echoDeployment() (*appsv1.Deployment, *corev1.Service) {
	labels := map[string]string{"app": "echo"}
	replicas := int32(2)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:            "echo",
					Image:           EchoImage,
					ImagePullPolicy: corev1.PullNever,
					Env:             downwardEnv(),
					Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: EchoPort}},
					ReadinessProbe:  httpProbe(EchoPort),
				}}},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	return dep, svc
}

func downwardEnv() []corev1.EnvVar {
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	return []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: field("metadata.name")}, {Name: "NODE_NAME", ValueFrom: field("spec.nodeName")}}
}

func httpProbe(port int) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(int32(port))}},
		PeriodSeconds: 1,
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func getJSON(c *http.Client, url string, v any) error {
	body, err := get(c, url)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(body), v)
}
