#!/usr/bin/env bash
# release.sh builds the release of VERSION (`make release VERSION=v0.2.0`) from the commit
# ${REF:-HEAD} (exported with git archive: never the work tree's uncommitted changes)
# into ${OUT:-_output/release/VERSION}:
#
#   bin/shardproxy-linux-{amd64,arm64}  the binary, stamped with VERSION and the commit
#                                       (`shardproxy --version` prints both)
#   image/                              the image deploy/Dockerfile describes, as an OCI
#                                       layout whose index.json names VERSION: an image
#                                       index of a linux/amd64 and a linux/arm64 image
#   sbom.spdx.json                      SPDX 2.3: per architecture the image, the binary
#                                       and its Go modules, the Debian packages
#   shardproxy-<version>.tgz            the Helm chart, its image pinned to the digest
#   deploy/                             base, overlays, cleanup and monitoring, their
#                                       images pinned to the digest
#   SHA256SUMS                          every other file's sha256
#
# and checks the result (hack/release verify: both architectures in the index, each
# binary an ELF of its architecture reporting VERSION and the commit, under
# qemu-aarch64-static for arm64 here, the SBOM, the digests in the overlays and the
# chart, the sums). Offline but for Debian's mirror the first time: the root file
# systems (mmdebstrap, arm64 through qemu-user-static and binfmt_misc) are cached in
# ${SHARDPROXY_CACHE:-~/.cache/shardproxy}/release, keyed by suite, architecture,
# packages and mmdebstrap's version; Go builds with GOPROXY=off from the module cache.
# Every timestamp is the commit's (SOURCE_DATE_EPOCH), so the same commit and cached root
# file systems give the same digests. Root only (setcap, umoci's ownership).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${1:-${VERSION:-}}"
if [[ ! "${version}" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release: VERSION ${version:-(none)} is not vMAJOR.MINOR.PATCH[-PRE]" >&2
	exit 2
fi
out="${OUT:-${root}/_output/release/${version}}"
cache="${SHARDPROXY_CACHE:-${HOME}/.cache/shardproxy}/release"
go="${GO:-go}"
suite=bookworm
# deploy/Dockerfile's packages, entrypoint, user and capabilities (hack/build-image.sh's).
packages=(nftables conntrack iproute2 kmod iptables)
entrypoint=/usr/local/bin/shardproxy
user=65532:65532
caps=(/usr/local/bin/shardproxy /usr/sbin/nft)
arches=(amd64 arm64)

log() { echo "release: $*" >&2; }

for tool in mmdebstrap umoci setcap git; do
	if ! PATH="${PATH}:/usr/sbin:/sbin" command -v "${tool}" >/dev/null; then
		log "${tool} is missing: run hack/install-deps.sh"
		exit 1
	fi
done
if [[ "$(id -u)" != 0 ]]; then
	log "run as root (setcap, and umoci keeps the root file system's owners)"
	exit 1
fi

ref="${REF:-HEAD}"
commit="$(git -C "${root}" rev-parse --short=12 "${ref}^{commit}")"
created="$(git -C "${root}" log -1 --format=%cI "${commit}")"
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH="$(git -C "${root}" log -1 --format=%ct "${commit}")"
if [[ "${ref}" == HEAD ]] && ! git -C "${root}" diff --quiet HEAD; then
	log "the work tree has uncommitted changes: building commit ${commit} without them"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/shardproxy-release.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
src="${work}/src"
mkdir -p "${src}"
git -C "${root}" archive "${commit}" | tar -x -C "${src}"

# foreign ARCH makes sure this machine runs ARCH's binaries (mmdebstrap's maintainer
# scripts, the check of the binary): Debian's qemu-user-static, registered with binfmt_misc.
foreign() {
	[[ "$1" == "$(dpkg --print-architecture)" ]] && return
	if ! command -v qemu-aarch64-static >/dev/null || ! command -v arch-test >/dev/null; then
		log "installing qemu-user-static and arch-test (for $1)"
		apt-get install -y -q qemu-user-static arch-test >&2
	fi
	if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
		mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
	fi
	local name="qemu-${1/arm64/aarch64}"
	if [[ ! -e "/proc/sys/fs/binfmt_misc/${name}" ]]; then
		cat "/usr/lib/binfmt.d/${name}.conf" >/proc/sys/fs/binfmt_misc/register
	fi
	arch-test "$1" >&2
}

# rootfs ARCH prints the cached Debian root file system of ARCH with the packages.
rootfs() {
	local arch="$1" key dir
	key="$(printf '%s\n' "${suite}" "${arch}" "${packages[@]}" "$(mmdebstrap --version)" | sha256sum | cut -c1-16)"
	dir="${cache}/rootfs-${suite}-${arch}-${key}"
	if [[ ! -d "${dir}" ]]; then
		foreign "${arch}"
		log "mmdebstrap ${suite} ${arch} (once; cached in ${dir})"
		rm -rf "${dir}.tmp"
		mkdir -p "${cache}"
		mmdebstrap --quiet --variant=minbase --architectures="${arch}" --include="$(IFS=,; echo "${packages[*]}")" \
			--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
			--dpkgopt='path-exclude=/usr/share/locale/*' "${suite}" "${dir}.tmp" >&2
		rm -rf "${dir}.tmp/var/lib/apt/lists"/* "${dir}.tmp/var/cache/apt"/* "${dir}.tmp/var/log"/*
		mv "${dir}.tmp" "${dir}"
	fi
	echo "${dir}"
}

rm -rf "${out}"
mkdir -p "${out}/bin"
layouts=()
sbom_args=()
for arch in "${arches[@]}"; do
	bin="${out}/bin/shardproxy-linux-${arch}"
	log "building shardproxy ${version} (${commit}) for linux/${arch}"
	(cd "${src}" && GOPROXY=off GOFLAGS=-mod=readonly CGO_ENABLED=0 GOOS=linux GOARCH="${arch}" ${go} build -trimpath -buildvcs=false \
		-ldflags "-s -w -X main.version=${version} -X main.commit=${commit}" -o "${bin}" ./cmd/shardproxy)
	base="$(rootfs "${arch}")"
	dir="${work}/root-${arch}"
	cp -a "${base}" "${dir}"
	cp "${bin}" "${dir}${entrypoint}"
	for c in "${caps[@]}"; do
		setcap cap_net_admin=ep "${dir}${c}"
	done
	find "${dir}" -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +
	layout="${work}/layout-${arch}"
	umoci init --layout "${layout}"
	umoci new --image "${layout}:${version}"
	umoci insert --image "${layout}:${version}" --history.created "${created}" \
		--history.created_by "hack/release.sh: Debian ${suite} (${packages[*]}) and shardproxy ${version}" "${dir}" /
	umoci config --no-history --image "${layout}:${version}" --architecture "${arch}" --os linux --created "${created}" \
		--config.entrypoint "${entrypoint}" --config.user "${user}" \
		--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--config.label "org.opencontainers.image.version=${version}" --config.label "org.opencontainers.image.revision=${commit}" \
		--config.label "org.opencontainers.image.source=https://github.com/shardproxy/shardproxy"
	umoci gc --layout "${layout}"
	layouts+=("${arch}=${layout}")
	sbom_args+=("${arch}=${bin}:${base}")
done

(cd "${src}" && GOPROXY=off GOFLAGS=-mod=readonly ${go} build -o "${work}/release" ./hack/release)
digest="$("${work}/release" index -out "${out}/image" -ref "${version}" "${layouts[@]}")"
log "image index ${digest}"
"${work}/release" sbom -out "${out}/sbom.spdx.json" -version "${version}" -commit "${commit}" -created "${created}" "${sbom_args[@]}"
"${work}/release" pin -src "${src}/deploy" -out "${out}/deploy" -image ghcr.io/shardproxy/shardproxy -digest "${digest}"
"${work}/release" chart -src "${src}/deploy/helm/shardproxy" -out "${out}" -version "${version}" -digest "${digest}" >/dev/null
"${work}/release" sums -dir "${out}"
"${work}/release" verify -dir "${out}" -version "${version}" -commit "${commit}"
echo "${out}"
