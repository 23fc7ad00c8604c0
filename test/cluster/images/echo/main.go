// Command echo is the backend of Portico's real-cluster lab (test/cluster): a tiny HTTP
// server whose answers say which pod served them and whom it saw, so tests can tell
// replicas apart and check that the client address survives the edge.
//
//	GET /        "pod=<name> node=<node> edge=<the peer's address> client=<X-Real-IP> host=<Host> path=<path>\n"
//
// (the format of test/traffic's replies: behind Portico the peer is an edge node's
// nginx, and X-Real-IP is the client's address as nginx saw it)
//
//	GET /healthz "ok" (readiness and liveness probes)
//	GET /info    JSON: pod, node, hostname, network namespace, bpffs entries, client
//
// The pod and node names come from the environment (POD_NAME, NODE_NAME, set from the
// downward API), else the hostname.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
)

// Info is what GET /info answers.
type Info struct {
	Pod      string   `json:"pod"`
	Node     string   `json:"node"`
	Hostname string   `json:"hostname"`
	NetNS    string   `json:"netns"` // readlink /proc/self/ns/net, e.g. "net:[4026532291]"
	BPFFS    []string `json:"bpffs"` // names in /sys/fs/bpf, sorted
	Client   string   `json:"client"`
}

func main() {
	listen := flag.String("listen", ":8080", "address to serve HTTP on")
	flag.Parse()
	host, _ := os.Hostname()
	pod := envOr("POD_NAME", host)
	node := envOr("NODE_NAME", "")
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		peer, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "pod=%s node=%s edge=%s client=%s host=%s path=%s\n", pod, node, peer, r.Header.Get("X-Real-IP"), r.Host, r.URL.Path)
	})
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	http.HandleFunc("/info", func(w http.ResponseWriter, r *http.Request) {
		netns, _ := os.Readlink("/proc/self/ns/net")
		var bpf []string
		if ents, err := os.ReadDir("/sys/fs/bpf"); err == nil {
			for _, e := range ents {
				bpf = append(bpf, e.Name())
			}
		}
		sort.Strings(bpf)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(Info{Pod: pod, Node: node, Hostname: host, NetNS: netns, BPFFS: bpf, Client: r.RemoteAddr})
	})
	log.Printf("echo: pod %s serving on %s", pod, *listen)
	log.Fatal(http.ListenAndServe(*listen, nil))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
