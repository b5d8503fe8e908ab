#!/usr/bin/env bash
# local-up.sh runs a local control plane (etcd + kube-apiserver on free loopback ports,
# token auth, RBAC, dual-stack service CIDRs) until Ctrl-C, and prints its kubeconfig.
# It installs etcd if missing and builds kube-apiserver the first time (minutes).
#
# Usage: hack/local-up.sh [--bind-address 0.0.0.0] [--advertise-address IP]
#                         [--service-cidrs 10.96.0.0/16,fd00:96::/112] [--kubeconfig PATH]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SHARDPROXY_CACHE:-${HOME}/.cache/shardproxy}"

if ! command -v etcd >/dev/null 2>&1; then
	"${root}/hack/install-deps.sh"
fi
"${root}/hack/build-apiserver.sh"

# Build and exec rather than `go run`, so Ctrl-C goes straight to localup, which stops the
# control plane in order.
mkdir -p "${cache}/bin"
(cd "${root}" && go build -o "${cache}/bin/localup" ./hack/localup)
exec "${cache}/bin/localup" "$@"
