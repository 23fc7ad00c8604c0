package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxRecordedLines bounds what a LogRecorder keeps (the agents log a few lines a
// second; a test's event lasts minutes).
const maxRecordedLines = 200_000

// LogRecorder follows the agent container's log of every pod of a DaemonSet,
// pods deleted meanwhile included: a rollout's old agents are gone by the time a
// failure is reported, and what they said until they exited is half the story.
type LogRecorder struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	lines  []recordedLine
	lost   int
}

type recordedLine struct {
	ts   float64 // the line's own "ts" (zap's epoch seconds), 0 if it has none
	text string
}

// RecordAgentLogs starts a LogRecorder for the DaemonSet name's pods; Stop ends it.
func (p *Portico) RecordAgentLogs(ctx context.Context, name string) *LogRecorder {
	ctx, cancel := context.WithCancel(ctx)
	r := &LogRecorder{cancel: cancel}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		following := map[string]bool{}
		for {
			pods, err := p.C.Kube.CoreV1().Pods(PorticoNamespace).List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, pod := range pods.Items {
					if following[pod.Name] || pod.Status.Phase != corev1.PodRunning || !ownedBy(&pod, name) {
						continue
					}
					following[pod.Name] = true
					r.wg.Add(1)
					go func() {
						defer r.wg.Done()
						r.follow(ctx, p, pod.Name, pod.Spec.NodeName)
					}()
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return r
}

func ownedBy(pod *corev1.Pod, daemonSet string) bool {
	return slices.ContainsFunc(pod.OwnerReferences, func(ref metav1.OwnerReference) bool {
		return ref.Kind == "DaemonSet" && ref.Name == daemonSet
	})
}

// follow copies one pod's agent log until the container exits or ctx ends.
func (r *LogRecorder) follow(ctx context.Context, p *Portico, pod, node string) {
	s, err := p.C.Kube.CoreV1().Pods(PorticoNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: "agent", Follow: true}).Stream(ctx)
	if err != nil {
		r.add(recordedLine{text: fmt.Sprintf("%s (%s): follow its log: %v", pod, node, err)})
		return
	}
	defer s.Close()
	sc := bufio.NewScanner(s)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var l struct {
			TS float64 `json:"ts"`
		}
		_ = json.Unmarshal(sc.Bytes(), &l) // a line that is not zap's JSON sorts first
		r.add(recordedLine{ts: l.TS, text: fmt.Sprintf("%s (%s): %s", pod, node, sc.Text())})
	}
}

func (r *LogRecorder) add(l recordedLine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lines) >= maxRecordedLines {
		r.lost++
		return
	}
	r.lines = append(r.lines, l)
}

// Stop ends every follower and waits for them.
func (r *LogRecorder) Stop() {
	r.cancel()
	r.wg.Wait()
}

// Lines returns the recorded lines that contain one of words, of every pod in
// the order of their timestamps.
func (r *LogRecorder) Lines(words ...string) string {
	return r.LinesBetween(time.Time{}, time.Time{}, words...)
}

// LinesBetween is Lines of the lines stamped from from to to (either zero:
// unbounded on that side).
func (r *LogRecorder) LinesBetween(from, to time.Time, words ...string) string {
	lo, hi := 0.0, 0.0
	if !from.IsZero() {
		lo = float64(from.UnixNano()) / 1e9
	}
	if !to.IsZero() {
		hi = float64(to.UnixNano()) / 1e9
	}
	r.mu.Lock()
	lines := slices.Clone(r.lines)
	lost := r.lost
	r.mu.Unlock()
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].ts < lines[j].ts })
	var b strings.Builder
	for _, l := range lines {
		if (lo > 0 && l.ts < lo) || (hi > 0 && l.ts > hi) {
			continue
		}
		if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(l.text, w) }) {
			b.WriteString(l.text + "\n")
		}
	}
	if lost > 0 {
		fmt.Fprintf(&b, "(%d later lines not recorded)\n", lost)
	}
	return b.String()
}
