package deploy

import (
	_ "embed"
	"fmt"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// agentManifest is agent.yaml, the agent DaemonSet as `kubectl apply -k deploy`
// installs it: the chart's templates/agent.yaml rendered with the default values
// (make manifests). This embed is the one place the code reads a manifest: the control
// plane derives the DaemonSets it provisions for IngressClaims from it, so the
// installed agents and the provisioned ones share the chart's pod.
//
//go:embed agent.yaml
var agentManifest []byte

var agentDaemonSet = sync.OnceValues(func() (*appsv1.DaemonSet, error) {
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(agentManifest, &ds); err != nil {
		return nil, fmt.Errorf("decode deploy/agent.yaml: %w", err)
	}
	return &ds, nil
})

// AgentDaemonSet returns the DaemonSet of agent.yaml, a copy the caller may change.
func AgentDaemonSet() (*appsv1.DaemonSet, error) {
	ds, err := agentDaemonSet()
	if err != nil {
		return nil, err
	}
	return ds.DeepCopy(), nil
}
