package federation

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/api/v1alpha1"
)

const (
	// PeersConfigMap is the ConfigMap the controller writes into every member's
	// agents namespace: key PeersKey holds the api/sites File of that site (the
	// other sites' edges, and who drains), which the chart mounts for the
	// agents' --federation-peers.
	PeersConfigMap = "portico-federation-peers"
	PeersKey       = "peers.yaml"
)

// siteInfo is what the controller tells the other sites of one.
type siteInfo struct {
	edges      []string // the edges' tunnel addresses, sorted
	draining   bool
	drainFrom  *metav1.Time
	drainGrace *metav1.Duration
	overflow   *sites.Overflow
}

// syncPeers writes every reachable member's PeersConfigMap. A site's edges are
// its agents' (their status Leases: the tunnel address each reports, else its
// edge interface's first IPv4 address); the last edges seen of a site are kept
// while it reports none (an unreachable member's informer holds only stale
// Leases), so losing a member, or the host, changes nothing the sites were told.
func (c *Controller) syncPeers(ctx context.Context) {
	list, err := c.secrets.List(labels.Everything())
	if err != nil {
		c.log.Warn("list member secrets", zap.Error(err))
		return
	}
	secrets := map[string]*corev1.Secret{}
	for _, s := range list {
		secrets[memberName(s)] = s
	}
	infos := c.siteInfos(ctx, secrets)
	c.policies(infos)
	for name := range infos {
		m := c.member(name)
		if m == nil {
			continue
		}
		if _, down := m.unreachable(time.Now()); down {
			continue
		}
		err := writePeers(ctx, m, c.peersFile(name, infos, secrets[name]))
		m.noteCall(err, time.Now(), c.cfg.Resync)
		if err != nil {
			c.log.Warn("write federation peers", zap.String("cluster", name), zap.Error(err))
		}
	}
}

// siteInfos is what the member Secrets (by cluster) and the sites' agents say of
// every member: its edges (the last seen while it reports none), its drain and
// its overflow.
func (c *Controller) siteInfos(ctx context.Context, secrets map[string]*corev1.Secret) map[string]siteInfo {
	infos := map[string]siteInfo{}
	for _, name := range c.memberNames() {
		s := secrets[name]
		if s == nil {
			continue
		}
		info := siteInfo{}
		if m := c.member(name); m != nil {
			info.edges = tunnelEdges(m)
		}
		c.mu.Lock()
		if len(info.edges) == 0 {
			info.edges = c.peerEdges[name]
		} else {
			c.peerEdges[name] = info.edges
		}
		c.mu.Unlock()
		info.draining, info.drainFrom = c.drain(ctx, s)
		info.overflow = c.overflow(s, len(info.edges))
		infos[name] = info
	}
	return infos
}

// peersFile is the api/sites File the site name is told: its own drain and
// overflow, and every other site with edges. An overflow to a site without edges
// is reported on the member's Secret s and dropped.
func (c *Controller) peersFile(name string, infos map[string]siteInfo, s *corev1.Secret) sites.File {
	f := sites.File{Site: name, Draining: infos[name].draining, DrainFrom: infos[name].drainFrom, Overflow: infos[name].overflow,
		DrainGrace: infos[name].drainGrace}
	if o := f.Overflow; o != nil && len(infos[o.To].edges) == 0 {
		c.warnOnce(s, s.Namespace+"/"+s.Name+"/overflow", "InvalidOverflow",
			fmt.Sprintf("annotation %s=%q: no member cluster of that name with edges; the site does not overflow", v1alpha1.AnnotationOverflowTo, o.To))
		f.Overflow = nil
	}
	for _, other := range sortedKeys(infos) {
		if other == name || len(infos[other].edges) == 0 {
			continue
		}
		f.Peers = append(f.Peers, sites.Peer{Name: other, Edges: infos[other].edges, Draining: infos[other].draining})
	}
	return f
}

// tunnelEdges lists a member's edges' tunnel addresses from its agents' fresh
// status Leases.
func tunnelEdges(m *member) []string {
	list, err := m.leases.List(labels.Everything())
	if err != nil {
		return nil
	}
	ls := make([]agentstatus.Lease, 0, len(list))
	for _, l := range list {
		ls = append(ls, agentstatus.LeaseOf(l))
	}
	states, stale := agentstatus.DecodeStates(ls)
	var out []string
	for _, st := range states {
		if stale[st.Node] {
			continue
		}
		if a := tunnelOf(st); a != "" {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// tunnelOf is an edge's tunnel address: the one it reports, else its edge
// interface's first IPv4 address (the agent's default).
func tunnelOf(st agentstatus.State) string {
	if st.Tunnel != "" {
		return st.Tunnel
	}
	for _, a := range st.Addrs {
		if ip, err := netip.ParseAddr(a); err == nil && ip.Unmap().Is4() {
			return ip.Unmap().String()
		}
	}
	return ""
}

// writePeers creates or updates the member's PeersConfigMap when it differs.
func writePeers(ctx context.Context, m *member, f sites.File) error {
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	c := m.client.CoreV1().ConfigMaps(m.agents)
	cur, err := c.Get(ctx, PeersConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: PeersConfigMap, Namespace: m.agents,
			Labels: map[string]string{"app.kubernetes.io/part-of": "portico", "app.kubernetes.io/managed-by": FieldManager}},
			Data: map[string]string{PeersKey: string(b)}}
		_, err = c.Create(ctx, cm, metav1.CreateOptions{FieldManager: FieldManager})
		return err
	case err != nil:
		return err
	case cur.Data[PeersKey] == string(b):
		return nil
	}
	cur.Data = map[string]string{PeersKey: string(b)}
	_, err = c.Update(ctx, cur, metav1.UpdateOptions{FieldManager: FieldManager})
	return err
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
