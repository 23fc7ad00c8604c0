package bgp

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
)

// TestFRRReconfigure changes a running speaker's peer against FRR: the session
// uses TCP MD5 (RFC 2385) between the namespaces; new BFD timers and a new hold
// time leave the running session alone (FRR counts no drop, its BFD keeps the
// old interval) and the next session, after FRR's clear bgp, runs BFD at the
// new one; a wrong password restarts the session and keeps it down (MD5 is
// enforced), the right one brings it back.
func TestFRRReconfigure(t *testing.T) {
	const password = "lab-s3cret"
	l := newFRRLab(t, " neighbor 10.99.2.11 remote-as 65001", " neighbor 10.99.2.11 password "+password)
	cfg := l.cfg
	cfg.Peers[0].Password = password
	sp := l.startSpeaker(cfg)
	l.waitUp(sp)

	reconfigure := func(p Peer) {
		t.Helper()
		b, err := json.Marshal([]Peer{p})
		if err != nil {
			t.Fatal(err)
		}
		sp.do("peers " + string(b))
	}
	// bfdTx waits until FRR's BFD session is up with the speaker sending every
	// ms milliseconds.
	bfdTx := func(ms int) {
		t.Helper()
		testenv.Eventually(t, settle, func() string {
			var peers []struct {
				Status   string `json:"status"`
				RemoteTx int    `json:"remote-transmit-interval"`
			}
			if err := l.r.VtyJSON("show bfd peers json", &peers); err != nil {
				return err.Error()
			}
			if len(peers) != 1 || peers[0].Status != "up" || peers[0].RemoteTx != ms {
				return fmt.Sprintf("FRR's BFD sessions %+v, want one up at %d ms", peers, ms)
			}
			return ""
		})
	}
	bfdTx(bfdMs)

	// New BFD timers: the running BFD session keeps its own (changing them
	// would end it, and FRR would reset BGP), the next session takes them.
	p := cfg.Peers[0]
	p.BFD = &BFD{MinTx: 200 * time.Millisecond, MinRx: 200 * time.Millisecond, Multiplier: 3}
	reconfigure(p)
	time.Sleep(2 * time.Second) // a reset would show by now
	if d := l.sessionDrops(); d != 0 {
		t.Fatalf("FRR's session dropped %d times after the BFD timers changed, want 0 (BFD downs at FRR: %s)", d, l.bfdDowns())
	}
	bfdTx(bfdMs)
	p.HoldTime, p.KeepaliveInterval = 6*time.Second, 2*time.Second
	reconfigure(p)
	time.Sleep(2 * time.Second)
	if d := l.sessionDrops(); d != 0 {
		t.Fatalf("FRR's session dropped %d times after the hold time changed, want 0", d)
	}
	if err := l.r.Vty("clear bgp 10.99.2.11"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, settle, func() string {
		if d := l.sessionDrops(); d != 1 {
			return fmt.Sprintf("FRR's session dropped %d times after clear bgp, want 1", d)
		}
		return ""
	})
	l.waitUp(sp)
	bfdTx(200)

	// A wrong password: GoBGP restarts the session, FRR refuses its segments.
	p.Password = "wrong"
	reconfigure(p)
	testenv.Eventually(t, settle, func() string {
		if d := l.sessionDrops(); d != 2 {
			return fmt.Sprintf("FRR's session dropped %d times after the password changed, want 2", d)
		}
		return ""
	})
	time.Sleep(5 * time.Second) // a connect retry every second
	var n map[string]struct {
		State string `json:"bgpState"`
	}
	if err := l.r.VtyJSON("show bgp neighbors 10.99.2.11 json", &n); err != nil {
		t.Fatal(err)
	}
	if st := n["10.99.2.11"].State; st == "Established" {
		t.Fatalf("FRR's session with a wrong TCP MD5 password is %s", st)
	}
	p.Password = password
	reconfigure(p)
	l.waitUp(sp)
}
