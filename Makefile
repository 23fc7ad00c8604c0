# Portico's build. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
# Go test flags for `make test`; CI runs as root, so BPF and namespace tests run too.
TESTFLAGS ?= -count=1 -timeout 30m
# Fuzz budgets are execution counts, not durations: Go 1.26's fuzz coordinator can
# report a spurious "context deadline exceeded" at the end of a timed run
# (go.dev/issue/75804, fixed in Go 1.27). About 10-20 s each on this machine.
FUZZTIME ?= 200000x
# The container image: its version (the tag) and name, the one setting `make image`
# builds and the manifests use (`make -s image-name` prints it). Every time inside
# the image is SOURCE_DATE_EPOCH, by default the last commit's.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
IMAGE_REPO ?= ghcr.io/portico-edge/portico
IMAGE ?= $(IMAGE_REPO):$(VERSION)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 1700000000)

.PHONY: help deps generate build vet test unit fuzz verify lint bench demo demo-cluster demo-quick clean kapi kube cluster bench-failover bench-nginx bench-lab bench-propagation bench-bgp demo-dataplane lab image image-name

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

deps: ## install the Debian packages the build and tests use (idempotent)
	@test/setup/deps.sh

generate: deps ## rebuild the BPF objects and their Go bindings with clang-14 + bpf2go
	$(GO) generate ./dataplane/...

.PHONY: helm
helm: ## build helm from the Go module proxy (cached by version; make manifests and go test ./deploy use it)
	@test/tools/helm.sh >/dev/null

# go test ./deploy lints, renders, dry-runs and installs the chart with it.
unit: helm

# The agent image in the manifests, one setting: make manifests renders IMAGE_REPO and
# IMAGE_TAG into deploy/. The chart's values.yaml has the same defaults, and make verify
# passes only with these (a tag from git describe would change deploy/ on every commit).
IMAGE_TAG ?= latest

.PHONY: manifests
manifests: helm ## render the Helm chart deploy/helm/portico into the plain manifests under deploy/ (IMAGE_REPO, IMAGE_TAG)
	$(GO) run ./deploy/manifests -helm "$$(test/tools/helm.sh path)" -set image.repository=$(IMAGE_REPO) -set image.tag=$(IMAGE_TAG)

build: ## build the portico binary into bin/
	$(GO) build -o bin/portico ./cmd/portico

image: deps ## the container image IMAGE: bin/image/oci (OCI layout), bin/image/portico.tar (docker load, ctr import, skopeo) (root; cold 3-8 min, warm ~8 s)
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) nice $(GO) run ./build/image -name $(IMAGE) -out bin/image

image-name: ## print IMAGE, the image's name and tag
	@echo $(IMAGE)

vet: ## go vet every package
	$(GO) vet ./...

# The two labs of whole systems, test/lab (agents as processes) and test/cluster
# (kubelet nodes), each keep a dozen processes busy and measure failover bounds in
# milliseconds; side by side on a small machine they starve each other. They run one
# after the other, after everything else.
LABS := ./test/lab ./test/cluster

unit: deps kapi kube ## run every Go test (BPF, namespace, API-server and cluster tests need root and run in CI)
	$(GO) test $(TESTFLAGS) $$($(GO) list ./... | grep -v -e '/test/lab$$' -e '/test/cluster$$')
	$(GO) test $(TESTFLAGS) -p 1 $(LABS)

fuzz: deps ## run each fuzz target briefly (FUZZTIME, default 200000 executions each)
	$(GO) test -run '^$$' -fuzz '^FuzzXDP$$' -fuzztime $(FUZZTIME) ./dataplane/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./vrrp/

verify: generate manifests ## regenerate the BPF objects and the plain manifests and fail if they differ from the committed ones, or if go.mod/go.sum are not tidy
	@git diff --exit-code --stat -- dataplane/ || { echo "verify: generated BPF files are stale: run make generate and commit" >&2; exit 1; }
	@git diff --exit-code --stat -- deploy/ || { echo "verify: deploy/ differs from the chart: run make manifests and commit (edit deploy/helm/portico, not the generated files)" >&2; exit 1; }
	@$(GO) mod tidy -diff || { echo "verify: go.mod/go.sum are not tidy: run go mod tidy and commit" >&2; exit 1; }

test: deps vet unit fuzz verify ## everything CI runs

lint: vet ## static checks (gofmt + vet)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out" >&2; exit 1; fi

bench: deps build ## data-plane benchmarks (per-packet cost, Maglev build, Apply latency)
	./bin/portico bench xdp
	$(GO) test -count=1 -run '^$$' -bench . -benchmem ./dataplane/...

demo: deps kapi kube helm build ## Portico on a real cluster of kubelet nodes, installed with its image and chart: kubectl views, HTTP/HTTPS through the VIP, the VIP owner dying under load, portico status (root; warm ~2 min, cold ~25 min)
	$(GO) run ./test/demo/cluster -portico bin/portico

demo-cluster: deps kapi kube helm build ## the same cluster with Portico installed, kept up until Ctrl-C, with commands to try (root)
	$(GO) run ./test/demo/cluster -hold -portico bin/portico

demo-quick: deps kapi build ## the whole system in namespaces without kubelets (agents as processes): VIP, HTTP/HTTPS spread, failover, portico status (root; warm ~30 s, cold ~5 min)
	$(GO) run ./test/demo/portico -portico bin/portico -kubectl "$$(test/kapi/build.sh dir)/kubectl"

lab: deps kapi build ## bring the lab up (kube-apiserver, 3 edge agents, client, pods) and keep it until Ctrl-C (root)
	$(GO) run ./test/demo/portico -lab -portico bin/portico -kubectl "$$(test/kapi/build.sh dir)/kubectl"

demo-dataplane: deps build ## the XDP data plane alone: client, edge node and two replicas in namespaces (root)
	$(GO) run ./test/demo/dataplane -portico bin/portico

clean: ## remove build output
	rm -rf bin

kapi: ## build the real kube-apiserver + etcd for integration tests (cached by version)
	@test/kapi/build.sh >/dev/null

kube: ## build kubelet, kube-controller-manager, kube-scheduler for the real-cluster lab (cached by version; ~7.5 min cold)
	@test/cluster/build.sh >/dev/null

cluster: deps kapi kube ## bring up a real cluster (control plane + NODES kubelet nodes, default 3; IMAGES: OCI archives to import) and keep it until Ctrl-C (root)
	$(GO) run ./test/cluster/up -nodes $(or $(NODES),3) $(foreach i,$(IMAGES),-image $(i))

bench-failover: deps ## VIP failover outage, Portico vs keepalived, at 1s/100ms/20ms adverts (root; ~4 min; TRIALS=10)
	set -o pipefail; PORTICO_BENCH_FAILOVER=1 PORTICO_BENCH_TRIALS=$(or $(TRIALS),10) $(GO) test -count=1 -timeout 20m -run '^TestFailoverBench$$' -v ./vrrp/ | grep -vE '^=== |became the only owner'

bench-nginx: deps ## nginx: render, reload, change to served at 100/1,000/10,000 routes, worker memory over 1,000 changes, req/s per core native vs dynamic matching (real nginx, wrk; ~5 min)
	$(GO) test -count=1 -run '^$$' -bench . -benchtime $(or $(BENCHTIME),5x) -benchmem ./nginx/

bench-bgp: deps kapi ## BGP mode: edge deaths and returns with BFD 50ms/300ms/none: next hop gone (median/max), flows the router moved, connections broken (root; TRIALS=5)
	set -o pipefail; PORTICO_BENCH_BGP=1 PORTICO_BENCH_TRIALS=$(or $(TRIALS),5) $(GO) test -count=1 -timeout 30m -run '^TestBGPOutageBench$$' -v ./test/lab/ | grep -E 'trial|over|^(ok|FAIL|---)'

bench-propagation: deps kapi ## change to served at every edge at 1,000 and 10,000 routes, CPU per change, memory (root; TRIALS=30)
	set -o pipefail; PORTICO_BENCH_PROPAGATION=1 PORTICO_BENCH_TRIALS=$(or $(TRIALS),30) $(GO) test -count=1 -timeout 30m -run '^TestPropagationBench$$' -v ./test/lab/ | grep -E 'routes|^(ok|FAIL|---)'

bench-lab: deps kapi ## repeated edge deaths in the lab, owner then non-owner: VRRP outage, last failed new connection, held connections kept (root; TRIALS=10)
	set -o pipefail; PORTICO_BENCH_LAB=1 PORTICO_BENCH_TRIALS=$(or $(TRIALS),10) $(GO) test -count=1 -timeout 20m -run '^TestFailoverBench$$' -v ./test/lab/ | grep -E 'trial|outage|kept|failed new|^(ok|FAIL|---)'
