// Module echo-basic pins the Gateway API conformance suite's HTTP, TCP and UDP
// backend for hack/conformance.sh. echo-basic is a package of the suite's module
// (its own go.mod ships renamed .go.mod), so it is required through that module.
module portico.test/conformance/echo-basic

go 1.26.0

tool sigs.k8s.io/gateway-api/conformance/echo-basic

require (
	golang.org/x/net v0.55.0 // indirect
	golang.org/x/sys v0.45.0 // indirect
	golang.org/x/text v0.37.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260427160629-7cedc36a6bc4 // indirect
	google.golang.org/grpc v1.81.1 // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
	sigs.k8s.io/gateway-api/conformance v1.6.3 // indirect
)
