package agent

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/api/v1alpha1"
)

// IfaceSource says which list named the edge interface an agent runs on.
type IfaceSource string

const (
	// IfaceFromFlag: --iface (the chart's iface); the node has no
	// portico.io/iface annotation.
	IfaceFromFlag IfaceSource = "--iface"
	// IfaceFromAnnotation: the node's portico.io/iface annotation, which
	// replaces --iface on that node.
	IfaceFromAnnotation IfaceSource = "node annotation " + v1alpha1.AnnotationIface
)

// IfaceChoice is the edge interface an agent runs on, and why.
type IfaceChoice struct {
	Name       string      // the interface
	Source     IfaceSource // the list that named it
	Candidates []string    // that list, in order
	Absent     []string    // the candidates before Name, which the node has not
}

// ParseIfaces splits a list of interface names separated by "," (the form of
// --iface and of the portico.io/iface annotation; spaces around a name are
// dropped) and refuses a name Linux would refuse: empty, longer than 15
// bytes, "." or "..", or with "/", ":" or white space in it.
func ParseIfaces(list string) ([]string, error) {
	var out []string
	for n := range strings.SplitSeq(list, ",") {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			return nil, fmt.Errorf("an empty interface name in %q", list)
		case len(n) > 15:
			return nil, fmt.Errorf("interface name %q is longer than 15 bytes", n)
		case n == "." || n == ".." || strings.ContainsAny(n, "/: \t\n\v\f\r"):
			return nil, fmt.Errorf("%q is not an interface name", n)
		}
		out = append(out, n)
	}
	return out, nil
}

// pickIface picks the edge interface of the agent on node: the first of the
// annotation's candidates present on the node when the node is annotated,
// else the first of iface's (--iface). An annotated node never falls back
// to --iface: the operator named its interface, and XDP on another NIC would
// steer nothing, or the wrong traffic.
func pickIface(node, iface, annotation string, annotated bool, present func(string) bool) (IfaceChoice, error) {
	c := IfaceChoice{Source: IfaceFromFlag}
	list := iface
	if annotated {
		c.Source, list = IfaceFromAnnotation, annotation
	}
	cands, err := ParseIfaces(list)
	if err != nil {
		return c, fmt.Errorf("edge interface of node %s, %s %q: %w", node, c.Source, list, err)
	}
	c.Candidates = cands
	for _, n := range cands {
		if present(n) {
			c.Name = n
			return c, nil
		}
		c.Absent = append(c.Absent, n)
	}
	hint := ""
	if !annotated {
		hint = fmt.Sprintf("; name the node's own in its annotation %s", v1alpha1.AnnotationIface)
	}
	return c, fmt.Errorf("edge interface of node %s: none of %s (%s) is on the node%s",
		node, strings.Join(cands, ", "), c.Source, hint)
}

// nodeReadBackoff paces the retries of the Node's read at start.
var nodeReadBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 10, Cap: 15 * time.Second}

// nodeIfaceAnnotation reads node's portico.io/iface annotation (annotated
// false when the node has none, or an empty one). found is false when there is
// no Node of that name (an agent run as a process beside a bare API server, as
// test/lab does): then no node says otherwise, and --iface holds. It lists
// Nodes by name, which the agent's RBAC allows (list and watch on nodes, for
// its informer) where a get would need a rule of its own. What may pass (the
// API server unreachable as the node boots) is retried with backoff until ctx
// ends; a refusal (401, 403) is returned at once.
func nodeIfaceAnnotation(ctx context.Context, client kubernetes.Interface, node string, backoff wait.Backoff, log *zap.Logger) (annotation string, annotated, found bool, err error) {
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()}
	for {
		list, err := client.CoreV1().Nodes().List(ctx, opts)
		if err == nil {
			for _, n := range list.Items {
				if n.Name == node {
					v := n.Annotations[v1alpha1.AnnotationIface]
					return v, v != "", true, nil
				}
			}
			return "", false, false, nil
		}
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return "", false, false, fmt.Errorf("read node %s for its annotation %s: %w", node, v1alpha1.AnnotationIface, err)
		}
		d := backoff.Step()
		log.Warn("cannot read the node; retrying", zap.String("node", node), zap.Duration("retry", d), zap.Error(err))
		select {
		case <-ctx.Done():
			return "", false, false, fmt.Errorf("read node %s for its annotation %s: %w (last: %w)", node, v1alpha1.AnnotationIface, ctx.Err(), err)
		case <-time.After(d):
		}
	}
}

// ChooseIface picks the edge interface of the agent on node: the first
// candidate present on the node (present says which are) of the node's
// portico.io/iface annotation, or without one of iface (--iface: a name, or
// candidates separated by ","). It reads the Node once and logs the choice and
// why; none present is an error naming the candidates.
func ChooseIface(ctx context.Context, client kubernetes.Interface, node, iface string, present func(string) bool, log *zap.Logger) (IfaceChoice, error) {
	return chooseIface(ctx, client, node, iface, present, nodeReadBackoff, log)
}

func chooseIface(ctx context.Context, client kubernetes.Interface, node, iface string, present func(string) bool, backoff wait.Backoff, log *zap.Logger) (IfaceChoice, error) {
	annotation, annotated, found, err := nodeIfaceAnnotation(ctx, client, node, backoff, log)
	if err != nil {
		return IfaceChoice{}, err
	}
	if !found {
		log.Info("no Node object of this name; --iface alone names the edge interface", zap.String("node", node))
	}
	c, err := pickIface(node, iface, annotation, annotated, present)
	if err != nil {
		return c, err
	}
	log.Info("edge interface chosen", zap.String("iface", c.Name), zap.String("from", string(c.Source)),
		zap.Strings("candidates", c.Candidates), zap.Strings("absent", c.Absent))
	return c, nil
}

// ifacePresent reports whether the host has an interface of that name.
func ifacePresent(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}
