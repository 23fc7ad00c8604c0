// Package deploy holds what installs Portico (the last step of its flow: what a user
// applies to a cluster): the Helm chart helm/portico, and the plain manifests
// generated from it (make manifests, command deploy/manifests). Its only code hands the
// agent DaemonSet of agent.yaml to the control plane, which derives the DaemonSets of
// IngressClaims from it. Its tests lint the chart, check the manifests are its
// rendering, dry-run it and apply every manifest on a real kube-apiserver, and run the
// control plane as the agent's ServiceAccount to check the RBAC against what the code
// calls.
package deploy
