package main

// registerAll registers every subcommand. Each subcommand's file adds one line here.
func registerAll() {
	register("vrrp", "run the VRRP announcer alone (VIP failover, keepalived-compatible)", runVRRP)
}
