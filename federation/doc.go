// Package federation sits above the clusters: a host cluster's FederatedIngress is
// rendered, per member cluster, into an ordinary Ingress that the member's own Portico
// serves, and what the members report comes back as the FederatedIngress's status
// (seed 001, issue 13). The FederatedIngress type, its CRD and the names on member
// Secrets are api/v1alpha1's; this package is its controller.
//
// The host only propagates and aggregates (fail-static): every member keeps serving the
// Ingresses it was given when the host cluster, its controller or the link to it is
// lost, and nothing here deletes a member's Ingress except a change of the
// FederatedIngress itself (a cluster leaving its placement, or its deletion).
//
// Member clusters are Secrets in the controller's namespace labelled
// portico.io/member-cluster (its value, or the Secret's name, names the cluster) whose key
// "kubeconfig" reaches the member's API server, with its credentials inline: an
// exec plugin, an auth provider or a file reference is refused (whoever may write
// Secrets there would run commands in the controller, or read its files). A per-cluster override is an RFC 7386
// JSON merge patch applied to the rendered Ingress, as Karmada's overriders and
// kustomize patches do. Propagation is server-side apply with the field manager
// portico-federation, so fields other managers own on a member's Ingress (its status,
// labels added there) are left alone, and a member edited by hand is put back.
//
// Status reports, per placed site, the propagated generation, the member's
// addresses, its ready backends, its edges (from their status Leases) and what
// they do with the group's VIPs (announced, de-preferenced, withdrawn,
// draining), with Propagated and Ready conditions over all sites. The sites
// themselves act on their own (the agents: anycast announcements, drains,
// hand-over between sites, overflow); this controller writes each member the
// peers it needs for that (the portico-federation-peers ConfigMap), and
// federation/gslb is the DNS variant.
package federation
