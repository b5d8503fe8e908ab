# shardproxy: build, test and run targets. Every target installs what it needs on a
# fresh Debian machine (CI runs these as root).

GO        ?= go
BIN       ?= bin/shardproxy
# VERSION is the release: `shardproxy version` prints it and the image is tagged with
# it. The overlays' kustomize images: name IMAGE (deploy/version_test.go checks that the
# three agree). REGISTRY=my.registry/team make ... builds and names a private copy.
VERSION   ?= $(shell cat VERSION)
REGISTRY  ?= ghcr.io/shardproxy
IMAGE     ?= $(REGISTRY)/shardproxy:$(VERSION)
# COMMIT is the checkout's commit, "-dirty" with uncommitted changes: `shardproxy
# --version` names it.
COMMIT    ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
LDFLAGS   := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
PKGS      := ./...
# Tests that need root, nft and network namespaces run as part of `make test`; CI is root.
TEST_FLAGS ?= -count=1

.PHONY: all build print-image test test-unit flakes soak fuzz deps vet fmt clean demo demo-cluster bench bench-compare image cluster conformance kernels fleet fleet-real docs release

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/shardproxy

# print-image prints the image name and tag this VERSION is released as.
print-image:
	@echo $(IMAGE)

# deps installs the host tools (nftables, conntrack, iproute2, etcd; containerd, runc, CNI
# plugins, mmdebstrap, umoci for the cluster layer) that the proxy and the tests use, and
# builds kube-apiserver v1.36.3 from the Go module into the cache (~/.cache/shardproxy,
# keyed by a hash of the build's inputs; minutes the first time, seconds after),
# kube-proxy v1.36.3 for the coexistence and migration e2e, and the cluster layer's
# kubelet, kube-controller-manager, kube-scheduler, kubectl and CoreDNS, and upstream's
# e2e.test and agnhost, and kubemark (make fleet); and the Helm CLI (go.mod's
# helm.sh/helm/v3, from its Go module: hack/build-helm.sh) that the cluster layer
# installs deploy/helm/shardproxy with.
deps:
	hack/install-deps.sh
	hack/build-apiserver.sh --all --node --dns --conformance --kubemark
	hack/build-helm.sh

# image builds, offline, the image deploy/Dockerfile describes (same packages, flags,
# capabilities, user and entrypoint; deploy/image_test.go keeps them in step) as an OCI
# archive in ~/.cache/shardproxy/images, for `ctr images import --base-name
# localhost/shardproxy`, tagged VERSION.
image:
	hack/install-deps.sh
	TAG=$(VERSION) hack/build-image.sh shardproxy

# cluster runs the cluster layer alone (test/cluster): real dual-stack nodes (containerd,
# kubelet, each in a network namespace of its own; two, or CLUSTER_NODES=3 for more) and
# CoreDNS on a throwaway control plane running deploy/'s overlays with the image built
# from the repository, then torn down. CLUSTER_KEEP_LOGS=DIR keeps a failed run's logs.
# Root only.
cluster: deps
	$(GO) test -count=1 -timeout 40m -v ./test/cluster

# conformance runs every selected [sig-network] Services test of upstream's e2e.test
# v1.36.3 (built from the same module) and its [Feature:IPv6DualStack] Service tests on
# the cluster layer's nodes, once with shardproxy as the nodes' only proxy and once with
# upstream kube-proxy in nftables mode, and prints both side by side (TestConformance).
# Every selected test must pass with shardproxy or skip itself with a reason; the two
# runs must select the same tests; a test kube-proxy does not pass is a harness fault.
# The cluster layer runs CI's subset with shardproxy alone, against the record of
# kube-proxy's run in test/cluster/testdata; SHARDPROXY_CONFORMANCE_RECORD=1 make
# conformance writes this focus's record (conformance-<version>-full.txt). It runs three
# nodes (CLUSTER_NODES, default 3 here): "should implement NodePort and
# HealthCheckNodePort correctly when ExternalTrafficPolicy changes" needs a third node
# and skips itself on two. TestConformance's own deadline here is 100 minutes (two
# 45-minute suites, 10 of setup), after up to 15 for the cluster's start.
conformance: deps
	hack/build-apiserver.sh --conformance
	CLUSTER_NODES=$${CLUSTER_NODES:-3} SHARDPROXY_CONFORMANCE=full $(GO) test -count=1 -timeout 120m -v -run '^TestConformance$$' ./test/cluster

vet:
	$(GO) vet $(PKGS)

# docs rewrites the generated part of docs/configuration.md (the configuration reference)
# from supervisor/config's types and example.yaml, and of docs/commands.md (every command
# and flag) from the CLI's command tree; docs/configref's and docs/cliref's tests, in the
# unit layer, fail when a page differs or a field is undocumented.
docs:
	$(GO) run ./docs/configref/cmd/gendocs
	$(GO) run ./docs/cliref/cmd/gencommands

# release builds VERSION's release (vMAJOR.MINOR.PATCH) from the commit REF (HEAD) into
# _output/release/VERSION (hack/release.sh): the binary and the image for amd64 and arm64 (an
# OCI layout whose index holds both), stamped with VERSION and the commit, an SPDX SBOM,
# SHA256SUMS, the packaged chart and deploy/'s overlays, both pinned to the image's
# digest; then checks it (hack/release verify). Root only; the Debian root file systems
# are cached in ~/.cache/shardproxy/release.
release:
	REF=$(REF) hack/release.sh $(VERSION)

# kernels runs the real-kernel layer on Debian's own kernels (KERNELS, default 5.10 from
# bullseye, 6.1 from bookworm, 6.12 from bookworm-backports), each in a QEMU VM under
# software emulation with the test binaries and a Debian root file system in its
# initramfs, and prints one LAYER line per kernel (hack/kernels.sh). The packages and
# root file system are cached in ~/.cache/shardproxy/kernels. Root only; 9-10 minutes a
# kernel on two cores at a load average of 6, up to 14 at 10-13 (docs/testing.md).
# `make test` runs the 6.1 one, with tests.txt's smaller ci set, as its kernel-6.1 layer.
KERNELS ?= 5.10,6.1,6.12
kernels:
	hack/install-deps.sh
	KERNELS=$(KERNELS) hack/kernels.sh

# test runs every layer, one summary line each (hack/test.sh): set-up (make deps and
# go vet, timed), unit (fakes, golden rulesets, packet tracer), real-kernel (nft in
# fresh network namespaces, real TCP/UDP traffic), integration (etcd + kube-apiserver),
# e2e (the real binary, three instances, real traffic), cluster (a real kubelet node),
# soak, fuzz and the demo in --once mode, with the wall time of each and a total.
# Root only; CI is root (.ci/run adds SHARDPROXY_CI=1: a missing tool fails, never skips).
test:
	hack/test.sh

# flakes runs the unit and real-kernel layers COUNT times (default 10) and the e2e layer
# E2E_COUNT times (default 3), and lists every test that failed at least once
# (hack/flakes.sh). Root only; about an hour with the defaults on two cores.
COUNT     ?= 10
E2E_COUNT ?= 3
flakes: deps
	COUNT=$(COUNT) E2E_COUNT=$(E2E_COUNT) hack/flakes.sh

# soak runs the real binary with three instances against a local control plane for
# SOAK_DURATION (default 10 minutes) of seeded random changes to ~1,000 Services and
# injected faults (apiserver restarts, expired watches, kill -9 mid full sync, tables
# broken by hand, nft and netlink failing, a full conntrack table), and checks at
# quiescent checkpoints that the kernel equals `shardproxy render` and that steady
# Services never failed a probe (hack/soak.sh, test/soak; SOAK_SEED replays a run).
# Root only.
SOAK_DURATION ?= 10m
soak: deps
	SOAK_DURATION=$(SOAK_DURATION) hack/soak.sh

# demo is the README's main job: a local control plane, a node namespace running three
# instances, sample Services, real traffic and a table of who served what. It stays up
# until Ctrl-C; `make demo DEMO_FLAGS=--once` exits after the report.
demo: deps
	$(GO) build -o bin/demo ./hack/demo
	bin/demo --repo . $(DEMO_FLAGS)

# demo-cluster is the same table with shardproxy as operators run it: the image built from
# the repository (make image), a real node (containerd, kubelet; test/cluster), the
# replace overlay applied through kustomize (image, API server endpoint and the demo's
# three instances changed), the demo's Services behind agnhost pods. Torn down on Ctrl-C
# (or after the report with DEMO_FLAGS=--once), leaving the host as found.
demo-cluster: deps
	$(GO) build -o bin/demo ./hack/demo
	bin/demo --repo . --cluster $(DEMO_FLAGS)

# bench measures one instance with the real nft in fresh network namespaces (test/bench):
# full and partial syncs against `nft -f` alone, memory, per-packet cost, 4 instances vs 1,
# at BENCH_SCALES Services × 10 endpoints. Prints a table, writes BENCH_OUT. Root only;
# ~6 minutes on two cores with the default scales. BENCH_FLAGS adds flags (-h lists them),
# e.g. BENCH_FLAGS=-modes=random,roundRobin,sourceHash,consistentHash measures each
# load-balancing mode (one column per mode; the default measures random only).
BENCH_SCALES ?= 1000,10000,30000
BENCH_OUT    ?= _output/bench/bench.json
bench:
	hack/install-deps.sh
	$(GO) build -o bin/shardproxy-bench ./test/bench/cmd/shardproxy-bench
	bin/shardproxy-bench -scales $(BENCH_SCALES) -out $(BENCH_OUT) $(BENCH_FLAGS)

# bench-compare serves the same Services (BENCH_COMPARE_SCALES × 10 endpoints, created in
# a local kube-apiserver) once with upstream kube-proxy v1.36.3 in nftables mode and once
# with one shardproxy instance, one after the other in a fresh node namespace, and prints
# both proxies' first full sync, partial sync, network programming latency and peak RSS
# from their own metrics, then their CPU per minute under a steady churn of 20 endpoint
# changes per second for a minute, with the ratios (test/bench/compare). Writes the JSON
# and a plot of sync time and RSS against Services (BENCH_COMPARE_PLOT, .svg or .png).
# Root only; ~15 minutes on two cores with the default scales, after `make deps`.
# BENCH_COMPARE_FLAGS adds flags, e.g. `-only shardproxy -heap-profile-dir DIR`
# (shardproxy's heap after its first sync), `-churn-duration 0` (no churn phase) or
# `-also DIR,...` (other checkouts, e.g. main before a change, on the same objects) or
# `-serve-percent 10` (then a node whose instance serves a labelled tenth of the
# Services, in that cluster and in one holding only that tenth), `-ipv6-percent 50` (half
# the Services IPv6: both families programmed) or `-seed etcd` (the objects written into
# etcd, for 100,000 Services: the apiserver of a busy 2-core machine creates ~20 a second).
BENCH_COMPARE_SCALES ?= 1000,10000
BENCH_COMPARE_OUT    ?= _output/bench/compare.json
BENCH_COMPARE_PLOT   ?= _output/bench/compare.svg
bench-compare: deps
	$(GO) build -o bin/shardproxy-bench-compare ./test/bench/cmd/shardproxy-bench-compare
	bin/shardproxy-bench-compare -repo . -scales $(BENCH_COMPARE_SCALES) -out $(BENCH_COMPARE_OUT) -plot $(BENCH_COMPARE_PLOT) $(BENCH_COMPARE_FLAGS)

# fleet runs FLEET_NODES hollow shardproxy nodes (test/fleet: the real supervisor with
# the kernel faked, each node with its own Node object and client at QPS 5, burst 10), with
# reserveOtherNodeAddresses on and off, and as many of kubemark's hollow kube-proxies
# (--morph=proxy, one process each, built from the Go module into the cache) beside them,
# against one local kube-apiserver and etcd holding FLEET_SERVICES of the bench's mix,
# while the driver writes every Node's status each FLEET_STATUS_PERIOD; prints the
# apiserver's CPU per minute and memory, watch events and the bytes written to watchers,
# the proxies' requests, etcd writes, the proxies' memory and shardproxy's fleet-wide programming latency, and the
# growth of each per node for both, extrapolated to 5,000 nodes (docs/fleet.md). Each
# shardproxy fleet then runs `migrate move` of 100 Services to a second instance on every
# node, its rollback, and a move one stopped node must block by name (-migrate 0: none).
# -churn 1s in FLEET_FLAGS makes one Node join or leave a second during the steady
# window (docs/fleet.md#churn-nodes-joining-and-leaving). Not part of `make test`. FLEET_PROXIES picks the proxies; FLEET_FLAGS adds flags
# (-h lists them).
FLEET_NODES         ?= 50,100,200
FLEET_SERVICES      ?= 1000
FLEET_STATUS_PERIOD ?= 30s
FLEET_PROXIES       ?= shardproxy,kube-proxy
fleet:
	hack/build-apiserver.sh kube-apiserver kubemark
	$(GO) build -o bin/shardproxy-fleet ./test/fleet/cmd/shardproxy-fleet
	bin/shardproxy-fleet -nodes $(FLEET_NODES) -services $(FLEET_SERVICES) -status-period $(FLEET_STATUS_PERIOD) -proxies $(FLEET_PROXIES) $(FLEET_FLAGS)

# fleet-real is the denominator `make fleet` cannot give: kubemark's hollow kube-proxy
# programs nothing, so it times fleet-wide network programming with real proxies on real
# kernels. For each of FLEET_REAL_NODES it runs that many real nodes (test/realfleet: a
# network namespace each, its own Node object and a real proxy process in it), first
# upstream kube-proxy v1.36.3 in nftables mode, then shardproxy's supervisor with one
# default instance (both with their defaults, minSyncPeriod 1 s), against one local
# kube-apiserver and etcd holding FLEET_REAL_SERVICES of the bench's mix; it creates
# FLEET_REAL_CHANGES Services with their EndpointSlices one after the other (as `make
# fleet` does) and records when each node's kernel has each one (`nft monitor` per
# namespace), and prints p50/p99/max of the fleet-wide time (the last node's) and
# shardproxy's p99 over kube-proxy's at each size (docs/fleet.md). Root only; takes the
# heavy-run lock. `make test` runs a two-node slice (TestBothProxiesProgram).
FLEET_REAL_NODES    ?= 5,10,20
FLEET_REAL_SERVICES ?= 1000
FLEET_REAL_CHANGES  ?= 10
fleet-real: build
	hack/build-apiserver.sh kube-apiserver kube-proxy
	$(GO) build -o bin/shardproxy-realfleet ./test/realfleet/cmd/shardproxy-realfleet
	flock /tmp/shardproxy-cluster.lock nice -n 10 bin/shardproxy-realfleet -nodes $(FLEET_REAL_NODES) -services $(FLEET_REAL_SERVICES) \
		-changes $(FLEET_REAL_CHANGES) -shardproxy bin/shardproxy -kube-proxy "$$(hack/build-apiserver.sh --print-path kube-proxy)" $(FLEET_REAL_FLAGS)

# test-unit runs only what needs no root.
test-unit:
	$(GO) test $(TEST_FLAGS) -short $(PKGS)

fuzz:
	$(GO) test ./instance/modelfuzz -run '^$$' -fuzz FuzzBuild -fuzztime 40000x

fmt:
	gofmt -l -w .

clean:
	rm -rf bin
