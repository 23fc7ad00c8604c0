package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoTestingInBinary: the binary links no test code. A package it imports
// that imports testing (a test helper outside a _test.go file) fails here.
func TestNoTestingInBinary(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the binary's packages")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	if slices.Contains(strings.Fields(string(out)), "testing") {
		t.Error("the portico binary links package testing: go list -deps ./cmd/portico shows what imports it")
	}
}
