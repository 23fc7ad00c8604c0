package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// NewSite is a lab to be built as one site of several (test/lab/sites): its
// nodes are on 10.subnet.0.0/24 and named with the prefix name, its agents
// announce by BGP with bgp's options, and it has no network yet (the caller
// sets Net, shared by the sites, and SitesFile, then calls BuildSite). Close
// removes what it made.
func NewSite(portico string, subnet byte, name string, bgp *BGPOptions) (*Lab, error) {
	dir, err := os.MkdirTemp("", "portico-lab-"+name+"-")
	if err != nil {
		return nil, err
	}
	l := &Lab{Portico: portico, Dir: dir, agents: map[int]*Agent{}, bgp: bgp, subnet: subnet, name: name}
	l.OnClose(func() error { return os.RemoveAll(dir) })
	return l, nil
}

// SiteName is the name of a site of several ("" for a lab of its own).
func (l *Lab) SiteName() string { return l.name }

// Subnet is the second octet of the lab's 10.x.0.0/24.
func (l *Lab) Subnet() byte { return l.subnet }

// OnClose adds f to what Close runs (last added, first run).
func (l *Lab) OnClose(f func() error) { l.closers = append(l.closers, f) }

// Main is the labs' TestMain: as root, it builds the portico binary into a
// temporary directory, sets *bin to it, runs the tests and removes it; without
// root it runs them as they are (every test skips). It returns the exit code.
func Main(m *testing.M, bin *string) int {
	if os.Geteuid() != 0 {
		return m.Run() // every test skips
	}
	dir, err := os.MkdirTemp("", "portico-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	*bin = filepath.Join(dir, "portico")
	out, err := exec.Command("go", "build", "-o", *bin, "github.com/portico-edge/portico/cmd/portico").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build portico: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
