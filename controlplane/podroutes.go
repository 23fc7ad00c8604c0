package controlplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// splitList splits an annotation list on commas and white space (pod route
// annotations are often space-separated, Portico's examples use commas).
func splitList(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
}

// isPodRoute reports whether pod is a live pod route (labelled microservice).
func isPodRoute(pod *corev1.Pod) bool {
	return pod.Labels[v1alpha1.LabelMicroservice] == "true" && pod.DeletionTimestamp == nil &&
		pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// podRouteGroup is the group a pod route asks for: its portico.io/group, else
// defaultGroup.
func podRouteGroup(pod *corev1.Pod, defaultGroup string) string {
	if g, ok := pod.Annotations[v1alpha1.AnnotationGroup]; ok {
		return groupRef(g, pod.Namespace)
	}
	return defaultGroup
}

// routedPods are the live pod routes whose group exists, oldest first.
func (b *builder) routedPods(defaultGroup string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, pod := range b.st.Pods {
		if g := podRouteGroup(pod, defaultGroup); isPodRoute(pod) && g != "" && b.groupsOut[g] != nil {
			out = append(out, pod)
		}
	}
	slices.SortFunc(out, func(x, y *corev1.Pod) int { return older(x, y) })
	return out
}

func (b *builder) podRoutes(defaultGroup string) {
	pods := slices.Clone(b.st.Pods)
	slices.SortFunc(pods, func(x, y *corev1.Pod) int { return older(x, y) })
	for _, pod := range pods {
		if !isPodRoute(pod) {
			continue
		}
		hostsV, okH := pod.Annotations[v1alpha1.AnnotationTrafficHosts]
		pathsV, okP := pod.Annotations[v1alpha1.AnnotationPublicPaths]
		if !okH || !okP {
			missing := v1alpha1.AnnotationTrafficHosts
			if okH {
				missing = v1alpha1.AnnotationPublicPaths
			}
			b.problem("Pod", pod, "metadata.annotations["+missing+"]", model.ReasonInvalidAnnotation, "a microservice pod needs %s and %s", v1alpha1.AnnotationTrafficHosts, v1alpha1.AnnotationPublicPaths)
			continue
		}
		group := podRouteGroup(pod, defaultGroup)
		if group == "" || b.groupsOut[group] == nil {
			b.problem("Pod", pod, "metadata.annotations["+v1alpha1.AnnotationGroup+"]", model.ReasonGroupNotFound, "pod route has no group (group %q)", group)
			continue
		}
		hosts := splitList(hostsV)
		if len(hosts) == 0 {
			b.problem("Pod", pod, "metadata.annotations["+v1alpha1.AnnotationTrafficHosts+"]", model.ReasonInvalidAnnotation, "no host in %q", hostsV)
			continue
		}
		type pp struct {
			port uint16
			path string
		}
		var paths []pp
		bad := false
		for _, e := range splitList(pathsV) {
			ps, path, ok := strings.Cut(e, ":")
			port, err := strconv.ParseUint(ps, 10, 16)
			if !ok || err != nil || port == 0 || !strings.HasPrefix(path, "/") {
				b.problem("Pod", pod, "metadata.annotations["+v1alpha1.AnnotationPublicPaths+"]", model.ReasonInvalidAnnotation, "entry %q is not PORT:PATH", e)
				bad = true
				continue
			}
			paths = append(paths, pp{uint16(port), path})
		}
		if len(paths) == 0 && !bad {
			b.problem("Pod", pod, "metadata.annotations["+v1alpha1.AnnotationPublicPaths+"]", model.ReasonInvalidAnnotation, "no path in %q", pathsV)
		}
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil {
			continue // not running yet: nothing to route to
		}
		ip = ip.Unmap()
		src := key(pod)
		for _, h := range hosts {
			h = strings.ToLower(h)
			if ok, o := b.mayRoute(h, pod.Namespace); !ok {
				b.problem("Pod", pod, "metadata.annotations["+v1alpha1.AnnotationTrafficHosts+"]", model.ReasonHostTaken,
					"host %q belongs to namespace %s (%s claimed it first); not routed", h, o.namespace, o.by)
				continue
			}
			for _, p := range paths {
				id := fmt.Sprintf("pod|%s|%s|%s|%d", pod.Namespace, h, p.path, p.port)
				base := fmt.Sprintf("%s-pod-%s-%d", pod.Namespace, shortHash(h+"|"+p.path), p.port)
				up := b.upstream(base, id, []netip.AddrPort{netip.AddrPortFrom(ip, p.port)})
				s := b.server(group, h)
				lk := locKey{p.path, model.PathPrefix}
				if owner, taken := s.locs[lk]; taken {
					// Replicas of one pod route share the location and its upstream.
					if owner == "pods:"+up {
						continue
					}
					b.problem("Pod", pod, "metadata.annotations["+v1alpha1.AnnotationPublicPaths+"]", model.ReasonPathConflict,
						"path %q of host %q is already routed by %s", p.path, h, strings.TrimPrefix(owner, "pods:"))
					continue
				}
				s.locs[lk] = "pods:" + up
				s.locations = append(s.locations, model.Location{Path: p.path, Type: model.PathPrefix, Upstream: up, Source: src})
			}
		}
	}
}
