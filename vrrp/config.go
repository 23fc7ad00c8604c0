package vrrp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"
)

// Config is one announcer: the interface adverts go out on, and its virtual
// routers. It is what `portico vrrp` reads from flags or a JSON file.
type Config struct {
	Interface string           `json:"interface"`
	Instances []InstanceConfig `json:"instances"`
}

// InstanceConfig is one virtual router (one VIP group).
type InstanceConfig struct {
	// Name labels logs and metrics; it defaults to "vrid-<VRID>".
	Name string `json:"name,omitempty"`
	// VRID is the virtual router identifier, 1 to 255, unique per family.
	VRID uint8 `json:"vrid"`
	// Version is 3 (default) or 2 (keepalived interop, IPv4 only).
	Version uint8 `json:"version,omitempty"`
	// Priority is 1 to 255 (default 100); 255 is reserved for the address owner.
	Priority uint8 `json:"priority,omitempty"`
	// AdvertInterval is the advertisement interval: centiseconds in version 3,
	// whole seconds in version 2. Default 1s.
	AdvertInterval Duration `json:"advert_interval,omitempty"`
	// NoPreempt turns preemption off (it is on by default).
	NoPreempt bool `json:"no_preempt,omitempty"`
	// PreemptDelay holds preemption back after entering Backup.
	PreemptDelay Duration `json:"preempt_delay,omitempty"`
	// VIPs are the virtual addresses, all of one family.
	VIPs []netip.Addr `json:"vips"`
	// Peers, if set, are sent adverts by unicast instead of multicast. IPv6
	// peers must be given by their link-local address (fe80::/10) on the
	// interface: VRRP v3 adverts are sent from the link-local address (RFC 5798
	// §5.1.2.1), so a peer listed by a global address would never be recognised
	// as the source of its adverts, and each side would become Master. A zone
	// ("%eth0") is allowed and dropped: the interface is Config.Interface.
	Peers []netip.Addr `json:"peers,omitempty"`
	// AcceptAnySource accepts adverts from sources outside Peers; by default,
	// when Peers is set, they are rejected so a stray host cannot take the VIP.
	AcceptAnySource bool `json:"accept_any_source,omitempty"`
	// GARPCount is how many announcements are sent at takeover (default 3),
	// GARPSpacing the gap between them (default 50ms), and GARPRefresh the
	// period of the refresh while Master (default 10s, negative: none). A
	// claim on a VIP by another station is answered with a new burst, but not
	// while one runs nor within GARPSpacing (at least 10ms) of the last
	// announcement, so two Masters do not answer each other without end.
	GARPCount   int      `json:"garp_count,omitempty"`
	GARPSpacing Duration `json:"garp_spacing,omitempty"`
	GARPRefresh Duration `json:"garp_refresh,omitempty"`
}

// Duration is a time.Duration that reads and writes as a Go duration string.
type Duration struct{ time.Duration }

// MarshalJSON writes d as "1.5s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string such as "100ms".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"100ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("parse duration: %w", err)
	}
	d.Duration = v
	return nil
}

// LoadConfig reads a JSON config file, applies defaults and validates it.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read vrrp config: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("parse vrrp config %s: %w", path, err)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("vrrp config %s: %w", path, err)
	}
	return c, nil
}

// SetDefaults fills in every unset field that has a default.
func (c *Config) SetDefaults() {
	for i := range c.Instances {
		in := &c.Instances[i]
		for j, v := range in.VIPs {
			in.VIPs[j] = v.Unmap()
		}
		for j, v := range in.Peers {
			in.Peers[j] = v.Unmap().WithZone("")
		}
		if in.Version == 0 {
			in.Version = 3
		}
		if in.Priority == 0 {
			in.Priority = 100
		}
		if in.AdvertInterval.Duration == 0 {
			in.AdvertInterval.Duration = time.Second
		}
		if in.Name == "" {
			in.Name = fmt.Sprintf("vrid-%d", in.VRID)
		}
		if in.GARPCount == 0 {
			in.GARPCount = 3
		}
		if in.GARPSpacing.Duration == 0 {
			in.GARPSpacing.Duration = 50 * time.Millisecond
		}
		if in.GARPRefresh.Duration == 0 {
			in.GARPRefresh.Duration = 10 * time.Second
		}
	}
}

// Validate checks the config after SetDefaults; it reports every problem.
func (c *Config) Validate() error {
	var errs []error
	if c.Interface == "" {
		errs = append(errs, errors.New("interface is not set"))
	}
	if len(c.Instances) == 0 {
		errs = append(errs, errors.New("no instances"))
	}
	type key struct {
		is4  bool
		vrid uint8
	}
	seenVRID := map[key]string{}
	seenName := map[string]bool{}
	for _, in := range c.Instances {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("instance %s: %s", in.Name, fmt.Sprintf(format, args...)))
		}
		if seenName[in.Name] {
			bad("name used twice")
		}
		seenName[in.Name] = true
		if in.VRID == 0 {
			bad("vrid must be 1 to 255")
		}
		if len(in.VIPs) == 0 {
			bad("no vips")
			continue
		}
		is4 := in.VIPs[0].Unmap().Is4()
		for _, v := range in.VIPs {
			if !v.IsValid() || v.Unmap().Is4() != is4 {
				bad("vips must all be valid and of one family")
				break
			}
		}
		for _, p := range in.Peers {
			switch {
			case !p.IsValid() || p.Unmap().Is4() != is4:
				bad("peer %v is not of the vips' family", p)
			case !is4 && !p.IsLinkLocalUnicast():
				bad("peer %v is not a link-local address: IPv6 adverts come from the sender's link-local address (RFC 5798 §5.1.2.1), so list each IPv6 peer by its fe80:: address on the interface", p)
			}
		}
		k := key{is4, in.VRID}
		if other, ok := seenVRID[k]; ok {
			bad("vrid %d already used by %s", in.VRID, other)
		}
		seenVRID[k] = in.Name
		iv := in.AdvertInterval.Duration
		switch in.Version {
		case 2:
			if !is4 {
				bad("version 2 is IPv4 only")
			}
			if iv%time.Second != 0 || iv < time.Second || iv > 255*time.Second {
				bad("version 2 advert_interval must be 1 to 255 whole seconds, not %v", iv)
			}
		case 3:
			if iv%(10*time.Millisecond) != 0 || iv < 10*time.Millisecond || iv > 4095*10*time.Millisecond {
				bad("version 3 advert_interval must be 10ms to 40.95s in centiseconds, not %v", iv)
			}
		default:
			bad("version must be 2 or 3, not %d", in.Version)
		}
		if in.PreemptDelay.Duration < 0 {
			bad("preempt_delay is negative")
		}
		if in.GARPCount < 1 {
			bad("garp_count must be at least 1")
		}
		if in.GARPSpacing.Duration < 0 {
			bad("garp_spacing is negative")
		}
	}
	return errors.Join(errs...)
}
