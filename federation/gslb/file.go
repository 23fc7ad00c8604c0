package gslb

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/agent/lease"
	"github.com/portico-edge/portico/api/agentstatus"
)

// File is a site's DNS configuration as written (YAML or JSON; durations as "5s").
// Every site's file lists the same names and sites; only Self differs.
type File struct {
	Self         string           `json:"self"`
	Names        []string         `json:"names"`
	Sites        []Site           `json:"sites"`
	TTL          *metav1.Duration `json:"ttl,omitempty"`
	Interval     *metav1.Duration `json:"interval,omitempty"`
	ProbeTimeout *metav1.Duration `json:"probeTimeout,omitempty"`
	FailAfter    int              `json:"failAfter,omitempty"`
	RiseAfter    int              `json:"riseAfter,omitempty"`
}

// LoadFile reads a File, rejecting unknown fields, into a Config (OwnHealth unset).
func LoadFile(path string) (Config, error) {
	var f File
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read gslb config: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return Config{}, fmt.Errorf("gslb config %s: %w", path, err)
	}
	c := Config{Self: f.Self, Names: f.Names, Sites: f.Sites, FailAfter: f.FailAfter, RiseAfter: f.RiseAfter}
	for _, d := range []struct {
		from *metav1.Duration
		to   *time.Duration
	}{{f.TTL, &c.TTL}, {f.Interval, &c.Interval}, {f.ProbeTimeout, &c.ProbeTimeout}} {
		if d.from != nil {
			*d.to = d.from.Duration
		}
	}
	return c, nil
}

// AgentsHealth judges the own site from its Portico agents' status Leases in ns:
// healthy while a renewed report shows an edge announcing its group's VIPs as
// preferred (BGP) or owning them (VRRP master). The agents already stop doing so
// when the site's federated Ingresses have no ready backend, so this is the same
// verdict routers see.
func AgentsHealth(client kubernetes.Interface, ns string) func(context.Context) Report {
	return func(ctx context.Context) Report {
		states, stale, err := lease.ReadStates(ctx, client, ns)
		if err != nil {
			return Report{Reason: fmt.Sprintf("read the agents' reports: %v", err)}
		}
		var seen []string
		for _, st := range states {
			if stale[st.Node] {
				continue
			}
			seen = append(seen, st.Node)
			if st.BGP != nil && st.BGP.Preference == agentstatus.PreferenceNormal && len(st.BGP.Announced) > 0 {
				return Report{Healthy: true}
			}
			if st.BGP == nil {
				for _, v := range st.VRRP {
					if v == agentstatus.VRRPMaster {
						return Report{Healthy: true}
					}
				}
			}
		}
		return Report{Reason: fmt.Sprintf("no edge announces as preferred (renewed reports: %s)", strings.Join(seen, ", "))}
	}
}
