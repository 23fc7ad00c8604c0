// Command portico is the edge agent and the operator's view of it: `portico agent`
// wires the control plane, data plane, VRRP and nginx on one edge node, and the other
// subcommands read or exercise those parts on their own.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// command is one `portico` subcommand. run gets the arguments after its name.
type command struct {
	summary string
	run     func(args []string) error
}

// commands lists every subcommand; each lives in its own file.
var commands = map[string]command{}

func register(name, summary string, run func(args []string) error) {
	commands[name] = command{summary: summary, run: run}
}

// name is what the user typed to run this: "portico", or "kubectl portico" when
// kubectl runs the binary as its plugin (installed as kubectl-portico on the
// PATH), which is how an operator reads the cluster (status) from any machine.
func name() string {
	if filepath.Base(os.Args[0]) == "kubectl-portico" {
		return "kubectl portico"
	}
	return "portico"
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s <command> [flags]\n\ncommands:\n", name())
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
}

func main() {
	registerAll()
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown command %q\n", name(), os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := c.run(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", name(), os.Args[1], err)
		os.Exit(1)
	}
}
