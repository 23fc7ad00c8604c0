package main

// registerAll registers every subcommand. Each subcommand's file adds one line here.
func registerAll() {
}
