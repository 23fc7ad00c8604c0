package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/agent/lease"
	"github.com/portico-edge/portico/api/agentstatus"
)

func runStatus(args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig path; empty: the in-cluster config inside a pod, else kubectl's (~/.kube/config)")
	kubeContext := fs.String("context", "", "with a kubeconfig: the context to use (default: its current context)")
	apiServer := fs.String("apiserver", os.Getenv("PORTICO_APISERVER"), "with the in-cluster config: the API server's URL instead of the kubernetes Service (the agent's -apiserver; env PORTICO_APISERVER, which the chart sets)")
	ns := fs.String("namespace", "portico-system", "namespace of the agents' Leases")
	output := fs.String("o", "", "output format: empty for tables, json or yaml (every agent's published state, and whether it is stale)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *output != "" && *output != "json" && *output != "yaml" {
		return fmt.Errorf("-o %q: want json or yaml (or nothing, for tables)", *output)
	}
	cfg, err := statusConfig(*kubeconfig, *kubeContext, *apiServer)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	states, stale, err := lease.ReadStates(ctx, client, *ns)
	if err != nil {
		return err
	}
	if *output != "" {
		return printStatusDoc(os.Stdout, *output, states, stale)
	}
	return printStatus(os.Stdout, states, stale, time.Now())
}

// statusConfig is where portico status (and kubectl portico status) reads the
// cluster: the kubeconfig given; else, inside a pod, the in-cluster config; else
// kubectl's (KUBECONFIG, ~/.kube/config), so it runs from an operator's machine
// without exec into a node.
func statusConfig(path, kubeContext, apiServer string) (*rest.Config, error) {
	if path == "" && (os.Getenv("KUBERNETES_SERVICE_HOST") != "" || apiServer != "") {
		if kubeContext != "" {
			return nil, errors.New("-context goes with a kubeconfig, not with the in-cluster config")
		}
		return kubeConfig("", apiServer)
	}
	if apiServer != "" {
		return nil, errors.New("-apiserver goes with the in-cluster config, not with a kubeconfig")
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return c, nil
}

// agentDoc is one agent in portico status -o json|yaml: its published state as
// api/agentstatus defines it, and whether the report is stale (the agent stopped
// renewing its Lease).
type agentDoc struct {
	agentstatus.State
	Stale bool `json:"stale"`
}

// printStatusDoc writes every agent's state as JSON or YAML, by node name.
func printStatusDoc(out io.Writer, format string, states []agentstatus.State, stale map[string]bool) error {
	doc := struct {
		Agents []agentDoc `json:"agents"`
	}{Agents: []agentDoc{}}
	for _, st := range states {
		doc.Agents = append(doc.Agents, agentDoc{State: st, Stale: stale[st.Node]})
	}
	slices.SortFunc(doc.Agents, func(a, b agentDoc) int { return strings.Compare(a.Node, b.Node) })
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
	} else {
		b = append(b, '\n')
	}
	_, err = out.Write(b)
	return err
}

// printStatus renders every agent's published state: nodes (with the mode
// xdp_lb runs in: native, generic, or "-" when the agent does not say), then
// each VIP with its owner, its replicas' health and ring shares, and the table
// digest on every node, which must agree.
func printStatus(out io.Writer, states []agentstatus.State, stale map[string]bool, now time.Time) error {
	if len(states) == 0 {
		fmt.Fprintln(out, "no agents have reported")
		return nil
	}
	w := table(out)
	fmt.Fprintln(w, "NODE\tGROUP\tHEALTH\tVRRP\tXDP\tREPORTED\t")
	nodeOf := map[string]string{} // replica address -> node
	health := map[string]string{} // node -> health
	for _, st := range states {
		h := "ok"
		if !st.Healthy {
			h = st.Reason
		}
		if stale[st.Node] {
			h = "stale report"
		}
		health[st.Node] = h
		var vr []string
		for name, s := range st.VRRP {
			vr = append(vr, name[strings.LastIndex(name, "/")+1:]+"="+s)
		}
		sort.Strings(vr)
		xdp := st.XDPAttachMode
		if xdp == "" {
			xdp = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s ago\t\n", st.Node, st.Group, h, strings.Join(vr, ","), xdp, now.Sub(st.Updated).Round(time.Second))
		for _, a := range st.Addrs {
			nodeOf[a] = st.Node
		}
	}
	w.Flush()

	// A stale report is what a node said before it stopped reporting (it died, or
	// cannot reach the API server): it is shown above, and counted nowhere below,
	// where it would claim ownership, disagree on digests and vouch for replicas.
	fresh := slices.DeleteFunc(slices.Clone(states), func(st agentstatus.State) bool { return stale[st.Node] })
	if len(fresh) == 0 {
		fresh = states
	}
	type vipKey struct{ group, vip string }
	var keys []vipKey
	seen := map[vipKey]bool{}
	for _, st := range states {
		for _, v := range st.VIPs {
			k := vipKey{st.Group, v.VIP}
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].group+keys[i].vip < keys[j].group+keys[j].vip })
	for _, k := range keys {
		addr, _ := netip.ParseAddr(k.vip)
		owners := agentstatus.Owners(fresh, k.group, addr)
		owner := strings.Join(owners, ",")
		switch len(owners) {
		case 0:
			owner = "none"
		case 1:
		default:
			owner += " (more than one: split brain?)"
		}
		fmt.Fprintf(out, "\nVIP %s  group %s  owner %s\n", k.vip, k.group, owner)

		digests := map[string][]string{}
		var view *agentstatus.VIPState
		for _, st := range fresh {
			for i, v := range st.VIPs {
				if st.Group == k.group && v.VIP == k.vip {
					digests[v.Digest] = append(digests[v.Digest], st.Node)
					if len(owners) == 1 && st.Node == owners[0] || view == nil {
						view = &st.VIPs[i]
					}
				}
			}
		}
		var parts []string
		for d, nodes := range digests {
			parts = append(parts, fmt.Sprintf("%s on %s", orNone(d), strings.Join(nodes, ",")))
		}
		sort.Strings(parts)
		verdict := "all nodes agree"
		if len(digests) > 1 {
			verdict = "NODES DISAGREE: established flows may move on failover"
		}
		fmt.Fprintf(out, "  table digest: %s (%s)\n", strings.Join(parts, "; "), verdict)

		// Every replica Kubernetes lists for the group, and every one in the
		// owner's maps: a replica the liveness checks took out is in no ring.
		inRing := map[string]agentstatus.ReplicaState{}
		var addrs []string
		for _, r := range view.Replicas {
			inRing[r.Addr] = r
			addrs = append(addrs, r.Addr)
		}
		kube := map[string]string{}
		for _, st := range fresh {
			for _, r := range st.Replicas {
				if st.Group != k.group {
					continue
				}
				if _, ok := kube[r.Addr]; !ok {
					kube[r.Addr] = r.Kubernetes
					if _, ok := inRing[r.Addr]; !ok {
						addrs = append(addrs, r.Addr)
					}
				}
			}
		}
		sort.Slice(addrs, func(i, j int) bool { return addrLess(addrs[i], addrs[j]) })
		w := table(out)
		fmt.Fprintln(w, "  REPLICA\tNODE\tKUBERNETES\tLIVENESS (as each node sees it)\tHEALTH\tRING SHARE\tPACKETS (owner)\t")
		for _, a := range addrs {
			node := nodeOf[a]
			h := health[node]
			if node == "" {
				node, h = "?", "no agent report"
			}
			r, ok := inRing[a]
			state := kube[a]
			if ok {
				state = r.State
				if !r.MACKnown {
					state += ", MAC unknown"
				}
			}
			share := "-"
			if ok {
				share = fmt.Sprintf("%.2f%%", 100*r.Share)
			}
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", a, node, state, livenessOf(fresh, k.group, a, now), h, share, r.Packets)
		}
		w.Flush()
	}
	return nil
}

// livenessOf sums up every node's liveness verdict on one replica, e.g.
// "live on edge-1,edge-2; dead for 12s on edge-3".
func livenessOf(states []agentstatus.State, group, addr string, now time.Time) string {
	by := map[string][]string{}
	for _, st := range states {
		if st.Group != group {
			continue
		}
		for _, r := range st.Replicas {
			if r.Addr != addr {
				continue
			}
			v := r.Live
			if !r.Since.IsZero() && r.Live != "unchecked" {
				v += " for " + now.Sub(r.Since).Round(time.Second).String()
			}
			by[v] = append(by[v], st.Node)
		}
	}
	if len(by) == 0 {
		return "-"
	}
	var parts []string
	for v, nodes := range by {
		parts = append(parts, v+" on "+strings.Join(nodes, ","))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// addrLess orders addresses numerically, unparsable ones last by text.
func addrLess(a, b string) bool {
	x, errx := netip.ParseAddr(a)
	y, erry := netip.ParseAddr(b)
	if errx != nil || erry != nil {
		return errx == nil || (erry != nil && a < b)
	}
	return x.Less(y)
}

func orNone(s string) string {
	if s == "" {
		return "(no ring)"
	}
	return s
}
