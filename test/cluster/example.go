package cluster

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/portico-edge/portico/test/testcert"
)

// The example workload the tests and make demo run behind Portico.

// The example: the echo image as "web" (three replicas) and "api" (one), their
// Services, and Ingresses for web.example (/ and /api) and for two TLS hosts with
// certificates of their own, secure.example (web) and other.example (api).

// BackendYAML is a Deployment of the echo image and its Service, in namespace
// default: fmt.Sprintf(BackendYAML, name, replicas, comma-separated names of the
// nodes its pods may run on). They tolerate the edge taint and spread over the nodes.
const BackendYAML = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: default}
spec:
  replicas: %[2]d
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 30
      tolerations: [{key: portico.io/edge, operator: Exists, effect: NoSchedule}]
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [%[3]s]}]
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: %[1]s}}}
      containers:
      - name: echo
        image: docker.io/portico/echo:lab
        imagePullPolicy: Never
        env:
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
        # Kubernetes' usual graceful stop: keep serving until every proxy has seen the
        # endpoint go (ingress-nginx's docs suggest 5-15 s; a loaded machine needs it).
        lifecycle: {preStop: {sleep: {seconds: 10}}}
---
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  selector: {app: %[1]s}
  ports: [{port: 80, targetPort: 8080}]
`

const ingressYAML = `
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: default}
spec:
  ingressClassName: portico
  rules:
  - host: web.example
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
      - {path: /api, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: secure, namespace: default}
spec:
  ingressClassName: portico
  tls:
  - {hosts: [secure.example], secretName: secure-tls}
  - {hosts: [other.example], secretName: other-tls}
  rules:
  - host: secure.example
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
  - host: other.example
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}]}
`

const secretYAML = `
apiVersion: v1
kind: Secret
metadata: {name: %s, namespace: default}
type: kubernetes.io/tls
data: {tls.crt: %s, tls.key: %s}
`

// DeployExample applies the example backends and Ingresses, with web's pods on
// nodes (api's on the last of them), waits for their rollout, and returns the
// certificate of each TLS host (self-signed: a client trusts it alone).
// PlaceBackend (re)deploys the backend Deployment name with replicas pods on
// nodes, and waits until its rollout is done.
func (c *Cluster) PlaceBackend(ctx context.Context, name string, replicas int, nodes []*Node) error {
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	if err := c.Apply(ctx, fmt.Sprintf(BackendYAML, name, replicas, strings.Join(names, ", "))); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, nil, "rollout", "status", "deployment/"+name, "--timeout=2m")
	return err
}

func (c *Cluster) DeployExample(ctx context.Context, nodes []*Node) (map[string][]byte, error) {
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	yaml := fmt.Sprintf(BackendYAML, "web", 3, strings.Join(names, ", ")) + "---" + fmt.Sprintf(BackendYAML, "api", 1, nodes[len(nodes)-1].Name)
	certs := map[string][]byte{}
	for _, host := range []string{"secure.example", "other.example"} {
		cert, key, err := testcert.ECDSA(host)
		if err != nil {
			return nil, err
		}
		certs[host] = cert
		yaml += "---" + fmt.Sprintf(secretYAML, strings.TrimSuffix(host, ".example")+"-tls",
			base64.StdEncoding.EncodeToString(cert), base64.StdEncoding.EncodeToString(key))
	}
	if err := c.Apply(ctx, yaml+"---"+ingressYAML); err != nil {
		return nil, err
	}
	if _, err := c.Kubectl(ctx, nil, "rollout", "status", "deployment/web", "deployment/api", "--timeout=2m"); err != nil {
		return nil, err
	}
	return certs, nil
}
