package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/dataplane/steer"
	"github.com/portico-edge/portico/nginx"
)

// loadSteering loads the sk_lookup program that gives L4 Services' TCP
// connections to nginx's fixed listeners (cfg.L4SteerPort and the next port),
// pinned beside xdp_lb, and registers its counters.
func loadSteering(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*steer.Steering, error) {
	if cfg.L4SteerPort == 0xffff {
		return nil, fmt.Errorf("L4 steer port %d: its PROXY listener would need port %d", cfg.L4SteerPort, 0x10000)
	}
	st, err := steer.Load(steer.Options{PinPath: cfg.PinPath, Ports: [2]uint16{cfg.L4SteerPort, cfg.L4SteerPort + 1}, Logger: log})
	if err != nil {
		return nil, err
	}
	reg.MustRegister(steer.NewCollector(st))
	return st, nil
}

// steerRoutes is nginx's SteerL4: the routes of the configuration nginx serves,
// to its master's listeners.
func steerRoutes(st *steer.Steering) func(pid int, routes []nginx.L4Route) error {
	return func(pid int, routes []nginx.L4Route) error {
		rs := make([]steer.Route, len(routes))
		for i, r := range routes {
			rs[i] = steer.Route{VIP: r.VIP, Class: steer.Class(r.Class), Listen: r.Listen}
		}
		return st.Sync(pid, rs)
	}
}
