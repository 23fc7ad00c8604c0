package controlplane

// Kubernetes' own names Portico reads (Portico's are api/v1alpha1's).
const (
	annotationIngressClass = "kubernetes.io/ingress.class"
	annotationDefaultClass = "ingressclass.kubernetes.io/is-default-class"
)
