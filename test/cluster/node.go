package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/portico-edge/portico/test/netlab"
)

// Node is one kubelet node: a network namespace on the bridge (its name is the node's
// name and hostname), a mount and UTS namespace held by a sleeping process, and the
// node's containerd, kubelet and kube-proxy inside them.
type Node struct {
	Name    string // Kubernetes node name = hostname = network namespace
	IP      netip.Addr
	PodCIDR netip.Prefix
	Net     *netlab.Node
	Dir     string // root, state and logs of containerd and the kubelet

	cgroups    []string // the node's cgroup in every hierarchy, e.g. /sys/fs/cgroup/pids/<name>
	holder     *proc    // PID 1 of nothing: keeps the mount and UTS namespaces
	containerd *proc
	kubelet    *proc
	kubeProxy  *proc
}

// kubeProxyUser is kube-proxy's user name (its static token's).
const kubeProxyUser = "system:kube-proxy"

func (c *Cluster) nodeName(i int) string { return fmt.Sprintf("%sn%d", c.Prefix, i) }

// addNode creates node i's network namespace, folder, cgroups and configuration.
func (c *Cluster) addNode(i int) (*Node, error) {
	netNode, err := c.Net.AddNode("n"+strconv.Itoa(i), netip.PrefixFrom(NodeAddr(i), bridgeBits), mac(byte(i)))
	if err != nil {
		return nil, fmt.Errorf("add node %d: %w", i, err)
	}
	n := &Node{Name: netNode.NS, IP: NodeAddr(i), PodCIDR: PodCIDR(i), Net: netNode, Dir: filepath.Join(c.Dir, "n"+strconv.Itoa(i))}
	if n.Name != c.nodeName(i) {
		return nil, fmt.Errorf("node namespace %s, want %s", n.Name, c.nodeName(i))
	}
	if err := addAddr6(n.Net.NS, NodeAddr6(i)); err != nil {
		return nil, err
	}
	for _, d := range []string{"containerd", "kubelet", "pki", "manifests", "cni", "ipam", "pod-logs", "sysctl"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := n.makeCgroups(); err != nil {
		return n, err
	}
	return n, c.writeNodeConfig(n)
}

// cgroupMount is one cgroup hierarchy as the host mounts it.
type cgroupMount struct{ target, fstype, options string }

func cgroupMounts() ([]cgroupMount, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ms []cgroupMount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 4 && (fields[2] == "cgroup" || fields[2] == "cgroup2") && strings.HasPrefix(fields[1], "/sys/fs/cgroup") {
			ms = append(ms, cgroupMount{fields[1], fields[2], fields[3]})
		}
	}
	if len(ms) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	return ms, sc.Err()
}

// makeCgroups creates the node's cgroup (the kubelet's cgroupRoot) and its system
// child (containerd, shims, kubelet) in every hierarchy, and writes the list of
// hierarchies for the node's mount namespace to mount again.
func (n *Node) makeCgroups() error {
	ms, err := cgroupMounts()
	if err != nil {
		return err
	}
	var list strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&list, "%s %s %s\n", m.target, m.fstype, m.options)
		if m.target == "/sys/fs/cgroup" {
			return errors.New("this host has a pure cgroup v2 hierarchy: the lab is written for the hybrid v1 layout")
		}
		dir := filepath.Join(m.target, n.Name)
		n.cgroups = append(n.cgroups, dir)
		if err := os.MkdirAll(filepath.Join(dir, "system"), 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		if filepath.Base(m.target) == "cpuset" {
			// A v1 cpuset takes no process before it has CPUs and memory nodes.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(m.target, f))
				if err != nil {
					return err
				}
				for _, d := range []string{dir, filepath.Join(dir, "system")} {
					if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
						return fmt.Errorf("set %s of %s: %w", f, d, err)
					}
				}
			}
		}
	}
	return os.WriteFile(filepath.Join(n.Dir, "cgroup-mounts"), []byte(list.String()), 0o644)
}

func (c *Cluster) writeNodeConfig(n *Node) error {
	files := map[string]string{
		"cni/10-lab.conflist": fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "lab", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}}]}
`, n.PodCIDR, filepath.Join(n.Dir, "ipam")),
		"containerd.toml": fmt.Sprintf(`version = 2
root = %[1]q
state = "/run/containerd"
[grpc]
  address = %[2]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[3]q
  # No CAP_SYS_RESOURCE here: sandboxes cannot get an oom_score_adj below the kubelet's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
`, filepath.Join(n.Dir, "containerd", "root"), n.socket(), PauseImage, filepath.Join(n.Dir, "cni"), filepath.Join(n.Dir, "containerd", "opt")),
		"kubelet.yaml": fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host mounts cgroup v1 hierarchies; kubelet 1.36 refuses them unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%[1]s
containerRuntimeEndpoint: unix://%[2]s
staticPodPath: %[3]s
podLogsDir: %[4]s
address: %[5]s
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
failSwapOn: false
# The kubelet would set host-wide sysctls; the node's mount namespace gives it its own
# files over them, and the defaults it protects are not the host's business.
protectKernelDefaults: false
# Lab timing: a lease renewed every 2.5 s, so the node lifecycle controller's short
# grace period does not mark a live node NotReady.
nodeLeaseDurationSeconds: 10
nodeStatusUpdateFrequency: 4s
fileCheckFrequency: 2s
syncFrequency: 10s
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, n.Name, n.socket(), filepath.Join(n.Dir, "manifests"), filepath.Join(n.Dir, "pod-logs"), n.IP),
		// Kubernetes' own Service proxy, as a kubeadm node runs it: iptables
		// mode, in the node's network namespace. The conntrack settings it
		// would write (nf_conntrack_max, the hash size) are host-wide here:
		// zero leaves them as they are; the timeouts are the kernel's.
		"kube-proxy.yaml": fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: %[1]q}
hostnameOverride: %[2]s
bindAddress: %[3]s
clusterCIDR: %[4]s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
# route_localnet would be set for NodePorts on 127.0.0.1: not needed.
iptables: {localhostNodePorts: false}
`, filepath.Join(n.Dir, "kube-proxy.kubeconfig"), n.Name, n.IP, PodRange),
	}
	server := fmt.Sprintf("https://%s:%d", APIAddr, apiPort)
	if err := writeKubeconfig(filepath.Join(n.Dir, "kubelet.kubeconfig"), server, c.pki.CACert, "system:node:"+n.Name, c.tokens[n.Name]); err != nil {
		return err
	}
	if err := writeKubeconfig(filepath.Join(n.Dir, "kube-proxy.kubeconfig"), server, c.pki.CACert, kubeProxyUser, c.tokens[kubeProxyUser]); err != nil {
		return err
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(n.Dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) socket() string { return filepath.Join(n.Dir, "containerd.sock") }

// holderScript runs as the first process of the node's mount and UTS namespaces
// (unshare -m -u --propagation slave, inside the node's network namespace): it gives
// the node its own sysfs (the node's links), the host's cgroup hierarchies mounted
// again on it, its own bpffs (shared, so a pod's Bidirectional hostPath mount sees
// pins), a private /run, /var/log and /var/lib (libcni's cache in /var/lib/cni, the
// kubelet's fixed /var/lib/kubelet/device-plugins socket), and files of its own over
// the /proc/sys entries the kubelet writes, which are host-wide. Then it sleeps.
const holderScript = `set -eu
node=$1 dir=$2
hostname "$node"
mount --make-rshared /
mount -t sysfs "$node-sys" /sys
mount -t tmpfs -o mode=755 "$node-cgroup" /sys/fs/cgroup
while read -r target fstype options; do
  mkdir -p "$target"; mount -t "$fstype" -o "$options" "$fstype" "$target"
done < "$dir/cgroup-mounts"
mount -t bpf "$node-bpf" /sys/fs/bpf
mount --make-shared /sys/fs/bpf
mount -t tmpfs -o mode=755 "$node-run" /run
mount -t tmpfs -o mode=755 "$node-log" /var/log
mount -t tmpfs -o mode=755 "$node-lib" /var/lib
mkdir /var/lib/cni /var/lib/kubelet
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
          kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  k=${kv%=*} f=$dir/sysctl/$(echo "${kv%=*}" | tr / .)
  echo "${kv#*=}" > "$f"; mount --bind "$f" "/proc/sys/$k"
done
: > "$dir/holder.ready"
exec sleep infinity
`

// inNode returns argv run inside node n's network, mount and UTS namespaces, in the
// node's system cgroup (nsenter and sh exec, so the PID is the program's).
func (n *Node) inNode(argv ...string) []string {
	join := ""
	for _, cg := range n.cgroups {
		join += fmt.Sprintf("echo $$ > %s/system/cgroup.procs; ", cg)
	}
	return append([]string{"nsenter", "-t", strconv.Itoa(n.holder.pid()), "-m", "-n", "-u", "--",
		"/bin/sh", "-c", join + `exec "$@"`, "sh"}, argv...)
}

// startNode starts node n's namespaces holder, containerd (and imports the images),
// then its kubelet.
func (c *Cluster) startNode(ctx context.Context, n *Node) error {
	deadline := time.Now().Add(c.opts.ReadyTimeout)
	var err error
	n.holder, err = spawn(n.Name+" holder", filepath.Join(n.Dir, "holder.log"),
		"nsenter", "--net=/run/netns/"+n.Name, "--", "unshare", "-m", "-u", "--propagation", "slave", "--",
		"/bin/sh", "-c", holderScript, "sh", n.Name, n.Dir)
	if err != nil {
		return err
	}
	if err := n.holder.wait(ctx, deadline, func() bool {
		_, err := os.Stat(filepath.Join(n.Dir, "holder.ready"))
		return err == nil
	}); err != nil {
		return fmt.Errorf("node %s: set up its namespaces: %w", n.Name, err)
	}
	if n.containerd, err = spawn(n.Name+" containerd", filepath.Join(n.Dir, "containerd.log"),
		n.inNode("containerd", "--config", filepath.Join(n.Dir, "containerd.toml"))...); err != nil {
		return err
	}
	if err := n.containerd.wait(ctx, deadline, func() bool {
		return exec.Command("ctr", "-a", n.socket(), "version").Run() == nil
	}); err != nil {
		return fmt.Errorf("node %s: wait for containerd: %w", n.Name, err)
	}
	for _, img := range c.Images {
		if out, err := exec.CommandContext(ctx, "ctr", "-a", n.socket(), "-n", "k8s.io", "images", "import", img).CombinedOutput(); err != nil {
			return fmt.Errorf("node %s: import %s: %w: %s", n.Name, filepath.Base(img), err, out)
		}
	}
	n.kubelet, err = spawn(n.Name+" kubelet", filepath.Join(n.Dir, "kubelet.log"),
		n.inNode(filepath.Join(BinDir(), "kubelet"), "--config", filepath.Join(n.Dir, "kubelet.yaml"),
			"--kubeconfig", filepath.Join(n.Dir, "kubelet.kubeconfig"), "--root-dir", filepath.Join(n.Dir, "kubelet"),
			"--cert-dir", filepath.Join(n.Dir, "pki"), "--hostname-override", n.Name, "--node-ip", n.IP.String(), "-v=1")...)
	if err != nil {
		return err
	}
	n.kubeProxy, err = spawn(n.Name+" kube-proxy", filepath.Join(n.Dir, "kube-proxy.log"),
		n.inNode(filepath.Join(BinDir(), "kube-proxy"), "--config", filepath.Join(n.Dir, "kube-proxy.yaml"), "-v=1")...)
	return err
}

// Exec runs argv inside node n's network, mount and UTS namespaces (what a
// hostNetwork pod of the node sees) and returns its combined output.
func (n *Node) Exec(argv ...string) (string, error) {
	if n.holder == nil || !n.holder.alive() {
		return "", fmt.Errorf("node %s is not running", n.Name)
	}
	args := append([]string{"-t", strconv.Itoa(n.holder.pid()), "-m", "-n", "-u", "--"}, argv...)
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s on node %s: %w: %s", strings.Join(argv, " "), n.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Kill makes the node die as a machine would: its kubelet and containerd are killed
// and its link to the bridge is cut. Its containers keep running, unreachable, until
// Close.
func (c *Cluster) Kill(n *Node) error {
	n.kubelet.kill()
	n.kubeProxy.kill()
	n.containerd.kill()
	return netlab.IP("-n", c.Net.Switch, "link", "set", n.Net.Port, "down")
}

// stop ends every process of the node (kubelet, containerd, then whatever is left in
// the node's cgroups: shims, sandboxes, containers), the namespaces' holder, and
// removes the node's cgroups.
func (n *Node) stop() error {
	n.kubelet.kill()
	n.kubeProxy.kill()
	n.containerd.kill()
	var errs []error
	if err := n.killCgroups(5 * time.Second); err != nil {
		errs = append(errs, err)
	}
	n.holder.kill()
	if err := n.removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killCgroups sends SIGKILL to every process in the node's cgroups until none is left.
func (n *Node) killCgroups(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := n.cgroupPIDs()
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s: processes left in its cgroups: %v", n.Name, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cgroupPIDs lists the processes in the node's cgroups, in every hierarchy.
func (n *Node) cgroupPIDs() []int {
	seen := map[int]bool{}
	for _, root := range n.cgroups {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// removeCgroups removes the node's cgroups, deepest first, retrying while the kernel
// finishes with the killed processes.
func (n *Node) removeCgroups() error {
	var left []string
	for try := 0; try < 50; try++ {
		left = left[:0]
		for _, root := range n.cgroups {
			var dirs []string
			_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
					left = append(left, dirs[i])
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("node %s: cgroups left: %s", n.Name, strings.Join(left, " "))
}

// HolderPID is the process that holds the node's mount and UTS namespaces: enter the
// node with nsenter -t <pid> -m -n -u.
func (n *Node) HolderPID() int { return n.holder.pid() }
