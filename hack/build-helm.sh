#!/usr/bin/env bash
# build-helm.sh builds the Helm CLI that test/cluster installs deploy/helm/shardproxy with,
# from Helm's Go module, into the cache the Kubernetes binaries share:
#
#   ${SHARDPROXY_CACHE:-$HOME/.cache/shardproxy}/bin/helm-<version>-<key>
#
# The version is the helm.sh/helm/v3 the repository's go.mod requires, the one deploy/helm's
# test renders the chart with, so the CLI and the test never disagree on the template
# engine. It is built with `go install helm.sh/helm/v3/cmd/helm@<version>`: Helm's own go.mod
# and go.sum pin every dependency (the CLI needs modules the repository's renderer does not,
# which stay out of our go.sum). The key hashes the recipe (build_helm below, as bash prints
# it: code, not comments), the version and the go env that changes the output
# (hack/lib/cache.sh); a binary whose key is there is not rebuilt (a minute or two the
# first time on two cores, from the Go module proxy or an offline module cache with
# GOPROXY=off). It is a script of its own, not a name of build-apiserver.sh, whose recipe
# is part of every Kubernetes binary's key.
#
# Usage: hack/build-helm.sh [--print-path]
#   --print-path    print the cached path and build nothing (the tests find it this way,
#                   so the key has one definition, here)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib/cache.sh
source "${root}/hack/lib/cache.sh"
cache="${SHARDPROXY_CACHE:-${HOME}/.cache/shardproxy}"
bindir="${cache}/bin"

print_path=false
for arg in "$@"; do
	case "${arg}" in
	--print-path) print_path=true ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "build-helm: unknown argument ${arg} (try --help)" >&2
		exit 2
		;;
	esac
done

version="$(awk '$1 == "helm.sh/helm/v3" && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == "helm.sh/helm/v3" { print $3; exit }' "${root}/go.mod")"
if [[ -z "${version}" ]]; then
	echo "build-helm: cannot find the helm.sh/helm/v3 requirement in ${root}/go.mod" >&2
	exit 1
fi

# build_helm VERSION GOBIN installs Helm's CLI of VERSION into GOBIN. The ldflags are
# those of Helm's own release build (its Makefile): the version, so that `helm version`
# names it, and the Kubernetes version of its client-go (v0.X.Y: 1.X), which `helm
# template` and `helm lint` take for the cluster's when they have none (else v1.20, and a
# chart's kubeVersion, such as ours, fails).
build_helm() {
	local version="$1" gobin="$2" helm_mod client_go k8s_minor ldflags pkg
	go mod download "helm.sh/helm/v3@${version}"
	helm_mod="$(go env GOMODCACHE)/cache/download/helm.sh/helm/v3/@v/${version}.mod"
	client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "${helm_mod}")"
	if [[ ! "${client_go}" =~ ^v0\.([0-9]+)\. ]]; then
		echo "build-helm: cannot find Helm ${version}'s k8s.io/client-go version in ${helm_mod}" >&2
		return 1
	fi
	k8s_minor="${BASH_REMATCH[1]}"
	ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${version}"
	for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
		ldflags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${k8s_minor}"
	done
	CGO_ENABLED=0 GOBIN="${gobin}" go install -trimpath -ldflags="${ldflags}" "helm.sh/helm/v3/cmd/helm@${version}"
}

key="$({
	cache_recipe_hash build_helm
	echo "helm.sh/helm/v3@${version}"
} | cache_key)"
out="${bindir}/helm-${version}-${key}"

if ${print_path}; then
	echo "${out}"
	exit 0
fi
if cache_all_there "${out}"; then
	exit 0
fi

# One build at a time (build-apiserver.sh's lock): a second caller waits, then finds it.
cache_lock build-helm "${bindir}"
if [[ -x "${out}" ]]; then
	exit 0
fi

echo "build-helm: building helm ${version} (go install helm.sh/helm/v3/cmd/helm@${version})"
start=${SECONDS}
# GOBIN is a temporary directory and the binary is renamed into place, so an interrupted
# build never leaves a truncated binary where the next run would take it as done.
gobin="$(mktemp -d "${bindir}/.helm.XXXXXX")"
trap 'rm -rf "${gobin}"' EXIT
build_helm "${version}" "${gobin}"
mv -f "${gobin}/helm" "${out}"
echo "build-helm: built ${out} ($(du -h "${out}" | cut -f1)) in $((SECONDS - start))s"

# Builds of other keys that nobody used for a week go.
cache_prune build-helm "${bindir}" "${out}" helm
