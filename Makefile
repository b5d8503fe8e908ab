# shardproxy: build, test and run targets. Every target installs what it needs on a
# fresh Debian machine (CI runs these as root).

GO        ?= go
BIN       := bin/shardproxy
PKGS      := ./...
APT_PKGS  := nftables conntrack iproute2
# Tests that need root, nft and network namespaces run as part of `make test`; CI is root.
TEST_FLAGS ?= -count=1

.PHONY: all build test test-unit fuzz deps vet fmt clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/shardproxy

# deps installs the host tools the real-kernel tests and the proxy use.
deps:
	@missing=""; \
	command -v nft >/dev/null || missing="$$missing nftables"; \
	command -v conntrack >/dev/null || missing="$$missing conntrack"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PKGS) >/dev/null; \
	fi

vet:
	$(GO) vet $(PKGS)

# test runs every layer that exists: unit tests (fakes, golden rulesets, packet tracer)
# and real-kernel tests (nft in fresh network namespaces, real TCP/UDP traffic).
test: deps vet
	$(GO) test $(TEST_FLAGS) $(PKGS)

# test-unit runs only what needs no root.
test-unit:
	$(GO) test $(TEST_FLAGS) -short $(PKGS)

fuzz:
	$(GO) test ./instance -run '^$$' -fuzz FuzzBuild -fuzztime 20s

fmt:
	gofmt -l -w .

clean:
	rm -rf bin
