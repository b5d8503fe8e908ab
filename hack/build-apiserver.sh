#!/usr/bin/env bash
# build-apiserver.sh builds kube-apiserver (and, on request, kube-proxy and the node
# components of the cluster layer) from the k8s.io/kubernetes Go module pinned in
# hack/tools/go.mod, into a cache directory:
#
#   ${SHARDPROXY_CACHE:-$HOME/.cache/shardproxy}/bin/<name>-<version>-<key>
#
# The key is a hash of every input of the build besides the module cache, which go.sum
# pins: the recipe (build_binary and kube_ldflags below, as bash prints them: the build
# commands, their flags and ldflags, not comments, usage or plumbing, hack/lib/cache.sh),
# the Go toolchain and the go env settings that change its output, and the module the
# binary is built from:
# hack/tools' go.mod (with its replaces), go.sum and *.go for Kubernetes' binaries,
# hack/tools/coredns's (its main.go holds CoreDNS's plugin list) for CoreDNS. A binary whose
# key is there is not rebuilt; a change to any input makes a new key, so a binary built
# from other inputs is never taken. Keys nobody used for a week are removed after a build.
# The first kube-apiserver build takes several minutes on two cores; kube-proxy shares most
# of the build cache afterwards.
#
# Usage: hack/build-apiserver.sh [--kube-proxy | --all | --node | --print-path] [NAME...]
#   (no arguments)  build kube-apiserver
#   --kube-proxy    build kube-proxy only
#   --all           build kube-apiserver and kube-proxy
#   --node          build kubelet, kube-controller-manager, kube-scheduler and kubectl
#                   (test/cluster)
#   --conformance   build upstream's e2e.test and agnhost (test/cluster's conformance run)
#   --kubemark      build kubemark, whose --morph=proxy is upstream's hollow kube-proxy
#                   (make fleet's anchor)
#   --dns           build CoreDNS from hack/tools/coredns (test/cluster's cluster DNS),
#                   cached as coredns-<CoreDNS version>-<key>
#   --print-path    print the cached path of each NAME (default kube-apiserver), build
#                   nothing: the tests find the binaries this way, so the key has one
#                   definition, here
#   NAME...         any of: kube-apiserver kube-proxy kubelet kube-controller-manager
#                   kube-scheduler kubectl e2e.test agnhost coredns kubemark
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib/cache.sh
source "${root}/hack/lib/cache.sh"
tools="${root}/hack/tools"
cache="${SHARDPROXY_CACHE:-${HOME}/.cache/shardproxy}"
bindir="${cache}/bin"

# The Kubernetes version is whatever hack/tools/go.mod requires.
version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "${tools}/go.mod")"
if [[ -z "${version}" ]]; then
	echo "build-apiserver: cannot find the k8s.io/kubernetes version in ${tools}/go.mod" >&2
	exit 1
fi

names=()
print_path=false
for arg in "$@"; do
	case "${arg}" in
	--kube-proxy) names+=(kube-proxy) ;;
	--all) names+=(kube-apiserver kube-proxy) ;;
	--node) names+=(kubelet kube-controller-manager kube-scheduler kubectl) ;;
	--conformance) names+=(e2e.test agnhost) ;;
	--kubemark) names+=(kubemark) ;;
	--dns) names+=(coredns) ;;
	--print-path) print_path=true ;;
	kube-apiserver | kube-proxy | kubelet | kube-controller-manager | kube-scheduler | kubectl | e2e.test | agnhost | coredns | kubemark)
		names+=("${arg}")
		;;
	-h | --help)
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "build-apiserver: unknown argument ${arg} (try --help)" >&2
		exit 2
		;;
	esac
done
if [[ ${#names[@]} -eq 0 ]]; then
	names=(kube-apiserver)
fi

# CoreDNS has its own module and version; everything else is Kubernetes'.
coredns_version="$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3 }' "${tools}/coredns/go.mod")"
version_of() {
	if [[ "$1" == coredns ]]; then echo "${coredns_version}"; else echo "${version}"; fi
}

# sources_of NAME prints the module directory NAME is built in.
sources_of() {
	if [[ "$1" == coredns ]]; then echo "${tools}/coredns"; else echo "${tools}"; fi
}

# kube_ldflags VERSION prints the ldflags of Kubernetes' binaries: the variables
# upstream's hack/lib/version.sh sets, so that /version and the compatibility version
# report v1.X.Y instead of v0.0.0-master.
kube_ldflags() {
	local version="$1" minor major ldflags pkg
	minor="${version#v*.}"
	minor="${minor%%.*}"
	major="${version#v}"
	major="${major%%.*}"
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X ${pkg}.gitVersion=${version}"
		ldflags+=" -X ${pkg}.gitMajor=${major}"
		ldflags+=" -X ${pkg}.gitMinor=${minor}"
		ldflags+=" -X ${pkg}.gitTreeState=clean"
	done
	echo "${ldflags}"
}

# build_binary NAME OUT builds NAME into OUT, in hack/tools (CoreDNS in its own module).
build_binary() {
	local name="$1" out="$2" ldflags
	ldflags="$(kube_ldflags "${version}")"
	cd "${tools}"
	echo "build-apiserver: downloading modules"
	go mod download
	case "${name}" in
	coredns)
		cd coredns
		echo "build-apiserver: compiling CoreDNS (hack/tools/coredns)"
		go mod download
		CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "${out}" .
		;;
	e2e.test)
		# Upstream's end-to-end suite is the test binary of test/e2e.
		echo "build-apiserver: compiling the tests of k8s.io/kubernetes/test/e2e"
		CGO_ENABLED=0 go test -c -trimpath -ldflags="${ldflags}" -o "${out}" \
			k8s.io/kubernetes/test/e2e
		;;
	agnhost)
		echo "build-apiserver: compiling k8s.io/kubernetes/test/images/agnhost"
		CGO_ENABLED=0 go build -trimpath -ldflags="${ldflags}" -o "${out}" \
			k8s.io/kubernetes/test/images/agnhost
		;;
	*)
		echo "build-apiserver: compiling k8s.io/kubernetes/cmd/${name}"
		CGO_ENABLED=0 go build -trimpath -ldflags="${ldflags}" -o "${out}" \
			"k8s.io/kubernetes/cmd/${name}"
		;;
	esac
}

# module_key DIR hashes what the build reads besides the module cache: the recipe, the
# toolchain the module selects and the go env that changes its output, and the module's
# go.mod, go.sum and *.go (contents only, so that every checkout shares the cache).
module_key() {
	local dir="$1" f
	{
		(cd "${dir}" && cache_recipe_hash build_binary kube_ldflags)
		for f in "${dir}"/go.mod "${dir}"/go.sum "${dir}"/*.go; do
			echo "--- ${f##*/}"
			cat "${f}"
		done
	} | cache_key
}

# out_of[NAME] is where NAME's binary is cached. The name is part of the path, so one key
# per module serves every binary built from it.
declare -A module_keys=() out_of=()
for name in "${names[@]}"; do
	dir="$(sources_of "${name}")"
	if [[ -z "${module_keys[${dir}]:-}" ]]; then
		module_keys[${dir}]="$(module_key "${dir}")"
	fi
	out_of[${name}]="${bindir}/${name}-$(version_of "${name}")-${module_keys[${dir}]}"
done

if ${print_path}; then
	for name in "${names[@]}"; do
		echo "${out_of[${name}]}"
	done
	exit 0
fi

# Nothing to do when every binary is there: return without waiting for another build's
# lock (a long e2e.test build must not hold up a test that only needs the cached kubelet).
# A used binary is touched, so that pruning (below) sees it as in use.
paths=()
for name in "${names[@]}"; do
	paths+=("${out_of[${name}]}")
done
if cache_all_there "${paths[@]}"; then
	exit 0
fi

cache_lock build-apiserver "${bindir}"

for name in "${names[@]}"; do
	out="${out_of[${name}]}"
	if [[ -x "${out}" ]]; then
		echo "build-apiserver: ${out} exists, not rebuilding"
		continue
	fi
	echo "build-apiserver: building ${name} $(version_of "${name}") (this takes minutes the first time)"
	start=${SECONDS}
	# Build into a temporary name and rename, so an interrupted build never leaves a
	# truncated binary where the next run would take it as done.
	tmp="${out}.tmp.$$"
	trap 'rm -f "${tmp}"' EXIT
	(build_binary "${name}" "${tmp}")
	mv -f "${tmp}" "${out}"
	trap - EXIT
	size="$(du -h "${out}" | cut -f1)"
	echo "build-apiserver: built ${out} (${size}) in $((SECONDS - start))s"

	# Binaries of other keys (inputs that changed) that nobody used for a week go.
	cache_prune build-apiserver "${bindir}" "${out}" "${name}"
done
