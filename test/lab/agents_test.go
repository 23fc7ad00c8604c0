package lab

import (
	"strings"
	"testing"
)

func TestOwnFrames(t *testing.T) {
	log := `{"level":"info","msg":"releasing VIPs"}
SIGQUIT: quit
PC=0x47d5e1 m=0 sigcode=0

goroutine 1 gp=0xc000002380 m=nil [semacquire, 1 minutes]:
sync.runtime_Semacquire(0xc0001a2f48?)
	/usr/lib/go/src/runtime/sema.go:71 +0x25
sync.(*WaitGroup).Wait(0xc0001a2f40)
	/usr/lib/go/src/sync/waitgroup.go:118 +0x48
github.com/portico-edge/portico/agent.(*agent).run(0xc000190000, {0x1e6c2d0, 0xc0001a0000}, {0x1e6b7a0, 0xc0001a8000})
	/work/main/agent/agent.go:168 +0x3b6
github.com/portico-edge/portico/agent.run({0x1e6c2d0, 0xc0001a0000}, {{0xc00003a0c0, 0x4}})
	/work/main/agent/agent.go:101 +0x2c5

goroutine 7 gp=0xc000003dc0 m=nil [select]:
net/http.(*persistConn).writeLoop(0xc0002a2000)
	/usr/lib/go/src/net/http/transport.go:2590 +0xe7
`
	got := ownFrames(log)
	want := "goroutine 1 gp=0xc000002380 m=nil [semacquire, 1 minutes]: agent.(*agent).run() < agent.run()\n"
	if got != want {
		t.Errorf("ownFrames:\n got %q\nwant %q", got, want)
	}
	if got := ownFrames("no dump"); !strings.Contains(got, "no goroutine dump") {
		t.Errorf("ownFrames without a dump = %q", got)
	}
}
