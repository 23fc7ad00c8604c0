package controlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/deploy"
)

// overridden lists what of the template t the operator's settings (cfg) and
// the manifest's ServiceAccount (sa) override: each field and why.
func overridden(t v1alpha1.ReplicaTemplate, cfg Config, sa string) [][2]string {
	var out [][2]string
	if t.ServiceAccountName != "" && t.ServiceAccountName != sa {
		out = append(out, [2]string{"spec.template.serviceAccountName",
			fmt.Sprintf("the agents run as ServiceAccount %s, the operator's, not %s", sa, t.ServiceAccountName)})
	}
	if t.Interface != "" && cfg.ClaimIface != "" && t.Interface != cfg.ClaimIface {
		out = append(out, [2]string{"spec.template.interface",
			fmt.Sprintf("the agents use interface %s, the operator's, not %s", cfg.ClaimIface, t.Interface)})
	}
	for _, k := range slices.Sorted(maps.Keys(t.NodeSelector)) {
		if v, ok := cfg.ClaimNodeSelector[k]; ok && v != t.NodeSelector[k] {
			out = append(out, [2]string{"spec.template.nodeSelector",
				fmt.Sprintf("node label %s is %q by the operator's selector, not %q", k, v, t.NodeSelector[k])})
		}
	}
	return out
}

// claimNodeSelector is the nodes a claim's agents run on: the operator's
// selector with the template's other labels added (the operator's win).
func claimNodeSelector(t v1alpha1.ReplicaTemplate, cfg Config) map[string]string {
	if len(t.NodeSelector) == 0 && len(cfg.ClaimNodeSelector) == 0 {
		return nil
	}
	out := maps.Clone(t.NodeSelector)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, cfg.ClaimNodeSelector)
	return out
}

// claimFromUnstructured decodes an informer object.
func claimFromUnstructured(u *unstructured.Unstructured) (*v1alpha1.IngressClaim, error) {
	var c v1alpha1.IngressClaim
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c); err != nil {
		return nil, fmt.Errorf("decode IngressClaim %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &c, nil
}

// claimReplicas is the agents the claim's group should have (the CRD's default 2 when
// the template does not say).
func claimReplicas(c *v1alpha1.IngressClaim) int32 {
	if c.Spec.Template.Replicas > 0 {
		return c.Spec.Template.Replicas
	}
	return 2
}

func claimOwnerRef(c *v1alpha1.IngressClaim) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: v1alpha1.IngressClaimResource.GroupVersion().String(), Kind: "IngressClaim",
		Name: c.Name, UID: c.UID, Controller: ptrTo(true), BlockOwnerDeletion: ptrTo(true)}
}

func claimRef(c *v1alpha1.IngressClaim) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: v1alpha1.IngressClaimResource.GroupVersion().String(), Kind: "IngressClaim",
		Namespace: c.Namespace, Name: c.Name, UID: c.UID}
}

func ptrTo[T any](v T) *T { return &v }

func ownedBy(o metav1.Object, c *v1alpha1.IngressClaim) bool {
	for _, r := range o.GetOwnerReferences() {
		if r.UID == c.UID {
			return true
		}
	}
	return false
}

// claimService is the group Service a claim provisions.
func claimService(c *v1alpha1.IngressClaim) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name,
			Labels:          map[string]string{v1alpha1.LabelGroup: "true", v1alpha1.LabelClaim: c.Name},
			OwnerReferences: []metav1.OwnerReference{claimOwnerRef(c)}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{v1alpha1.LabelClaim: c.Name},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(80)},
				{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(443)},
			},
		},
	}
}

// claimDaemonSet is the agent DaemonSet of a claim's group: deploy/agent.yaml's
// (deploy.AgentDaemonSet, so the same pod, tolerations, priority class, grace period
// and update strategy) with only what a claim changes: its name, namespace, labels,
// selector and owner; its nodes (the operator's selector, narrowed by the
// template's) and the operator's interface; the group; the Lease namespace leaseNS;
// the image, API server address, log level and XDP mode, unless empty; and the VIP
// pools, the provisioning leader's own, so an agent of the claim that becomes leader
// allocates as it did.
func claimDaemonSet(c *v1alpha1.IngressClaim, cfg Config) (*appsv1.DaemonSet, error) {
	image, apiServer, leaseNS, pools := cfg.AgentImage, cfg.AgentAPIServer, cfg.LeaseNamespace, cfg.Pools
	ds, err := deploy.AgentDaemonSet()
	if err != nil {
		return nil, err
	}
	pod := &ds.Spec.Template.Spec
	i := slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "agent" })
	if i < 0 {
		return nil, errors.New("deploy/agent.yaml: no container named agent")
	}
	agent := &pod.Containers[i]
	labels := map[string]string{v1alpha1.LabelClaim: c.Name}
	ds.ObjectMeta = metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, Labels: labels,
		OwnerReferences: []metav1.OwnerReference{claimOwnerRef(c)}}
	ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	ds.Spec.Template.Labels = maps.Clone(labels)
	pod.NodeSelector = claimNodeSelector(c.Spec.Template, cfg)
	if image != "" {
		agent.Image = image
		// Its agents provision claims with the same image when they lead.
		agent.Args = setFlag(agent.Args, "claim-image", image)
	}
	if apiServer != "" {
		agent.Args = setFlag(agent.Args, "apiserver", apiServer)
	}
	if cfg.AgentLogLevel != "" {
		agent.Args = setFlag(agent.Args, "log-level", cfg.AgentLogLevel)
	}
	agent.Args = setFlag(agent.Args, "group", c.Namespace+"/"+c.Name)
	if cfg.ClaimIface != "" {
		agent.Args = setFlag(agent.Args, "iface", cfg.ClaimIface)
	}
	// Its agents may lead too, and place the claims they provision alike.
	agent.Args = setFlag(agent.Args, "claim-iface", cfg.ClaimIface)
	agent.Args = setFlag(agent.Args, "claim-node-selector", FormatNodeSelector(cfg.ClaimNodeSelector))
	agent.Args = setFlag(agent.Args, "pod-namespace", leaseNS)
	var ps []string
	for _, p := range pools {
		ps = append(ps, p.String())
	}
	agent.Args = setFlag(agent.Args, "vip-pool", strings.Join(ps, ";"))
	// Its agents may lead too: they honour the same groups and reserve the
	// same ports as the provisioning one, so every leader decides alike.
	agent.Args = setFlag(agent.Args, "group-namespaces", strings.Join(cfg.GroupNamespaces, ","))
	var rs []string
	for p := range cfg.ReservedPorts {
		rs = append(rs, fmt.Sprintf("%d/%s", p.Port, strings.ToLower(string(p.Protocol))))
	}
	slices.Sort(rs)
	agent.Args = setFlag(agent.Args, "reserved-ports", strings.Join(rs, ","))
	if cfg.AgentXDPMode != "" {
		// The operator's NICs, the operator's requirement of them.
		agent.Args = setFlag(agent.Args, "xdp-mode", cfg.AgentXDPMode)
	}
	return ds, nil
}

// setFlag returns a copy of args with --name=value in place of the first
// --name=..., or appended when there is none; an empty value removes the flag.
func setFlag(args []string, name, value string) []string {
	prefix := "--" + name + "="
	out := slices.Clone(args)
	i := slices.IndexFunc(out, func(a string) bool { return strings.HasPrefix(a, prefix) })
	switch {
	case value == "" && i >= 0:
		return slices.Delete(out, i, i+1)
	case value == "":
		return out
	case i >= 0:
		out[i] = prefix + value
		return out
	default:
		return append(out, prefix+value)
	}
}

// reconcileClaims provisions, binds, reports and reclaims every IngressClaim, and
// returns the claims' problems for report. Leader only.
func (c *Controller) reconcileClaims(ctx context.Context, st State, snap model.Snapshot) ([]model.Problem, error) {
	if c.claimInformer == nil {
		return nil, nil
	}
	var errs []error
	var problems []model.Problem
	ix := newClaimIndex(st, snap)
	objs := c.claimInformer.GetStore().List()
	// In name order, so the groups they create are allocated in a predictable order.
	slices.SortFunc(objs, func(x, y any) int {
		return cmp.Compare(cache.MetaObjectToName(x.(metav1.Object)).String(), cache.MetaObjectToName(y.(metav1.Object)).String())
	})
	seen := map[types.UID]bool{}
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		claim, err := claimFromUnstructured(u)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		seen[claim.UID] = true
		if claim.DeletionTimestamp != nil {
			continue
		}

		if err := c.reconcileClaim(ctx, claim, ix, &problems); err != nil {
			errs = append(errs, fmt.Errorf("reconcile IngressClaim %s/%s: %w", claim.Namespace, claim.Name, err))
		}
	}
	c.mu.Lock()
	maps.DeleteFunc(c.provisioned, func(uid types.UID, _ time.Time) bool { return !seen[uid] })
	c.mu.Unlock()
	return problems, errors.Join(errs...)
}

// claimIndex looks up, once per sync, what the claims read.
type claimIndex struct {
	services  map[string]*corev1.Service       // by namespace/name
	ingresses map[string]*networkingv1.Ingress // by namespace/name
	groups    map[string]*model.Group          // by name
}

func newClaimIndex(st State, snap model.Snapshot) *claimIndex {
	ix := &claimIndex{services: make(map[string]*corev1.Service, len(st.Services)),
		ingresses: make(map[string]*networkingv1.Ingress, len(st.Ingresses)), groups: make(map[string]*model.Group, len(snap.Groups))}
	for _, s := range st.Services {
		ix.services[key(s)] = s
	}
	for _, i := range st.Ingresses {
		ix.ingresses[key(i)] = i
	}
	for i := range snap.Groups {
		ix.groups[snap.Groups[i].Name] = &snap.Groups[i]
	}
	return ix
}

func (c *Controller) reconcileClaim(ctx context.Context, claim *v1alpha1.IngressClaim, ix *claimIndex, problems *[]model.Problem) error {
	warn := func(field string, reason model.Reason, detail string) {
		*problems = append(*problems, model.Problem{Object: "IngressClaim " + claim.Namespace + "/" + claim.Name,
			Field: field, Reason: reason, Detail: detail})
	}
	if ns := c.cfg.GroupNamespaces; len(ns) > 0 && !slices.Contains(ns, claim.Namespace) {
		// Its agents would be privileged hostNetwork pods: only the operator's
		// namespaces provision them.
		msg := fmt.Sprintf("IngressClaims are served only in namespaces %s", strings.Join(ns, ", "))
		warn("metadata.namespace", model.ReasonClaimNotAllowed, msg)
		return c.writeClaimStatus(ctx, claim, v1alpha1.IngressClaimStatus{Phase: v1alpha1.ClaimPending, Message: msg}, v1alpha1.ClaimReasonNotAllowed)
	}
	group := claim.Namespace + "/" + claim.Name
	status := v1alpha1.IngressClaimStatus{Group: group}
	if ds, err := deploy.AgentDaemonSet(); err == nil {
		for _, o := range overridden(claim.Spec.Template, c.cfg, ds.Spec.Template.Spec.ServiceAccountName) {
			warn(o[0], model.ReasonClaimTemplateOverridden, o[1])
		}
	}

	// Which listed Ingresses exist, and which are bound here.
	var existing []string
	for _, r := range claim.Spec.Ingresses {
		if ix.ingresses[claim.Namespace+"/"+r.Name] != nil && !slices.Contains(existing, r.Name) {
			existing = append(existing, r.Name)
		}
	}
	slices.Sort(existing)

	if len(existing) == 0 {
		if claim.Status.Phase == v1alpha1.ClaimBound || claim.Status.Phase == v1alpha1.ClaimReleased {
			return c.reclaim(ctx, claim)
		}
		status.Phase = v1alpha1.ClaimPending
		status.Message = "none of the listed Ingresses exists yet"
		return c.writeClaimStatus(ctx, claim, status, v1alpha1.ClaimReasonPending)
	}

	// The group Service.
	svc := ix.services[group]
	switch {
	case svc == nil:
		_, err := c.cfg.Client.CoreV1().Services(claim.Namespace).Create(ctx, claimService(claim), metav1.CreateOptions{})
		c.countWrite("claim-service", err)
		switch {
		case err == nil:
			c.recorder.Eventf(claimRef(claim), corev1.EventTypeNormal, "Provisioned", "created group Service %s", group)
		case !apierrors.IsAlreadyExists(err): // already: made by the previous sync, not cached yet
			return fmt.Errorf("create group Service: %w", err)
		}
	case !ownedBy(svc, claim):
		status.Phase = v1alpha1.ClaimPending
		status.Message = fmt.Sprintf("Service %s exists and is not owned by this claim", group)
		warn("metadata.name", model.ReasonNameTaken, status.Message)
		return c.writeClaimStatus(ctx, claim, status, v1alpha1.ClaimReasonNameTaken)
	}
	// The agents' DaemonSet: the API server is asked (no DaemonSet informer) when
	// this leader has not seen it for the claim yet, and again once per resync
	// period, so one deleted by hand comes back.
	c.mu.Lock()
	at, seen := c.provisioned[claim.UID]
	c.mu.Unlock()
	if !seen || time.Since(at) > c.cfg.ResyncPeriod {
		dsc := c.cfg.Client.AppsV1().DaemonSets(claim.Namespace)
		if _, err := dsc.Get(ctx, claim.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			ds, err := claimDaemonSet(claim, c.cfg)
			if err != nil {
				return fmt.Errorf("derive DaemonSet: %w", err)
			}
			_, err = dsc.Create(ctx, ds, metav1.CreateOptions{})
			c.countWrite("claim-daemonset", err)
			switch {
			case err == nil:
				c.recorder.Eventf(claimRef(claim), corev1.EventTypeNormal, "Provisioned", "created agent DaemonSet %s", group)
			case !apierrors.IsAlreadyExists(err):
				return fmt.Errorf("create DaemonSet: %w", err)
			}
		} else if err != nil {
			return fmt.Errorf("get DaemonSet: %w", err)
		}
		c.mu.Lock()
		c.provisioned[claim.UID] = time.Now()
		c.mu.Unlock()
	}

	// Bind the listed Ingresses (sticky: one bound elsewhere is reported, not moved).
	for _, name := range existing {
		ing := ix.ingresses[claim.Namespace+"/"+name]
		if ing == nil {
			continue
		}
		cur, bound := ing.Annotations[v1alpha1.AnnotationGroup]
		switch {
		case !bound:
			applied, err := c.annotate(ctx, "Ingress", key(ing), v1alpha1.AnnotationGroup, group, "Bound",
				fmt.Sprintf("bound to group %s by IngressClaim %s", group, claim.Name))
			if err != nil {
				return err
			}
			if applied {
				status.BoundIngresses = append(status.BoundIngresses, name)
			}
		case groupRef(cur, ing.Namespace) == group:
			status.BoundIngresses = append(status.BoundIngresses, name)
		default:
			warn("spec.ingresses", model.ReasonAlreadyBound, fmt.Sprintf("Ingress %s is bound to group %s; not moved", name, cur))
		}
	}
	status.Phase = v1alpha1.ClaimBound
	status.Replicas = claimReplicas(claim)
	if g := ix.groups[group]; g != nil {
		for _, a := range g.VIPs {
			status.VIPs = append(status.VIPs, a.String())
		}
		for _, r := range g.Replicas {
			if r.State == model.Ready {
				status.ReadyReplicas++
			}
		}
	}
	var waiting []string
	reason := v1alpha1.ClaimReasonBound
	if status.ReadyReplicas < status.Replicas {
		waiting = append(waiting, fmt.Sprintf("%d/%d replicas ready", status.ReadyReplicas, status.Replicas))
		reason = v1alpha1.ClaimReasonWaitingForReplicas
	}
	if len(status.VIPs) == 0 {
		waiting = append([]string{"waiting for a VIP"}, waiting...)
		reason = v1alpha1.ClaimReasonWaitingForVIP
	}
	status.Message = strings.Join(waiting, "; ")
	return c.writeClaimStatus(ctx, claim, status, reason)
}

// reclaim applies the reclaim policy once every listed Ingress is gone. With no
// garbage collector guaranteed (and none in the test API server), Delete removes what
// the claim created explicitly, then the claim.
func (c *Controller) reclaim(ctx context.Context, claim *v1alpha1.IngressClaim) error {
	policy := claim.Spec.ReclaimPolicy
	if policy == "" {
		policy = v1alpha1.ReclaimRetain
	}
	if policy == v1alpha1.ReclaimRetain {
		if claim.Status.Phase != v1alpha1.ClaimReleased {
			c.recorder.Event(claimRef(claim), corev1.EventTypeNormal, "Released", "every listed Ingress is gone; group retained")
		}
		st := claim.Status
		st.Phase = v1alpha1.ClaimReleased
		st.BoundIngresses = nil
		st.Message = "every listed Ingress is gone; reclaim policy Retain"
		return c.writeClaimStatus(ctx, claim, st, v1alpha1.ClaimReasonReleased)
	}
	del := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{}}
	ds, err := c.cfg.Client.AppsV1().DaemonSets(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	if err == nil && ownedBy(ds, claim) {
		del.Preconditions.UID = &ds.UID
		err = c.cfg.Client.AppsV1().DaemonSets(claim.Namespace).Delete(ctx, claim.Name, del)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		c.countWrite("claim-reclaim", err)
		return fmt.Errorf("delete DaemonSet: %w", err)
	}
	svc, err := c.cfg.Client.CoreV1().Services(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	if err == nil && ownedBy(svc, claim) {
		del.Preconditions.UID = &svc.UID
		err = c.cfg.Client.CoreV1().Services(claim.Namespace).Delete(ctx, claim.Name, del)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		c.countWrite("claim-reclaim", err)
		return fmt.Errorf("delete group Service: %w", err)
	}
	del.Preconditions.UID = &claim.UID
	err = c.cfg.Dynamic.Resource(v1alpha1.IngressClaimResource).Namespace(claim.Namespace).Delete(ctx, claim.Name, del)
	c.countWrite("claim-reclaim", err)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete IngressClaim: %w", err)
	}
	c.log.Info("claim reclaimed", zap.String("group", claim.Namespace+"/"+claim.Name))
	return nil
}

// ParseNodeSelector reads "key=value,key=value" (--claim-node-selector); ""
// is none.
func ParseNodeSelector(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("node selector %q: want key=value, not %q", s, kv)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("node selector label %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("node selector value %q of %s: %s", v, k, strings.Join(errs, "; "))
		}
		out[k] = v
	}
	return out, nil
}

// FormatNodeSelector writes a selector as ParseNodeSelector reads it, sorted.
func FormatNodeSelector(sel map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		parts = append(parts, k+"="+sel[k])
	}
	return strings.Join(parts, ",")
}
