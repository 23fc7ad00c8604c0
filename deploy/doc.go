// Package deploy holds the Kubernetes manifests that install Portico (the last step of
// its flow: what a user applies to a cluster). Its only code hands the agent DaemonSet
// of agent.yaml to the control plane, which derives the DaemonSets of IngressClaims
// from it. Its tests apply every manifest to a real kube-apiserver and run the
// control plane as the agent's ServiceAccount to check the RBAC against what the code
// calls.
package deploy
