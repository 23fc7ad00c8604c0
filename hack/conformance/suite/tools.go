//go:build tools

// Package suite only pins the conformance suite's module (go.mod); make
// conformance compiles the suite's own test from it.
package suite

import _ "sigs.k8s.io/gateway-api/conformance"
