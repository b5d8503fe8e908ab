#!/usr/bin/env bash
# kernels.sh is `make kernels`: the real-kernel test layer on Debian's own kernels, each
# booted in a QEMU VM, one LAYER line per kernel (through hack/testsum):
#
#   hack/kernels.sh [SERIES...]     SERIES: 5.10 (bullseye), 6.1 (bookworm), 6.12
#                                   (bookworm-backports); default $KERNELS or all three
#
# For each kernel series it takes the newest linux-image-<series>.*-amd64-unsigned that
# Debian serves (downloaded with apt-get through a private apt directory in the cache:
# the host's apt sources and state are not touched), boots its vmlinuz under TCG
# (software emulation: KVM guests hang at boot on these machines) with an initramfs of
#
#   a Debian bookworm root file system   mmdebstrap, the packages of ${rootfs_packages[*]}
#                                        (the tools the tests run: nft, conntrack, ip,
#                                        iptables, setcap), as the shardproxy image ships them
#   the package's networking modules     kernel/net, crypto and lib, a few drivers, with
#                                        their dependencies, depmod'ed
#   the test binaries                    `go test -c` of each package in
#                                        hack/kernels/tests.txt (the real-kernel layer's
#                                        packages and which of their tests touch the
#                                        kernel), beside their testdata, and test2json
#
# and hack/kernels/init.sh as /init, which runs each binary in CI mode (a missing tool
# fails, never skips) and streams test2json events back over a second serial port. The
# host summarizes them with testsum, as test.sh does for the host's kernel. What is
# cached (in ${SHARDPROXY_CACHE:-~/.cache/shardproxy}/kernels, keyed by a hash of its
# inputs, unused entries removed after a week): the root file system and its cpio, each
# kernel package's files and modules cpio, the apt lists (refreshed once a day; offline,
# the newest cached kernel of the series is used, with a warning).
#
# Environment:
#   KERNELS            comma-separated series when none are given (5.10,6.1,6.12)
#   KERNEL_PACKAGES    comma-separated package dirs of tests.txt to run (default: all)
#   KERNEL_RUN         a -test.run pattern for every package (default: tests.txt's)
#   KERNEL_SET=ci      tests.txt's smaller "ci" selection (make test's 6.1 layer)
#   KERNEL_LANES=1     every test binary one after another (default: tests.txt's "lane"
#                      packages each beside the rest, two at a time on the VM's 2 CPUs)
#   KERNEL_CEILING     the wall-time bound of one VM, boot to power-off (default 20m: the
#                      full set takes ~10 minutes on two idle cores and up to twice that
#                      beside other work; the TIME line says how long it took and the
#                      host's load average meanwhile; make test's layer sets 10m)
#   KERNEL_TIMEOUT     each test binary's -test.timeout in the guest (default the ceiling
#                      less 90 s, so that a test stuck in the guest dumps its goroutines
#                      before the VM is killed)
#   KERNEL_CPUS, KERNEL_MEMORY  the VM's (2, 3072 MiB)
#   KERNEL_KEEP=1      keep the per-run work directory (console log, JSON) and print it
#
# Fails loudly, never skips: qemu, mmdebstrap or a kernel package missing is a FAIL line.
# Exits non-zero unless every kernel's layer passed.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
go="${GO:-go}"
cache="${SHARDPROXY_CACHE:-${HOME}/.cache/shardproxy}/kernels"
export PATH="${PATH}:/usr/sbin:/sbin"

# The guest's user space: the shardproxy image's packages (deploy/Dockerfile) and what
# the tests run besides (setcap/getcap, sysctl; setpriv is in util-linux).
rootfs_packages=(nftables conntrack iproute2 kmod iptables libcap2-bin procps)
suite=bookworm

# series → the Debian suite that has it and the package name pattern (newest wins).
declare -A kernel_suite=([5.10]=bullseye [6.1]=bookworm [6.12]=bookworm-backports)
declare -A kernel_pattern=(
	[5.10]='^linux-image-5\.10\.0-[0-9]+-amd64-unsigned$'
	[6.1]='^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$'
	[6.12]='^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$'
)

log() { echo "kernels: $*" >&2; }
hash() { sha256sum | cut -c1-16; }
sum() { sha256sum <"$1" | cut -d' ' -f1; }
dur() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
# seconds DURATION: timeout(1)'s N, Ns or Nm in seconds.
seconds() {
	case "$1" in
	*m) echo $((${1%m} * 60)) ;;
	*s) echo "${1%s}" ;;
	*) echo "$1" ;;
	esac
}
load() { cut -d' ' -f1 /proc/loadavg; }

# prune PREFIX KEEP removes cached PREFIX* entries other than KEEP unused for a week.
prune() {
	find "${cache}" -mindepth 1 -maxdepth 1 -name "$1*" ! -path "$2" ! -path "$2.lock" -mtime +6 \
		-print -exec rm -rf {} + | sed 's/^/kernels: removed unused /' >&2
}

# rootfs_cpio prints the path of the cached root file system's cpio, building it once.
rootfs_cpio() {
	local key dir
	# The key: this function's own text (the recipe), the suite, the packages, mmdebstrap.
	key="$(printf '%s\n' "$(declare -f rootfs_cpio)" "${suite}" "${rootfs_packages[@]}" "$(mmdebstrap --version)" | hash)"
	dir="${cache}/rootfs-${suite}-${key}"
	exec 8>"${dir}.lock"
	flock 8
	if [[ ! -f "${dir}/rootfs.cpio" ]]; then
		log "mmdebstrap ${suite} with ${rootfs_packages[*]} (once; cached in ${dir})"
		rm -rf "${dir}"
		mkdir -p "${dir}"
		local include
		include="$(
			IFS=,
			echo "${rootfs_packages[*]}"
		)"
		if ! mmdebstrap --quiet --variant=minbase --include="${include}" \
			--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
			--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
			"${suite}" "${dir}/root" >&2; then
			rm -rf "${dir}"
			exec 8>&-
			return 1
		fi
		rm -rf "${dir}/root/var/lib/apt/lists"/* "${dir}/root/var/cache"/* "${dir}/root/var/log"/*
		printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"${dir}/root/etc/hosts"
		(cd "${dir}/root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc) >"${dir}/rootfs.cpio.tmp" &&
			mv "${dir}/rootfs.cpio.tmp" "${dir}/rootfs.cpio"
		rm -rf "${dir}/root"
		prune "rootfs-${suite}-" "${dir}"
	fi
	touch -c "${dir}"
	exec 8>&-
	[[ -f "${dir}/rootfs.cpio" ]] && echo "${dir}/rootfs.cpio"
}

# apt_private runs apt-get or apt-cache (first argument) against the private apt
# directory: the host's mirror, the suites the kernels come from, nothing installed.
apt_private() {
	local tool="$1"
	shift
	"${tool}" -o Dir::Etc::sourcelist="${cache}/apt/sources.list" -o Dir::Etc::sourceparts=- \
		-o Dir::State::Lists="${cache}/apt/lists" -o Dir::Cache="${cache}/apt/cache" \
		-o Dir::State::status=/dev/null -o Debug::NoLocking=1 -o APT::Sandbox::User=root \
		-o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
		-o Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false "$@"
}

# apt_lists refreshes the private apt lists when they are older than a day. The mirror
# is the host's (its apt sources); bullseye's updates come from its security suite.
apt_lists() {
	mkdir -p "${cache}/apt/lists/partial" "${cache}/apt/cache/archives/partial"
	local stamp="${cache}/apt/updated"
	[[ -f "${stamp}" && -n "$(find "${stamp}" -mmin -1440)" ]] && return 0
	local mirror keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)"
	[[ -z "${mirror}" ]] && mirror="$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)"
	if [[ -z "${mirror}" ]]; then
		log "no Debian mirror in the host's apt sources"
		return 1
	fi
	cat >"${cache}/apt/sources.list" <<-EOF
		deb [signed-by=${keyring}] ${mirror} bookworm main
		deb [signed-by=${keyring}] ${mirror} bookworm-backports main
		deb [signed-by=${keyring}] ${mirror} bullseye main
		deb [signed-by=${keyring}] ${mirror%/debian}/debian-security bullseye-security main
	EOF
	log "apt-get update (private lists in ${cache}/apt)"
	if apt_private apt-get update -qq >&2; then
		touch "${stamp}"
	else
		log "apt-get update failed: using the lists (and kernels) already cached"
	fi
}

# kernel_dir SERIES prints the directory holding the series' vmlinuz and modules.cpio,
# downloading and preparing the newest package once.
kernel_dir() {
	local series="$1" pkg version dir deb
	apt_lists
	pkg="$(apt_private apt-cache search --names-only "${kernel_pattern[${series}]}" 2>/dev/null | cut -d' ' -f1 | sort -V | tail -1)"
	if [[ -z "${pkg}" ]]; then
		dir="$(find "${cache}" -mindepth 1 -maxdepth 1 -name "kernel-${series}.*" -exec test -f '{}/modules.cpio' ';' -print 2>/dev/null | sort -V | tail -1)"
		if [[ -n "${dir}" ]]; then
			log "no ${series} package in the apt lists: using the cached ${dir##*/}"
			touch -c "${dir}"
			echo "${dir}"
			return 0
		fi
		log "no package matches ${kernel_pattern[${series}]} in ${kernel_suite[${series}]} (and none cached)"
		return 1
	fi
	version="$(apt_private apt-cache show "${pkg}" 2>/dev/null | awk '/^Version:/ {print $2; exit}')"
	# The key: the package and version, and the recipe (these functions' text).
	dir="${cache}/kernel-${pkg#linux-image-}_${version}-$(declare -f kernel_dir modules_cpio | hash)"
	exec 8>"${dir}.lock"
	flock 8
	if [[ ! -f "${dir}/modules.cpio" ]]; then
		log "downloading ${pkg} ${version} (once; cached in ${dir})"
		rm -rf "${dir}"
		mkdir -p "${dir}/deb" "${dir}/x"
		if ! (cd "${dir}/deb" && apt_private apt-get download -qq "${pkg}=${version}" >&2); then
			log "apt-get download ${pkg}=${version} failed"
			rm -rf "${dir}"
			exec 8>&-
			return 1
		fi
		deb="$(ls "${dir}"/deb/*.deb)"
		dpkg-deb -x "${deb}" "${dir}/x"
		local kver
		kver="$(ls "${dir}/x/lib/modules")"
		cp "${dir}/x/boot/vmlinuz-${kver}" "${dir}/vmlinuz"
		cp "${dir}/x/boot/config-${kver}" "${dir}/config"
		echo "${pkg} ${version} ${kver}" >"${dir}/release"
		modules_cpio "${dir}" "${kver}" || {
			rm -rf "${dir}"
			exec 8>&-
			return 1
		}
		rm -rf "${dir}/deb" "${dir}/x"
		prune "kernel-${series}." "${dir}"
	fi
	touch -c "${dir}"
	exec 8>&-
	echo "${dir}"
}

# modules_cpio DIR KVER writes DIR/modules.cpio: the networking modules of the package
# extracted in DIR/x (kernel/net, veth, dummy, the virtio RNG) and everything they depend
# on, with depmod's indexes for that subset; and kernel/crypto and kernel/lib whole: a
# module's crypto (libcrc32c's crc32c, which nf_tables and nf_conntrack need) is loaded by
# name at run time, a dependency modules.dep does not list.
modules_cpio() {
	local dir="$1" kver="$2" x="$1/x" m="$1/m"
	depmod -b "${x}" "${kver}" || return 1
	local mods="${x}/lib/modules/${kver}"
	local wanted
	wanted="$(awk -F: '
		{ deps[$1] = $2; all[NR] = $1 }
		END {
			for (i = 1; i <= NR; i++) {
				p = all[i]
				if (p ~ /^kernel\/(net|crypto|lib|arch\/x86\/crypto)\// || p ~ /^kernel\/drivers\/net\/(veth|dummy)\.ko/ ||
					p ~ /^kernel\/drivers\/char\/hw_random\/virtio-rng\.ko/ || p ~ /^kernel\/drivers\/virtio\//) {
					want[p] = 1
					n = split(deps[p], d, " ")
					for (j = 1; j <= n; j++) want[d[j]] = 1
				}
			}
			for (p in want) print p
		}' "${mods}/modules.dep")"
	mkdir -p "${m}/lib/modules/${kver}"
	(cd "${mods}" && cpio --quiet -pdm "${m}/lib/modules/${kver}" <<<"${wanted}") || return 1
	cp "${mods}"/modules.builtin* "${mods}/modules.order" "${m}/lib/modules/${kver}/"
	depmod -b "${m}" "${kver}" || return 1
	# Under usr/: the root file system's /lib is a symlink (merged /usr), and the kernel
	# replaces an existing entry of another type (a directory "lib" would remove it).
	mkdir -p "${m}/usr/lib"
	mv "${m}/lib/modules" "${m}/usr/lib/modules"
	rmdir "${m}/lib"
	(cd "${m}" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"${dir}/modules.cpio"
	rm -rf "${m}"
	log "${kver}: $(wc -l <<<"${wanted}") modules"
}

# tests_cpio WORK prints WORK/tests.cpio: /repo with the test binaries, the repository's
# testdata, the MANIFEST, /init and test2json. The binaries are built once for all kernels.
tests_cpio() {
	local work="$1" t="$1/tests"
	mkdir -p "${t}/repo" "${t}/usr/local/bin"
	cp "${root}/hack/kernels/init.sh" "${t}/init"
	chmod 755 "${t}/init"
	cp "$(${go} env GOTOOLDIR)/test2json" "${t}/usr/local/bin/test2json" 2>/dev/null ||
		${go} build -o "${t}/usr/local/bin/test2json" cmd/test2json || return 1
	(cd "${root}" && git ls-files -z -- '*testdata/*' | cpio --quiet -0 -pdm "${t}/repo") || return 1
	# tests.txt: DIR RUN [SKIP] a line; KERNEL_PACKAGES picks some of its packages,
	# KERNEL_RUN replaces every RUN (and drops SKIP).
	# With KERNEL_SET=ci (make test's kernel-6.1 layer), a "ci DIR RUN [SKIP]" line
	# replaces DIR's RUN and SKIP, and "ci DIR none" leaves DIR out. A "lane DIR" line
	# runs DIR's binary in a lane of its own, beside the lane that runs the others one
	# after another (KERNEL_LANES=1: every binary in one lane); "lane DIR SHARED" keeps
	# DIR's selected tests that SHARED matches in the shared lane (the binary runs twice,
	# each time with its share of the tests), so that the two lanes end at about the
	# same time.
	local word dir run skip name ip flags lane own shared
	local base="-test.count=1 -test.timeout=${test_timeout}"
	declare -A ci_run=() ci_skip=() own_lane=() lane_shared=()
	while read -r word dir run skip; do
		if [[ "${word}" == ci ]]; then
			ci_run[${dir}]="${run}"
			ci_skip[${dir}]="${skip}"
		fi
		if [[ "${word}" == lane && "${KERNEL_LANES:-}" != 1 ]]; then
			own_lane[${dir}]=$((${#own_lane[@]} + 1))
			lane_shared[${dir}]="${run}"
		fi
	done <"${root}/hack/kernels/tests.txt"
	: >"${t}/repo/MANIFEST"
	while read -r dir run skip; do
		[[ -z "${dir}" || "${dir}" == \#* || "${dir}" == ci || "${dir}" == lane ]] && continue
		if [[ "${KERNEL_SET:-}" == ci && -n "${ci_run[${dir}]:-}" ]]; then
			[[ "${ci_run[${dir}]}" == none ]] && continue
			run="${ci_run[${dir}]}"
			skip="${ci_skip[${dir}]}"
		fi
		if [[ -n "${KERNEL_PACKAGES:-}" && ",${KERNEL_PACKAGES}," != *",${dir},"* ]]; then
			continue
		fi
		ip="$(cd "${root}" && ${go} list "./${dir}")" || return 1
		name="$(basename "${dir}").test"
		flags="${base} -test.run=${KERNEL_RUN:-${run}}"
		[[ -n "${skip}" && -z "${KERNEL_RUN:-}" ]] && flags+=" -test.skip=${skip}"
		mkdir -p "${t}/repo/${dir}"
		log "go test -c ${ip}"
		(cd "${root}" && ${go} test -c -ldflags="-s -w" -o "${t}/repo/${dir}/${name}" "./${dir}") >&2 || return 1
		lane="${own_lane[${dir}]:-0}"
		if [[ ${lane} != 0 && -n "${lane_shared[${dir}]:-}" && -z "${KERNEL_RUN:-}" ]]; then
			split_lanes "${t}/repo/${dir}/${name}" "${run}" "${lane_shared[${dir}]}" || return 1
			if [[ -n "${shared}" ]]; then
				echo "0 ${ip} ${dir} ${name} ${base} -test.run=${shared}${skip:+ -test.skip=${skip}}" >>"${t}/repo/MANIFEST"
				flags="${base} -test.run=${own}${skip:+ -test.skip=${skip}}"
			fi
		fi
		echo "${lane} ${ip} ${dir} ${name} ${flags}" >>"${t}/repo/MANIFEST"
	done <"${root}/hack/kernels/tests.txt"
	if [[ ! -s "${t}/repo/MANIFEST" ]]; then
		log "no package of hack/kernels/tests.txt selected (KERNEL_PACKAGES=${KERNEL_PACKAGES:-})"
		return 1
	fi
	(cd "${t}" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"${work}/tests.cpio" || return 1
	echo "${work}/tests.cpio"
}

# split_lanes BIN RUN SHARED sets own and shared to -test.run patterns naming BIN's tests
# one by one: shared those of RUN's selection that SHARED matches, own the rest of it
# (shared empty when SHARED matches none of them). The names come from the binary itself
# (-test.list, which runs no test), so a test renamed or added to RUN lands in exactly one
# of the two runs; RUN must select top-level tests only (no "/").
split_lanes() {
	local bin="$1" run="$2" pattern="$3" all mine n
	if [[ "${run}" == */* ]]; then
		log "tests.txt: lane ${bin##*/}: RUN ${run} selects subtests; a lane's share needs top-level tests"
		return 1
	fi
	all="$("${bin}" -test.list "${run}" | grep -v '^Benchmark')" || {
		log "${bin##*/} -test.list ${run} failed"
		return 1
	}
	mine="$("${bin}" -test.list "${pattern}" | grep -v '^Benchmark')"
	shared="$(grep -Fxf <(echo "${mine}") <<<"${all}" | paste -sd'|')"
	own="$(grep -vFxf <(echo "${mine}") <<<"${all}" | paste -sd'|')"
	n="$(grep -c . <<<"${all}")"
	if [[ -z "${own}" ]]; then
		log "tests.txt: lane ${bin##*/}: SHARED ${pattern} takes every selected test (${n}): nothing left for its own lane"
		return 1
	fi
	[[ -n "${shared}" ]] && shared="^(${shared})\$"
	own="^(${own})\$"
}

# boot SERIES KDIR OUT: boots the kernel in KDIR with the tests, writing the guest's
# test2json stream to stdout as it comes, the console to OUT/console.log, and then go
# test's stand-in exit status to OUT/status and any failure to say to OUT/stderr.
boot() {
	local series="$1" kdir="$2" out="$3" release start status sampler
	release="$(cat "${kdir}/release")"
	cat "${rootfs}" "${kdir}/modules.cpio" "${tests}" >"${out}/initrd"
	log "kernel-${series}: booting ${release} under TCG (ceiling ${ceiling})"
	start=$(date +%s)
	# The host's load average every 30 s: TCG's speed is the host's spare CPU. (read's
	# timeout on a FIFO nobody writes is the wait: no sleep child outlives the kill.)
	mkfifo "${out}/tick"
	(while true; do
		load
		read -rt 30 <>"${out}/tick" || true
	done) >"${out}/loads" &
	sampler=$!
	timeout --kill-after=10s "${ceiling}" qemu-system-x86_64 -accel tcg -cpu max \
		-smp "${KERNEL_CPUS:-2}" -m "${KERNEL_MEMORY:-3072}" -nodefaults -no-reboot \
		-display none -monitor none -device virtio-rng-pci \
		-serial "file:${out}/console.log" -serial file:/dev/stdout \
		-kernel "${kdir}/vmlinuz" -initrd "${out}/initrd" \
		-append "console=ttyS0 panic=-1 oops=panic loglevel=4 random.trust_cpu=on rdinit=/init" \
		2>"${out}/qemu.log"
	status=$?
	kill "${sampler}"
	rm -f "${out}/initrd"
	local done_line
	# A kernel message written to the console can land inside the line (perl takes
	# such "[   1.234567] ..." messages out wherever they begin).
	done_line="$(tr -d '\r' <"${out}/console.log" | perl -pe 's/\[ *\d+\.\d+\] .*\n//' |
		grep -a '^SHARDPROXY-GUEST-DONE status=' | tail -1)"
	grep -a '^guest: ' "${out}/console.log" | tr -d '\r' >&2
	if [[ ${status} -eq 124 || ${status} -eq 137 ]]; then
		echo "kernels: ${release}: the VM ran past its ceiling of ${ceiling} under TCG; the console's end:" >"${out}/stderr"
		tail -20 "${out}/console.log" | tr -d '\r' >>"${out}/stderr"
	elif [[ -z "${done_line}" ]]; then
		echo "kernels: ${release}: the guest stopped before its tests finished (qemu exit ${status}); the console's end:" >"${out}/stderr"
		tail -30 "${out}/console.log" | tr -d '\r' >>"${out}/stderr"
		cat "${out}/qemu.log" >>"${out}/stderr"
	else
		echo "${done_line#*status=}" >"${out}/status"
	fi
	awk '{ s += $1; if ($1 > m) m = $1 } END { if (NR) printf "%.1f mean, %.1f max", s / NR, m }' "${out}/loads" >"${out}/load"
	log "kernel-${series}: ${release}: the VM ran $(dur $(($(date +%s) - start))) (the host's load average $(cat "${out}/load") on $(nproc) cores)"
}

# run_kernel SERIES: boots the series' kernel with the tests and adds its LAYER line.
run_kernel() {
	local series="$1" name="kernel-$1" start out kdir="" line ok
	start=$(date +%s)
	out="${work}/${name}"
	mkdir -p "${out}"
	echo 1 >"${out}/status"
	: >"${out}/stderr"
	{
		if [[ -z "${kernel_suite[${series}]:-}" ]]; then
			echo "kernels: unknown kernel series ${series} (${!kernel_suite[*]})" >"${out}/stderr"
		elif ! kdir="$(kernel_dir "${series}")"; then
			echo "kernels: no Debian ${series} kernel package could be had (see above)" >"${out}/stderr"
		else
			cp "${kdir}/release" "${out}/release"
			boot "${series}" "${kdir}" "${out}"
		fi
	} | tr -d '\r' | tee "${out}/guest.json" |
		"${root}/bin/testsum" -layer "${name}" -go-status "${out}/status" -stderr "${out}/stderr" >"${out}/summary"
	ok=${PIPESTATUS[3]}
	grep -v '^LAYER ' "${out}/summary"
	line="$(grep '^LAYER ' "${out}/summary")"
	[[ -f "${out}/release" ]] && line+=" [Debian $(cut -d' ' -f1,2 "${out}/release")]"
	summary+=("${line}")
	[[ ${ok} -ne 0 ]] && rc=1
	local took="${name} $(dur $(($(date +%s) - start)))"
	[[ -f "${out}/load" ]] && took+=" (host load $(cat "${out}/load"))"
	times+=("${took}")
}

series_list=("$@")
if [[ ${#series_list[@]} -eq 0 ]]; then
	IFS=, read -r -a series_list <<<"${KERNELS:-5.10,6.1,6.12}"
fi

ceiling="${KERNEL_CEILING:-20m}"
if ! [[ "$(seconds "${ceiling}")" =~ ^[0-9]+$ ]] || [[ "$(seconds "${ceiling}")" -le 120 ]]; then
	echo "kernels: KERNEL_CEILING=${ceiling}: want N, Ns or Nm, over 2 minutes" >&2
	exit 2
fi
test_timeout="${KERNEL_TIMEOUT:-$(($(seconds "${ceiling}") - 90))s}"

rc=0
summary=()
times=()
total_start=$(date +%s)

missing=()
for tool in qemu-system-x86_64 mmdebstrap cpio depmod dpkg-deb apt-get; do
	command -v "${tool}" >/dev/null || missing+=("${tool}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	for series in "${series_list[@]}"; do
		printf 'LAYER %-12s FAIL: %s missing (hack/install-deps.sh installs it)\n' "kernel-${series}" "${missing[*]}"
	done
	exit 1
fi

mkdir -p "${cache}"
work="$(mktemp -d "${TMPDIR:-/tmp}/shardproxy-kernels.XXXXXX")"
if [[ -n "${KERNEL_KEEP:-}" ]]; then
	log "keeping ${work}"
else
	trap 'rm -rf "${work}"' EXIT
fi

fatal=""
${go} build -o "${root}/bin/testsum" ./hack/testsum || fatal="building hack/testsum failed"
[[ -z "${fatal}" ]] && { rootfs="$(rootfs_cpio)" || fatal="mmdebstrap of the guest's root file system failed (see above)"; }
[[ -z "${fatal}" ]] && { tests="$(tests_cpio "${work}")" || fatal="building the test binaries failed (see above)"; }
if [[ -n "${fatal}" ]]; then
	for series in "${series_list[@]}"; do
		printf 'LAYER %-12s FAIL: %s\n' "kernel-${series}" "${fatal}"
	done
	exit 1
fi

for series in "${series_list[@]}"; do
	run_kernel "${series}"
done

echo
printf '%s\n' "${summary[@]}"
echo "TIME $(printf '%s; ' "${times[@]}")total $(dur $(($(date +%s) - total_start)))"
exit ${rc}
