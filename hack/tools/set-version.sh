#!/usr/bin/env bash
# set-version.sh points this tools module at another Kubernetes release: it rewrites
# go.mod to require k8s.io/kubernetes VERSION and to replace every staging module that
# k8s.io/kubernetes' own go.mod maps to ./staging/src/... with its published release
# (v1.X.Y -> v0.X.Y), then tidies. Update KubernetesVersion in test/controlplane to match.
#
# Usage: hack/tools/set-version.sh v1.36.3
set -euo pipefail

version="${1:?usage: $0 v1.X.Y}"
if [[ ! "${version}" =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then
	echo "set-version: ${version} is not a release version v1.X.Y" >&2
	exit 2
fi
staging="v0.${version#v1.}"
cd "$(dirname "${BASH_SOURCE[0]}")"

upstream_mod="$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')"
modules="$(sed -n 's|^\t\(k8s.io/[a-z0-9-]*\) => ./staging/.*|\1|p' "${upstream_mod}")"
go_version="$(sed -n 's/^go //p' "${upstream_mod}")"
godebug="$(sed -n 's/^godebug //p' "${upstream_mod}")"

# Keep the header comment, regenerate the rest.
header="$(sed -n '/^module /q;p' go.mod)"
{
	echo "${header}"
	echo "module github.com/shardproxy/shardproxy/hack/tools"
	echo
	echo "go ${go_version}"
	if [[ -n "${godebug}" ]]; then
		echo
		echo "godebug ${godebug}"
	fi
	echo
	echo "require k8s.io/kubernetes ${version}"
	echo
	echo "replace ("
	for m in ${modules}; do
		printf '\t%s => %s %s\n' "${m}" "${m}" "${staging}"
	done
	echo ")"
} >go.mod.new
mv go.mod.new go.mod
go mod tidy
echo "set-version: hack/tools now builds Kubernetes ${version} with staging modules ${staging}"
