// Package docs is Portico's documentation beside the code: the pages an operator
// reads after the README (architecture, L4, BGP, federation, security, operations,
// troubleshooting, upgrade, uninstall, comparison). It holds no code; its test
// checks that every command, Helm value, Kubernetes object and link that the
// README and these pages show is one the code, the Makefile and the chart have.
package docs
