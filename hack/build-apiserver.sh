#!/usr/bin/env bash
# build-apiserver.sh builds kube-apiserver (and, on request, kube-proxy) from the
# k8s.io/kubernetes Go module pinned in hack/tools/go.mod, into a cache directory:
#
#   ${SHARDPROXY_CACHE:-$HOME/.cache/shardproxy}/bin/<name>-<version>
#
# A binary that is already there is not rebuilt. The first kube-apiserver build takes
# several minutes on two cores; kube-proxy shares most of the build cache afterwards.
#
# Usage: hack/build-apiserver.sh [--kube-proxy | --all | --print-path] [NAME...]
#   (no arguments)  build kube-apiserver
#   --kube-proxy    build kube-proxy only
#   --all           build kube-apiserver and kube-proxy
#   --print-path    print the cached path of each NAME (default kube-apiserver), build nothing
#   NAME...         any of: kube-apiserver kube-proxy
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
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
	--print-path) print_path=true ;;
	kube-apiserver | kube-proxy) names+=("${arg}") ;;
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

if ${print_path}; then
	for name in "${names[@]}"; do
		echo "${bindir}/${name}-${version}"
	done
	exit 0
fi

mkdir -p "${bindir}"

# Serialize builds: tests in several packages may ask for the binary at the same time, and
# the second one should wait and then find it, not build it again.
exec 9>"${bindir}/.build.lock"
if ! flock -n 9; then
	echo "build-apiserver: another build is running, waiting for it"
	flock 9
fi

# The same variables upstream's hack/lib/version.sh sets, so that /version and the
# compatibility version report v1.X.Y instead of v0.0.0-master.
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

for name in "${names[@]}"; do
	out="${bindir}/${name}-${version}"
	if [[ -x "${out}" ]]; then
		echo "build-apiserver: ${out} exists, not rebuilding"
		continue
	fi
	echo "build-apiserver: building ${name} ${version} (this takes minutes the first time)"
	start=${SECONDS}
	# Build into a temporary name and rename, so an interrupted build never leaves a
	# truncated binary where the next run would take it as done.
	tmp="${out}.tmp.$$"
	trap 'rm -f "${tmp}"' EXIT
	(
		cd "${tools}"
		echo "build-apiserver: downloading modules"
		go mod download
		echo "build-apiserver: compiling k8s.io/kubernetes/cmd/${name}"
		CGO_ENABLED=0 go build -trimpath -ldflags="${ldflags}" -o "${tmp}" \
			"k8s.io/kubernetes/cmd/${name}"
	)
	mv -f "${tmp}" "${out}"
	trap - EXIT
	size="$(du -h "${out}" | cut -f1)"
	echo "build-apiserver: built ${out} (${size}) in $((SECONDS - start))s"
done
