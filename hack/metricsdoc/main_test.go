package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDocCurrent: docs/metrics.md is what the code registers now (make
// metrics-doc writes it).
func TestDocCurrent(t *testing.T) {
	all := map[string]*series{}
	for _, s := range sources {
		if err := s.register(&recorder{where: s.where, out: all}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, render(all)) {
		t.Error("docs/metrics.md is stale: run make metrics-doc and commit")
	}
}

// TestRecorder: the recorder reads name, help, labels and type from what a
// collector describes, and refuses one name defined twice differently.
func TestRecorder(t *testing.T) {
	all := map[string]*series{}
	r := &recorder{where: "test", out: all}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x_gauge", Help: `a "quoted", help`}, []string{"a", "b"})
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x_total", Help: "h"})
	if err := r.Register(g); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(c); err != nil {
		t.Fatal(err)
	}
	s := all["x_gauge"]
	if s == nil || s.typ != "gauge" || s.help != `a "quoted", help` || len(s.labels) != 2 || s.labels[1] != "b" {
		t.Errorf("x_gauge recorded as %+v", s)
	}
	if s := all["x_total"]; s == nil || s.typ != "counter" || len(s.labels) != 0 {
		t.Errorf("x_total recorded as %+v", s)
	}
	other := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x_total", Help: "h"})
	if err := r.Register(other); err == nil {
		t.Error("x_total registered again as a gauge: want an error")
	}
}
