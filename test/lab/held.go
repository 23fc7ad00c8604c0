package lab

import (
	"sync"
	"time"

	"github.com/portico-edge/portico/test/traffic"
)

// The labs' checks of held connections (traffic.KeepConns to echo.lab).

// CheckKeepConns sends a request on every held connection: how many answered, of
// how many, and the failures.
func CheckKeepConns(held traffic.KeepConns, path string) (kept, total int, failed []string) {
	for _, k := range held {
		total++
		if _, err := k.Do("echo.lab", path, 3*time.Second); err == nil {
			kept++
		} else {
			failed = append(failed, k.Edge+": "+err.Error())
		}
	}
	return kept, total, failed
}

// OnSurvivors is the held connections whose replica is not n.
func OnSurvivors(held traffic.KeepConns, n *Node) traffic.KeepConns {
	var out traffic.KeepConns
	for _, k := range held {
		if k.Edge != n.Addr.Addr().String() {
			out = append(out, k)
		}
	}
	return out
}

// AnswerWithin asks every held connection at once for path, each within
// timeout, and returns how many answered and how the others failed.
func AnswerWithin(held traffic.KeepConns, path string, timeout time.Duration) (kept int, failed []string) {
	kept, failed, _ = AnswerEach(held, path, timeout)
	return kept, failed
}

// AnswerEach is AnswerWithin, with the connections that failed.
func AnswerEach(held traffic.KeepConns, path string, timeout time.Duration) (kept int, failed []string, broke traffic.KeepConns) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, k := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := k.Do("echo.lab", path, timeout)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				kept++
			} else {
				failed = append(failed, k.Edge+": "+err.Error())
				broke = append(broke, k)
			}
		}()
	}
	wg.Wait()
	return kept, failed, broke
}
