package controlplane

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/internal/shutdown"
)

// watchCluster adds the informers of what every build reads: IngressClasses,
// Ingresses, Services, EndpointSlices, Nodes, TLS Secrets and microservice pods.
func (c *Controller) watchCluster() error {
	cfg := c.cfg
	nsOpt := informers.WithNamespace(cfg.Namespace)
	main := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod, nsOpt)
	// Only TLS Secrets, only microservice pods: the rest is never read.
	tlsSecrets := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod, nsOpt,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "type=" + string(corev1.SecretTypeTLS) }))
	podRoutes := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod, nsOpt,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelMicroservice + "=true" }))
	c.factories = []informers.SharedInformerFactory{main, tlsSecrets, podRoutes}

	for _, inf := range []struct {
		i   cache.SharedIndexInformer
		dst *cache.Indexer
	}{
		{main.Networking().V1().IngressClasses().Informer(), &c.classes},
		{main.Networking().V1().Ingresses().Informer(), &c.ingresses},
		{main.Core().V1().Services().Informer(), &c.services},
		{main.Discovery().V1().EndpointSlices().Informer(), &c.slices},
		{main.Core().V1().Nodes().Informer(), &c.nodes},
		{tlsSecrets.Core().V1().Secrets().Informer(), &c.secrets},
		{podRoutes.Core().V1().Pods().Informer(), &c.pods},
	} {
		if err := c.watch(inf.i); err != nil {
			return err
		}
		*inf.dst = inf.i.GetIndexer()
	}
	return nil
}

// watchClaims adds the IngressClaim informer when the CRD is served (an informer on a
// missing resource would never sync). A CRD installed later needs a restart.
func (c *Controller) watchClaims() error {
	if ok, err := c.served(v1alpha1.IngressClaimResource, "IngressClaim CRD not installed: claims are not served"); !ok {
		return err
	}
	c.dynFactory = dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.cfg.Dynamic, c.cfg.ResyncPeriod, c.cfg.Namespace, nil)
	c.claimInformer = c.dynFactory.ForResource(v1alpha1.IngressClaimResource).Informer()
	return c.watch(c.claimInformer)
}

// watchPools adds the VIPPool informer, and the Namespace informer the pools'
// selectors read, when the CRD is served. Without it, the --vip-pool flags are
// the only pools. A CRD installed later needs a restart.
func (c *Controller) watchPools() error {
	if ok, err := c.served(v1alpha1.VIPPoolResource, "VIPPool CRD not installed: the --vip-pool flags are the only VIP pools"); !ok {
		return err
	}
	c.poolFactory = dynamicinformer.NewDynamicSharedInformerFactory(c.cfg.Dynamic, c.cfg.ResyncPeriod)
	pools := c.poolFactory.ForResource(v1alpha1.VIPPoolResource).Informer()
	if err := c.watch(pools); err != nil {
		return err
	}
	c.vipPools = pools.GetIndexer()
	return c.watchNamespaces()
}

// Gateway API's resources (v1).
var (
	gatewayClassesResource  = gatewayv1.SchemeGroupVersion.WithResource("gatewayclasses")
	gatewaysResource        = gatewayv1.SchemeGroupVersion.WithResource("gateways")
	httpRoutesResource      = gatewayv1.SchemeGroupVersion.WithResource("httproutes")
	referenceGrantsResource = gatewayv1.SchemeGroupVersion.WithResource("referencegrants")
)

// watchGateways adds the Gateway API informers when its CRDs are served
// (GatewayClasses, Gateways, HTTPRoutes and ReferenceGrants), and the
// Namespace informer listeners' selectors read. Objects are kept typed: each
// is converted once, when it changes, not at every build. CRDs installed later
// need a restart.
func (c *Controller) watchGateways() error {
	for _, r := range []schema.GroupVersionResource{gatewayClassesResource, gatewaysResource, httpRoutesResource, referenceGrantsResource} {
		if ok, err := c.served(r, "Gateway API CRDs not installed (v1): Gateways are not served"); !ok {
			return err
		}
	}
	cluster := dynamicinformer.NewDynamicSharedInformerFactory(c.cfg.Dynamic, c.cfg.ResyncPeriod)
	namespaced := dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.cfg.Dynamic, c.cfg.ResyncPeriod, c.cfg.Namespace, nil)
	c.gwFactories = []dynamicinformer.DynamicSharedInformerFactory{cluster, namespaced}
	for _, inf := range []struct {
		i   cache.SharedIndexInformer
		new func() runtime.Object
		dst *cache.Indexer
	}{
		{cluster.ForResource(gatewayClassesResource).Informer(), func() runtime.Object { return &gatewayv1.GatewayClass{} }, &c.gwClasses},
		{namespaced.ForResource(gatewaysResource).Informer(), func() runtime.Object { return &gatewayv1.Gateway{} }, &c.gateways},
		{namespaced.ForResource(httpRoutesResource).Informer(), func() runtime.Object { return &gatewayv1.HTTPRoute{} }, &c.httpRoutes},
		{namespaced.ForResource(referenceGrantsResource).Informer(), func() runtime.Object { return &gatewayv1.ReferenceGrant{} }, &c.refGrants},
	} {
		if err := inf.i.SetTransform(c.typed(inf.new)); err != nil {
			return fmt.Errorf("set transform: %w", err)
		}
		if err := c.watch(inf.i); err != nil {
			return err
		}
		*inf.dst = inf.i.GetIndexer()
	}
	return c.watchNamespaces()
}

// typed converts an informer's unstructured objects to the type newT
// makes; one that does not convert (the CRD's schema should not let it in) is
// logged and kept as it is, which no build reads.
func (c *Controller) typed(newT func() runtime.Object) cache.TransformFunc {
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		t := newT()
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, t); err != nil {
			c.log.Warn("object does not decode; not used", zap.String("kind", u.GetKind()), zap.String("namespace", u.GetNamespace()),
				zap.String("name", u.GetName()), zap.Error(err))
			return obj, nil
		}
		return t, nil
	}
}

// watchNamespaces adds the Namespace informer (once): the VIP pools' and
// listeners' selectors read namespaces' labels.
func (c *Controller) watchNamespaces() error {
	if c.namespaces != nil {
		return nil
	}
	f := informers.NewSharedInformerFactory(c.cfg.Client, c.cfg.ResyncPeriod)
	c.factories = append(c.factories, f)
	ns := f.Core().V1().Namespaces().Informer()
	if err := c.watch(ns); err != nil {
		return err
	}
	c.namespaces = ns.GetIndexer()
	return nil
}

// served reports whether the API server serves resource r (an informer on a
// missing resource would never sync), logging missing when it does not.
func (c *Controller) served(r schema.GroupVersionResource, missing string) (bool, error) {
	if c.cfg.Dynamic == nil {
		return false, nil
	}
	gv := r.GroupVersion().String()
	list, err := c.cfg.Client.Discovery().ServerResourcesForGroupVersion(gv)
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("discover %s: %w", gv, err)
	}
	if list != nil {
		for _, res := range list.APIResources {
			if res.Name == r.Resource {
				return true, nil
			}
		}
	}
	c.log.Warn(missing, zap.String("resource", r.String()))
	return false, nil
}

// watch has every change i sees queue a build (a status-only update, a look by
// the leader's writer), and makes Run wait for i to sync.
func (c *Controller) watch(i cache.SharedIndexInformer) error {
	enqueue := func(any) { c.queue.Add(syncKey) }
	if _, err := i.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			if statusOnly(old, cur) {
				c.wantWrite()
				return
			}
			c.queue.Add(syncKey)
		},
		DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("add event handler: %w", err)
	}
	c.synced = append(c.synced, i.HasSynced)
	return nil
}

// startInformers starts every informer factory; stop shuts them down.
func (c *Controller) startInformers(ctx context.Context) (stop func()) {
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	for _, f := range c.dynFactories() {
		f.Start(ctx.Done())
	}
	return func() {
		var fs []shutdown.Factory
		for _, f := range c.factories {
			fs = append(fs, f)
		}
		for _, f := range c.dynFactories() {
			fs = append(fs, f)
		}
		shutdown.Informers(c.log, fs...)
	}
}

// dynFactories are the dynamic informer factories in use.
func (c *Controller) dynFactories() []dynamicinformer.DynamicSharedInformerFactory {
	var out []dynamicinformer.DynamicSharedInformerFactory
	for _, f := range append([]dynamicinformer.DynamicSharedInformerFactory{c.dynFactory, c.poolFactory}, c.gwFactories...) {
		if f != nil {
			out = append(out, f)
		}
	}
	return out
}

// statusOnly reports whether an update of an Ingress or a Service changed its
// status alone (Build never reads it): the leader's own address writes, which
// need no new build, only a look by the writer.
func statusOnly(old, cur any) bool {
	switch o := old.(type) {
	case *networkingv1.Ingress:
		n, ok := cur.(*networkingv1.Ingress)
		return ok && sameMeta(&o.ObjectMeta, &n.ObjectMeta) && equality.Semantic.DeepEqual(o.Spec, n.Spec)
	case *corev1.Service:
		n, ok := cur.(*corev1.Service)
		return ok && sameMeta(&o.ObjectMeta, &n.ObjectMeta) && equality.Semantic.DeepEqual(o.Spec, n.Spec)
	case *gatewayv1.GatewayClass, *gatewayv1.Gateway, *gatewayv1.HTTPRoute:
		// Their spec is under the generation (a status subresource).
		om, ok1 := old.(metav1.Object)
		nm, ok2 := cur.(metav1.Object)
		return ok1 && ok2 && om.GetGeneration() == nm.GetGeneration() && maps.Equal(om.GetAnnotations(), nm.GetAnnotations()) &&
			maps.Equal(om.GetLabels(), nm.GetLabels()) && om.GetDeletionTimestamp().IsZero() == nm.GetDeletionTimestamp().IsZero()
	}
	return false
}

// sameMeta compares what Build reads of two versions of one object's metadata.
func sameMeta(o, n *metav1.ObjectMeta) bool {
	return o.Generation == n.Generation && maps.Equal(o.Annotations, n.Annotations) && maps.Equal(o.Labels, n.Labels) &&
		o.DeletionTimestamp.IsZero() == n.DeletionTimestamp.IsZero() && slices.Equal(o.Finalizers, n.Finalizers)
}

func list[T any](i cache.Indexer) []T {
	if i == nil {
		return nil
	}
	objs := i.List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// state lists the caches. The objects are shared with the informers: read only.
func (c *Controller) state() State {
	return State{
		IngressClasses:  list[*networkingv1.IngressClass](c.classes),
		Ingresses:       list[*networkingv1.Ingress](c.ingresses),
		Services:        list[*corev1.Service](c.services),
		EndpointSlices:  list[*discoveryv1.EndpointSlice](c.slices),
		Secrets:         list[*corev1.Secret](c.secrets),
		Pods:            list[*corev1.Pod](c.pods),
		Nodes:           list[*corev1.Node](c.nodes),
		VIPPools:        c.listPools(),
		Namespaces:      list[*corev1.Namespace](c.namespaces),
		GatewayClasses:  list[*gatewayv1.GatewayClass](c.gwClasses),
		Gateways:        list[*gatewayv1.Gateway](c.gateways),
		HTTPRoutes:      list[*gatewayv1.HTTPRoute](c.httpRoutes),
		ReferenceGrants: list[*gatewayv1.ReferenceGrant](c.refGrants),
	}
}

// listPools decodes the cached VIPPools; one that does not decode (the CRD's
// schema should not let it in) is logged and not used.
func (c *Controller) listPools() []*v1alpha1.VIPPool {
	if c.vipPools == nil {
		return nil
	}
	var out []*v1alpha1.VIPPool
	for _, o := range c.vipPools.List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		p := &v1alpha1.VIPPool{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
			c.log.Warn("VIPPool does not decode; not used", zap.String("pool", u.GetName()), zap.Error(err))
			continue
		}
		out = append(out, p)
	}
	return out
}
