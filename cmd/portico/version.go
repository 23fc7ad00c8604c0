package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/portico-edge/portico/internal/version"
)

// runVersion prints which Portico this binary is (internal/version).
func runVersion(args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print version, revision, modified and go as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	in := version.Get()
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(in)
	}
	fmt.Println(in)
	return nil
}
