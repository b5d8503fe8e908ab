#!/usr/bin/env bash
# build-image.sh builds container images offline, as OCI archives that
# `ctr images import --base-name localhost/NAME` takes, into
#
#   ${SHARDPROXY_CACHE:-$HOME/.cache/shardproxy}/images/<name>-<key>/<name>-<tag>.tar
#
# No registry is reachable here, so nothing is pulled: a Debian root filesystem comes from
# mmdebstrap (Debian's packages), is cached, and umoci packs it with the binaries into an
# image. Each is cached under a key, a hash of its inputs, and reused while the key is there:
#
#   rootfs-<suite>-<key>  this script, the suite, the package list and mmdebstrap's
#                         version (not what the Debian mirror serves at the time: a root
#                         filesystem is a snapshot of it, refreshed when the key changes)
#   <name>-<key>          this script, the name and tag, umoci's version, the root
#                         filesystem's key and the contents of the binaries in the image:
#                         built here from the repository (Go's build cache makes that
#                         seconds) or by hack/build-apiserver.sh, whose own keys cover
#                         their inputs (Go version, module pins and replaces, ldflags)
#
# so a change to any input builds a new archive beside the old ones, and two checkouts
# sharing the cache never take each other's. Keys nobody used for a day are removed.
# Images:
#
#   shardproxy  what deploy/Dockerfile describes: Debian bookworm with the packages of
#               ${shardproxy_packages[@]}, the binary built from this repository with the
#               Dockerfile's flags, cap_net_admin on it and on nft, user 65532, the binary
#               as entrypoint (deploy/image_test.go keeps the two in step). Tag: $TAG
#               (default: the VERSION file).
#   pause       hack/pause, the node's sandbox image (static, nothing else).
#   coredns     CoreDNS from hack/tools/coredns (static, nothing else).
#   kube-proxy  upstream kube-proxy (built from the same module) on the shardproxy image's
#               Debian packages (iptables, nftables, conntrack), as root, for a kube-proxy
#               DaemonSet beside shardproxy's. Tag: the Kubernetes version.
#   agnhost     upstream's test image: agnhost from the k8s.io/kubernetes module on Debian
#               with the tools upstream's e2e tests exec in it (GNU wget, OpenBSD nc, curl,
#               dig, ...). Busybox's wget crashes on these machines.
#
# Usage: hack/build-image.sh NAME...   prints each archive's path, one a line, on stdout
#
# The tests take the paths it prints, so the keys have one definition, here.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SHARDPROXY_CACHE:-${HOME}/.cache/shardproxy}"
images="${cache}/images"
# The image's tag and the binary's version: the VERSION file, as the Dockerfile's.
tag="${TAG:-$(cat "${root}/VERSION")}"
go="${GO:-go}"

# The shardproxy image's packages, entrypoint, user and build flags: deploy/Dockerfile's.
shardproxy_packages=(nftables conntrack iproute2 kmod iptables)
shardproxy_entrypoint=/usr/local/bin/shardproxy
shardproxy_user=65532:65532
shardproxy_ldflags="-s -w -X main.version=${tag}"
# No iptables binary: the supervisor passes its own to iptables-nft-save (legacy/caps.go).
shardproxy_caps=(/usr/local/bin/shardproxy /usr/sbin/nft)
# agnhost's tools: what upstream's network tests run with `kubectl exec`.
agnhost_packages=(wget curl netcat-openbsd bash iproute2 iputils-ping dnsutils procps conntrack)
suite=bookworm

log() { echo "build-image: $*" >&2; }

# hash prints a key of its standard input.
hash() { sha256sum | cut -c1-16; }
# sum FILE prints FILE's sha256: an input by content, wherever it lies.
sum() { sha256sum <"$1" | cut -d' ' -f1; }

script_sum="$(sum "${BASH_SOURCE[0]}")"

for tool in mmdebstrap umoci setcap; do
	if ! PATH="${PATH}:/usr/sbin:/sbin" command -v "${tool}" >/dev/null; then
		log "${tool} is missing: run hack/install-deps.sh"
		exit 1
	fi
done
mkdir -p "${images}"

work="$(mktemp -d "${TMPDIR:-/tmp}/shardproxy-image.XXXXXX")"
trap 'rm -rf "${work}"' EXIT

# rootfs_dir PACKAGE... prints where the root filesystem with the packages is cached.
rootfs_dir() {
	local key
	key="$(printf '%s\n' "${script_sum}" "${suite}" "$@" "$(mmdebstrap --version)" | hash)"
	echo "${images}/rootfs-${suite}-${key}"
}

# rootfs PACKAGE... prints a directory holding a cached Debian root filesystem with the
# packages (minbase: dpkg, apt, coreutils, bash, ...), building it the first time.
rootfs() {
	local dir
	dir="$(rootfs_dir "$@")"
	# One build of a root filesystem at a time; other images need not wait.
	exec 9>"${dir}.lock"
	flock 9
	if [[ ! -d "${dir}" ]]; then
		log "mmdebstrap ${suite} with $* (once; cached in ${dir})"
		rm -rf "${dir}.tmp"
		local include
		include="$(
			IFS=,
			echo "$*"
		)"
		mmdebstrap --quiet --variant=minbase --include="${include}" \
			--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
			--dpkgopt='path-exclude=/usr/share/locale/*' \
			"${suite}" "${dir}.tmp" >&2
		rm -rf "${dir}.tmp/var/lib/apt/lists"/* "${dir}.tmp/var/cache/apt"/*
		mv "${dir}.tmp" "${dir}"
		prune "rootfs-${suite}" "${dir}"
	fi
	touch -c "${dir}"
	exec 9>&-
	echo "${dir}"
}

# archive NAME TAG INPUT... prints the path of NAME's archive for the key of its inputs
# (besides this script, the name, the tag and umoci, which every archive has).
archive() {
	local name="$1" ref="$2" key
	shift 2
	key="$(printf '%s\n' "${script_sum}" "${name}" "${ref}" "$(umoci --version)" "$@" | hash)"
	echo "${images}/${name}-${key}/${name}-${ref}.tar"
}

# reuse ARCHIVE prints ARCHIVE and succeeds if it is built already.
reuse() {
	[[ -f "$1" ]] || return 1
	touch -c "$1" "$(dirname "$1")"
	log "$1 is built, not rebuilding"
	echo "$1"
}

# prune PREFIX KEEP removes the cached PREFIX-<key> entries other than KEEP that nobody
# used (touched) for a day, with their locks.
prune() {
	find "${images}" -mindepth 1 -maxdepth 1 -regextype posix-extended \
		-regex ".*/${1//./\\.}-[0-9a-f]{16}(\.lock)?" ! -path "$2" ! -path "$2.lock" -mtime +0 \
		-print -exec rm -rf {} + | sed 's/^/build-image: removed unused /' >&2
}

# pack ARCHIVE TAG ROOTFS_DIR ENTRYPOINT USER [CMD...] writes the OCI archive of one layer
# (ROOTFS_DIR) and prints its path.
pack() {
	local out="$1" ref="$2" dir="$3" entrypoint="$4" user="$5"
	shift 5
	local layout="${work}/layout"
	rm -rf "${layout}"
	umoci init --layout "${layout}"
	umoci new --image "${layout}:${ref}"
	umoci insert --image "${layout}:${ref}" "${dir}" /
	local args=(--image "${layout}:${ref}" --config.entrypoint "${entrypoint}"
		--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
	[[ -n "${user}" ]] && args+=(--config.user "${user}")
	for c in "$@"; do args+=(--config.cmd "${c}"); done
	umoci config "${args[@]}"
	umoci gc --layout "${layout}"
	mkdir -p "$(dirname "${out}")"
	tar -C "${layout}" -cf "${out}.tmp.$$" .
	mv -f "${out}.tmp.$$" "${out}"
	log "built ${out} ($(du -h "${out}" | cut -f1))"
	prune "$(basename "${out%-"${ref}".tar}")" "$(dirname "${out}")"
	echo "${out}"
}

# static NAME TAG BINARY ENTRY [CMD...]: an image of one static binary at /ENTRY.
static() {
	local name="$1" ref="$2" bin="$3" entry="$4" out
	shift 4
	out="$(archive "${name}" "${ref}" "$(sum "${bin}")")"
	reuse "${out}" && return
	local dir="${work}/${name}-root"
	mkdir -p "${dir}/$(dirname "${entry}")"
	cp "${bin}" "${dir}${entry}"
	pack "${out}" "${ref}" "${dir}" "${entry}" "" "$@"
}

# copyroot SRC DST: a writable copy of a cached root filesystem (hard links are not
# enough: setcap and new files must not reach the cache).
copyroot() {
	cp -a "$1" "$2"
}

# version_of BINARY prints the version in the path hack/build-apiserver.sh caches a binary
# at (<name>-<version>-<key>).
version_of() {
	local v="${1##*/}"
	v="${v%-*}"
	echo "${v##*-}"
}

build_shardproxy() {
	local bin base dir out
	bin="${work}/shardproxy"
	log "building shardproxy ${tag}"
	(cd "${root}" && CGO_ENABLED=0 ${go} build -trimpath -buildvcs=false \
		-ldflags "${shardproxy_ldflags}" -o "${bin}" ./cmd/shardproxy)
	out="$(archive shardproxy "${tag}" "$(rootfs_dir "${shardproxy_packages[@]}")" "$(sum "${bin}")")"
	reuse "${out}" && return
	base="$(rootfs "${shardproxy_packages[@]}")"
	dir="${work}/shardproxy-root"
	copyroot "${base}" "${dir}"
	cp "${bin}" "${dir}${shardproxy_entrypoint}"
	for bin in "${shardproxy_caps[@]}"; do
		setcap cap_net_admin=ep "${dir}${bin}"
	done
	pack "${out}" "${tag}" "${dir}" "${shardproxy_entrypoint}" "${shardproxy_user}"
}

build_agnhost() {
	local base dir bin ref out
	"${root}/hack/build-apiserver.sh" agnhost >&2
	bin="$("${root}/hack/build-apiserver.sh" --print-path agnhost)"
	ref="$(agnhost_version)"
	out="$(archive agnhost "${ref}" "$(rootfs_dir "${agnhost_packages[@]}")" "$(sum "${bin}")")"
	reuse "${out}" && return
	base="$(rootfs "${agnhost_packages[@]}")"
	dir="${work}/agnhost-root"
	copyroot "${base}" "${dir}"
	cp "${bin}" "${dir}/agnhost"
	pack "${out}" "${ref}" "${dir}" /agnhost "" pause
}

build_kube_proxy() {
	local base dir bin ref out
	"${root}/hack/build-apiserver.sh" --kube-proxy >&2
	bin="$("${root}/hack/build-apiserver.sh" --print-path kube-proxy)"
	ref="$(version_of "${bin}")"
	out="$(archive kube-proxy "${ref}" "$(rootfs_dir "${shardproxy_packages[@]}")" "$(sum "${bin}")")"
	reuse "${out}" && return
	base="$(rootfs "${shardproxy_packages[@]}")"
	dir="${work}/kube-proxy-root"
	copyroot "${base}" "${dir}"
	cp "${bin}" "${dir}/usr/local/bin/kube-proxy"
	pack "${out}" "${ref}" "${dir}" /usr/local/bin/kube-proxy ""
}

# agnhost_version is the agnhost tag upstream's e2e tests ask for (their image manifest
# in the k8s.io/kubernetes module: test/utils/image/manifest.go).
agnhost_version() {
	local mod
	mod="$(cd "${root}/hack/tools" && ${go} list -m -f '{{.Dir}}' k8s.io/kubernetes)"
	sed -n 's/.*configs\[Agnhost\] = Config{list.PromoterE2eRegistry, "agnhost", "\([^"]*\)"}.*/\1/p' \
		"${mod}/test/utils/image/manifest.go" | head -1
}

for name in "$@"; do
	case "${name}" in
	shardproxy) build_shardproxy ;;
	pause)
		(cd "${root}" && CGO_ENABLED=0 ${go} build -trimpath -ldflags "-s -w" -o "${work}/pause" ./hack/pause)
		static pause 3.10 "${work}/pause" /pause
		;;
	coredns)
		"${root}/hack/build-apiserver.sh" --dns >&2
		bin="$("${root}/hack/build-apiserver.sh" --print-path --dns)"
		static coredns "$(version_of "${bin}")" "${bin}" /coredns
		;;
	agnhost) build_agnhost ;;
	kube-proxy) build_kube_proxy ;;
	*)
		log "unknown image ${name} (shardproxy, pause, coredns, agnhost, kube-proxy)"
		exit 2
		;;
	esac
done
