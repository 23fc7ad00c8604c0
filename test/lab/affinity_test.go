package lab

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// setSlice replaces the endpoints of the lab EndpointSlice of Service ns/name
// (written by Backend) with pods.
func (l *Lab) setSlice(ctx context.Context, ns, name string, pods ...*Node) error {
	c := l.Kube.DiscoveryV1().EndpointSlices(ns)
	es, err := c.Get(ctx, name+"-lab", metav1.GetOptions{})
	if err != nil {
		return err
	}
	es.Endpoints = nil
	for _, p := range pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Addr.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
	}
	_, err = c.Update(ctx, es, metav1.UpdateOptions{})
	return err
}

// TestCookieAffinityAcrossEdges: an Ingress with portico.io/affinity: cookie. A
// client's requests, each on a new connection (so spread over the three edges,
// each with its own nginx), all reach the pod its cookie names; the Service's
// endpoints change (a pod leaves and comes back: the client stays; its own pod
// leaves: it moves once, then stays).
func TestCookieAffinityAcrossEdges(t *testing.T) {
	l := startLabWith(t, Options{Portico: porticoBin, Pods: 3})
	ctx := context.Background()
	if err := l.Backend(ctx, "sticky", l.Pods...); err != nil {
		t.Fatal(err)
	}
	if err := l.Ingress(ctx, "sticky", "sticky.lab", "sticky"); err != nil {
		t.Fatal(err)
	}
	if err := l.annotateIngress(ctx, "sticky", "portico.io/affinity", "cookie"); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: l.Dial, DisableKeepAlives: true}}
	get := func(cookie string) (traffic.Reply, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+VIP.String()+"/sticky", nil)
		req.Host = "sticky.lab"
		if cookie != "" {
			req.Header.Set("Cookie", "portico-affinity="+cookie)
		}
		resp, err := c.Do(req)
		if err != nil {
			return traffic.Reply{}, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return traffic.Reply{}, "", fmt.Errorf("status %d", resp.StatusCode)
		}
		set := ""
		for _, h := range resp.Header.Values("Set-Cookie") {
			if v, ok := strings.CutPrefix(h, "portico-affinity="); ok {
				set, _, _ = strings.Cut(v, ";")
			}
		}
		r, err := traffic.ParseReply(string(body))
		return r, set, err
	}
	// Every edge has the affinity once a cookie comes back from 30 first
	// requests in a row.
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		for range 30 {
			if _, set, err := get(""); err != nil || set == "" {
				return fmt.Errorf("no cookie (%v)", err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, cookie, err := get("")
	if err != nil {
		t.Fatal(err)
	}
	// stick sends n requests with the cookie: the pods and edges that answered,
	// and any cookie a response set.
	stick := func(n int, cookie string) (pods, edges map[string]int, set string) {
		pods, edges = map[string]int{}, map[string]int{}
		for range n {
			r, s, err := get(cookie)
			if err != nil {
				t.Fatal(err)
			}
			pods[r.Pod]++
			edges[r.Edge]++
			if s != "" {
				set = s
			}
		}
		return pods, edges, set
	}
	pods, edges, set := stick(60, cookie)
	t.Logf("60 requests with one cookie: pods %v, edges %v", pods, edges)
	if len(pods) != 1 || set != "" {
		t.Fatalf("requests with one cookie reached pods %v (a cookie set: %q), want one", pods, set)
	}
	if len(edges) != len(l.Edges) {
		t.Errorf("requests reached edges %v, want all %d: the test proves less than it says", edges, len(l.Edges))
	}
	var mine *Node
	var others []*Node
	for _, p := range l.Pods {
		if pods[p.Name] > 0 {
			mine = p
		} else {
			others = append(others, p)
		}
	}

	// landed waits until cookie-less requests (new clients, every edge) reach
	// only the pods of set, and all of them: the change reached every edge.
	landed := func(set []*Node) {
		t.Helper()
		if _, err := testenv.Poll(ctx, 15*time.Second, 100*time.Millisecond, func() error {
			seen := map[string]int{}
			for range 30 {
				r, _, err := get("")
				if err != nil {
					return err
				}
				seen[r.Pod]++
			}
			for _, p := range set {
				if seen[p.Name] == 0 {
					return fmt.Errorf("new clients do not reach %s yet", p.Name)
				}
				delete(seen, p.Name)
			}
			if len(seen) > 0 {
				return fmt.Errorf("new clients still reach %v", seen)
			}
			return nil
		}); err != nil {
			t.Fatalf("endpoints %v never reached every edge: %v", names(set), err)
		}
	}
	// Another pod leaves, and comes back: the client stays.
	for _, step := range [][]*Node{{mine, others[1]}, l.Pods} {
		if err := l.setSlice(ctx, AppNamespace, "sticky", step...); err != nil {
			t.Fatal(err)
		}
		landed(step)
		pods, _, set := stick(30, cookie)
		t.Logf("endpoints %v: 30 requests reached %v", names(step), pods)
		if pods[mine.Name] != 30 || set != "" {
			t.Errorf("endpoints %v: the client of %s reached %v (a cookie set: %q)", names(step), mine.Name, pods, set)
		}
	}
	// Its own pod leaves: it moves once and sticks to the new one.
	if err := l.setSlice(ctx, AppNamespace, "sticky", others...); err != nil {
		t.Fatal(err)
	}
	landed(others)
	var moved traffic.Reply
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		r, s, err := get(cookie)
		if err != nil {
			return err
		}
		if r.Pod == mine.Name || s == "" {
			return fmt.Errorf("still on %s", r.Pod)
		}
		moved, cookie = r, s
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pods, _, set = stick(30, cookie)
	t.Logf("%s left: the client moved to %s; 30 more requests reached %v", mine.Name, moved.Pod, pods)
	if pods[moved.Pod] != 30 || set != "" {
		t.Errorf("after moving to %s the client reached %v (a cookie set: %q)", moved.Pod, pods, set)
	}
}
