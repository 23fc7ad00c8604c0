package controlplane

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// bigState is the benchmark cluster: n Ingresses, each with 3 paths to the
// 3 ports of its own Service, whose EndpointSlice lists 20 ready endpoints.
func bigState(n int) State {
	st := State{}
	gs, gsl := g1Objects()
	st.Services = append(st.Services, gs...)
	st.EndpointSlices = append(st.EndpointSlices, gsl...)
	for i := range n {
		ns := fmt.Sprintf("team-%d", i%50)
		name := fmt.Sprintf("app-%d", i)
		st.Services = append(st.Services, backendSvc(ns, name, sport("a", 80), sport("b", 81), sport("c", 82)))
		es := &discoveryv1.EndpointSlice{ObjectMeta: meta(ns, name+"-1", 0)}
		es.Labels = map[string]string{discoveryv1.LabelServiceName: name}
		es.AddressType = discoveryv1.AddressTypeIPv4
		for j, p := range []string{"a", "b", "c"} {
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr(p), Port: ptr(int32(8080 + j)), Protocol: ptr(corev1.ProtocolTCP)})
		}
		for k := range 20 {
			a := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(k + 1)})
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
		}
		st.EndpointSlices = append(st.EndpointSlices, es)
		st.Ingresses = append(st.Ingresses, ingress(ns, name, i, name+".example.com", []path{
			{"/", networkingv1.PathTypePrefix, name, "a"},
			{"/api", networkingv1.PathTypePrefix, name, "b"},
			{"/health", networkingv1.PathTypeExact, name, 82},
		}, v1alpha1.AnnotationGroup, "edge/g1"))
	}
	return st
}

// BenchmarkBuild5000 measures one Build of 5,000 Ingresses × 3 paths × 20 endpoints
// (target < 500 ms) and the heap the resulting snapshot keeps alive.
func BenchmarkBuild5000(b *testing.B) {
	st := bigState(5000)
	var snap model.Snapshot
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		snap, _, _ = Build(st, Options{})
	}
	b.StopTimer()
	if len(snap.Servers) != 5000 || len(snap.Upstreams) != 15000 || len(snap.Upstreams[0].Endpoints) != 20 {
		b.Fatalf("unexpected snapshot: %d servers, %d upstreams", len(snap.Servers), len(snap.Upstreams))
	}
	// Heap held by one snapshot: live heap with it minus live heap without it.
	var with, without runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&with)
	runtime.KeepAlive(snap)
	snap = model.Snapshot{}
	runtime.GC()
	runtime.ReadMemStats(&without)
	b.ReportMetric(float64(with.HeapAlloc-without.HeapAlloc)/(1<<20), "snapshot-MiB")
}

// BenchmarkValidate5000 is the check every sync makes of Build's snapshot before it
// publishes it (Snapshot.Validate), on BenchmarkBuild5000's snapshot.
func BenchmarkValidate5000(b *testing.B) {
	snap, _, _ := Build(bigState(5000), Options{})
	b.ReportAllocs()
	for b.Loop() {
		if err := snap.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEndpointSliceToSink measures, against the real API server, the time from
// an EndpointSlice update (the Update call) to the snapshot with the change arriving
// at a sink: median and p99 over 100 updates per iteration (target p99 < 100 ms).
// Run with -benchtime 1x.
func BenchmarkEndpointSliceToSink(b *testing.B) {
	e := newEnv(b)
	e.svc(groupSvc("", "g1", 0, v1alpha1.AnnotationVIP, "192.0.2.10", v1alpha1.AnnotationVRID, "1"))
	e.svc(backendSvc("", "web", sport("http", 80)))
	es := e.slice(slice("", "web", "web-1", "http", 8080, ep{addr: "10.2.0.1", ready: true}))
	ing := ingress(e.ns, "site", 0, "example.com", []path{{"/", networkingv1.PathTypePrefix, "web", 80}}, v1alpha1.AnnotationGroup, "g1")
	ing.CreationTimestamp = metav1.Time{}
	e.must(e.cs.NetworkingV1().Ingresses(e.ns).Create(e.ctx, ing, metav1.CreateOptions{}))

	arrived := make(chan int, 1000) // endpoint count of the web upstream per snapshot
	sink := &funcSink{f: func(s model.Snapshot) {
		for _, u := range s.Upstreams {
			if u.Name == e.ns+"-web-80" {
				arrived <- len(u.Endpoints)
			}
		}
	}}
	e.start(func(c *Config) { c.Sinks = []Sink{sink} })
	wait := func(n int) error {
		timeout := time.After(10 * time.Second)
		for {
			select {
			case got := <-arrived:
				if got == n {
					return nil
				}
			case <-timeout:
				return fmt.Errorf("no snapshot with %d endpoints", n)
			}
		}
	}
	if err := wait(1); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ResetTimer()
	for b.Loop() {
		for i := range 100 {
			// Alternate between 2 and 1 endpoints so every update changes the snapshot.
			want := 2 - i%2
			es.Endpoints = es.Endpoints[:1]
			if want == 2 {
				es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.2.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
			}
			start := time.Now()
			var err error
			es, err = e.cs.DiscoveryV1().EndpointSlices(e.ns).Update(context.Background(), es, metav1.UpdateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if err := wait(want); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}

type funcSink struct{ f func(model.Snapshot) }

func (s *funcSink) Name() string { return "func" }

func (s *funcSink) Apply(_ context.Context, snap model.Snapshot) error {
	s.f(snap)
	return nil
}

// BenchmarkBuildOneChange5000 measures a Build of bigState(5000) after one
// EndpointSlice changed, with the Memo of the Build before it (what the
// controller does on each change), against BenchmarkBuild5000's Build from
// nothing.
func BenchmarkBuildOneChange5000(b *testing.B) {
	st := bigState(5000)
	var m Memo
	BuildWith(&m, st, Options{})
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		// Replace one EndpointSlice, as an informer does on a change.
		j := 1 + i%5000 // past the group's slice
		es := st.EndpointSlices[j].DeepCopy()
		es.Endpoints = es.Endpoints[1:]
		st.EndpointSlices[j] = es
		BuildWith(&m, st, Options{})
		i++
	}
}
