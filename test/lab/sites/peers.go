package sites

import (
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/test/lab"
)

// SetPeers writes a site's --federation-peers file: the other sites' edges with
// peers, none without (each site on its own, the baseline). Agents follow the
// file within seconds.
func (s *Sites) SetPeers(l *lab.Lab, peers bool) error {
	return s.WriteSites(l, SiteFile{Peers: peers})
}

// SiteFile is what the test tells a site's agents (sites.File).
type SiteFile struct {
	Peers bool // the other site's edges are listed
	// Draining: this site drains from DrainFrom on; PeerDraining: the other
	// sites drain.
	Draining     bool
	DrainFrom    time.Time
	PeerDraining bool
	// Overflow: this site's capacity and where it spills above it.
	Overflow *sites.Overflow
}

// WriteSites writes a site's --federation-peers file (atomically, as the
// kubelet updates a mounted ConfigMap).
func (s *Sites) WriteSites(l *lab.Lab, sf SiteFile) error {
	f := sites.File{Site: l.SiteName(), Draining: sf.Draining, Overflow: sf.Overflow}
	if !sf.DrainFrom.IsZero() {
		f.DrainFrom = &metav1.Time{Time: sf.DrainFrom}
	}
	if sf.Peers {
		for _, o := range s.others(l) {
			p := sites.Peer{Name: o.SiteName(), Draining: sf.PeerDraining}
			for i := range o.Edges {
				p.Edges = append(p.Edges, o.EdgeAddr(i).String())
			}
			f.Peers = append(f.Peers, p)
		}
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	tmp := l.SitesFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, l.SitesFile)
}
