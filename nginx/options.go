package nginx

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// Options are the deployment-specific parts of a rendered configuration: where nginx
// listens and where it keeps its files. Relative paths are relative to nginx's prefix
// (the -p flag), which the Reloader sets to the directory holding the configuration,
// so the same renderer produces production configurations and test configurations in
// a temporary directory.
type Options struct {
	// Group selects the model.Servers to render (model.Server.Group). Empty renders
	// every server.
	Group string

	// ListenAddrs are the addresses the HTTP and HTTPS servers listen on. Empty means
	// the IPv4 wildcard, plus the IPv6 wildcard when ListenIPv6 is set (nginx does
	// not start when IPv6 is disabled on the node and ListenIPv6 is set).
	ListenAddrs []netip.Addr
	ListenIPv6  bool
	HTTPPort    uint16
	HTTPSPort   uint16
	// StatusPort serves /healthz and /nginx_status (stub_status) on 127.0.0.1 only.
	StatusPort uint16
	// LivenessPort answers GET /live with 200 on the listen addresses (on
	// LivenessAddr alone when it is set), for the liveness checks of every
	// director (package liveness): they reach it over the edge network, so it
	// shows that this nginx serves. 0: no such server.
	LivenessPort uint16
	LivenessAddr netip.Addr

	PIDFile  string // nginx's pid file
	ErrorLog string // a file or "stderr"
	// AccessLog is where nginx writes one JSON line per request (with the
	// Ingress and upstream that served it): "stdout" (the agent's, so the
	// container's log), a file, or "" for none. AccessLogSample is the share of
	// requests it logs, from 0.0001 to 1; 0 means every request.
	AccessLog       string
	AccessLogSample float64
	// Telemetry counts every request in Lua by Ingress and upstream, for the
	// agent's portico_http_* metrics (lua/portico.lua's count and telemetry).
	Telemetry bool
	TempDir   string // parent of nginx's body and proxy temporary directories
	CertDir   string // where WriteCertificates puts the TLS files

	// ModulesDir holds Debian's dynamic modules: the Lua module
	// (libnginx-mod-http-lua) and the development kit it needs.
	ModulesDir string
	// TableFile is the table (routes, certificates with their keys, endpoints:
	// Config.Table) that nginx loads at every start and reload. The Reloader
	// writes it readable by root alone.
	TableFile string
	// ControlSocket is the unix socket nginx takes changes of the table on. Its
	// directory must be private: whoever can connect can reroute traffic. A
	// relative path is relative to the prefix (Exec runs nginx there).
	ControlSocket string
	// L4Dir holds one endpoint file per L4 Service port, which nginx's workers
	// read for every new connection.
	L4Dir string
	// L4Steered are the ports of two fixed stream listeners, on the wildcard
	// addresses of both families, that every L4 Service's TCP connections reach
	// through package dataplane/steer: L4Steered[0] proxies the bytes,
	// L4Steered[1] sends a PROXY header first. A TCP Service that comes,
	// changes or goes is then a route (Config.L4Routes) and a file, never a
	// reload. Zero gives every TCP Service port a listener of its own, as UDP
	// ports have, so that a new one reloads nginx.
	L4Steered [2]uint16
	// DrainTimeout, when not "", bounds how long workers of a replaced
	// configuration keep serving the connections they hold (nginx's
	// worker_shutdown_timeout, "30m"); "" lets them serve until those close.
	DrainTimeout string

	User              string // worker user; "" keeps nginx's default
	WorkerProcesses   int    // 0 means one per core ("auto")
	WorkerConnections int    // 0 means 16384
}

// DefaultOptions are the production options: standard ports on every address (IPv6
// too when the node has it), files under dir (for example /run/portico/nginx, so
// private keys stay on tmpfs).
func DefaultOptions(dir string) Options {
	return Options{
		ListenIPv6:   ipv6Available(),
		HTTPPort:     80,
		HTTPSPort:    443,
		StatusPort:   10246,
		LivenessPort: 10247,
		PIDFile:      path.Join(dir, "nginx.pid"),
		ErrorLog:     "stderr",
		Telemetry:    true,
		TempDir:      path.Join(dir, "tmp"),
		CertDir:      path.Join(dir, "certs"),

		ModulesDir:    "/usr/lib/nginx/modules",
		TableFile:     path.Join(dir, "table.txt"),
		ControlSocket: path.Join(dir, "control", "nginx.sock"),
		L4Dir:         path.Join(dir, "l4"),
	}
}

// drainTimeoutRE is the nginx times DrainTimeout may be.
var drainTimeoutRE = regexp.MustCompile(`^[1-9][0-9]{0,6}[smhd]$`)

// fileNameChar reports whether c may appear in a path written into the configuration.
func fileNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._/", c) >= 0
}

func validateFilePath(name, p string, optional bool) error {
	if p == "" {
		if optional {
			return nil
		}
		return fmt.Errorf("option %s is empty", name)
	}
	for i := 0; i < len(p); i++ {
		if !fileNameChar(p[i]) {
			return fmt.Errorf("option %s %q has character %q outside [A-Za-z0-9-._/]", name, p, p[i])
		}
	}
	return nil
}

func (o Options) validate() error {
	var errs []error
	for _, f := range []struct {
		name, val string
		optional  bool
	}{
		{"PIDFile", o.PIDFile, false},
		{"ErrorLog", o.ErrorLog, false},
		{"AccessLog", o.AccessLog, true},
		{"TempDir", o.TempDir, false},
		{"CertDir", o.CertDir, false},
		{"ModulesDir", o.ModulesDir, false},
		{"TableFile", o.TableFile, false},
		{"ControlSocket", o.ControlSocket, false},
		{"L4Dir", o.L4Dir, false},
	} {
		errs = append(errs, validateFilePath(f.name, f.val, f.optional))
	}
	if o.HTTPPort == 0 || o.HTTPSPort == 0 || o.StatusPort == 0 {
		errs = append(errs, errors.New("options HTTPPort, HTTPSPort and StatusPort must be set"))
	}
	ports := map[uint16]bool{}
	for _, p := range []uint16{o.HTTPPort, o.HTTPSPort, o.StatusPort, o.LivenessPort, o.L4Steered[0], o.L4Steered[1]} {
		if p != 0 && ports[p] {
			errs = append(errs, errors.New("options HTTPPort, HTTPSPort, StatusPort, LivenessPort and L4Steered must differ"))
			break
		}
		ports[p] = true
	}
	if (o.L4Steered[0] == 0) != (o.L4Steered[1] == 0) {
		errs = append(errs, errors.New("option L4Steered needs both ports or neither"))
	}
	if o.User != "" {
		if err := validateLabel(o.User); err != nil {
			errs = append(errs, fmt.Errorf("option User: %w", err))
		}
	}
	for _, a := range o.ListenAddrs {
		if !a.IsValid() || a.Zone() != "" {
			errs = append(errs, fmt.Errorf("option ListenAddrs: %q is not an address without zone", a))
		}
	}
	if o.DrainTimeout != "" && !drainTimeoutRE.MatchString(o.DrainTimeout) {
		errs = append(errs, fmt.Errorf("option DrainTimeout %q is not an nginx time (\"90s\", \"30m\", \"2h\")", o.DrainTimeout))
	}
	if o.AccessLogSample < 0 || o.AccessLogSample > 1 || o.AccessLogSample > 0 && o.AccessLogSample < 0.0001 {
		errs = append(errs, fmt.Errorf("option AccessLogSample %v is not between 0.0001 and 1", o.AccessLogSample))
	}
	if o.WorkerProcesses < 0 || o.WorkerConnections < 0 {
		errs = append(errs, errors.New("options WorkerProcesses and WorkerConnections must not be negative"))
	}
	return errors.Join(errs...)
}

func listenAddrs(o Options) (plain, secure, liveness []string) {
	addrs := func(port uint16) []string {
		if port == 0 {
			return nil
		}
		if len(o.ListenAddrs) == 0 {
			l := []string{strconv.Itoa(int(port))}
			if o.ListenIPv6 {
				l = append(l, "[::]:"+strconv.Itoa(int(port)))
			}
			return l
		}
		var l []string
		for _, a := range o.ListenAddrs {
			l = append(l, netip.AddrPortFrom(a, port).String())
		}
		return l
	}
	live := addrs(o.LivenessPort)
	if o.LivenessPort != 0 && o.LivenessAddr.IsValid() {
		live = []string{netip.AddrPortFrom(o.LivenessAddr, o.LivenessPort).String()}
	}
	return addrs(o.HTTPPort), addrs(o.HTTPSPort), live
}

// ipv6Available reports whether the node has IPv6 (an interface address in
// /proc/net/if_inet6, which is empty or missing when IPv6 is off).
func ipv6Available() bool {
	b, err := os.ReadFile("/proc/net/if_inet6")
	return err == nil && len(bytes.TrimSpace(b)) > 0
}
