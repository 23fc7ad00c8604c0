package bgpfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLoad: a file reads with its durations; an unknown field is an error that
// names it.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	body := "asn: 64512\nwithdrawAfter: 5s\nbfdProfiles:\n- {name: fast, transmitInterval: 50ms, receiveInterval: 50ms, detectMultiplier: 3}\npeers:\n- {address: 10.0.0.1, asn: 64500, bfdProfile: fast, nodes: [n1]}\n"
	if err := os.WriteFile(good, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Load(good)
	if err != nil {
		t.Fatal(err)
	}
	if f.ASN != 64512 || f.WithdrawAfter.Duration != 5*time.Second || f.BFDProfiles[0].TransmitInterval.Duration != 50*time.Millisecond ||
		len(f.Peers) != 1 || f.Peers[0].BFDProfile != "fast" || f.Peers[0].Nodes[0] != "n1" {
		t.Errorf("read %+v", f)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("asn: 64512\npeer: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("unknown field: error %v", err)
	}
}
