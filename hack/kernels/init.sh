#!/bin/bash
# init.sh is /init in the initramfs hack/kernels.sh boots: PID 1 of a throwaway VM that
# runs the real-kernel test binaries against the kernel under test and powers off.
#
# The initramfs holds a Debian root file system (nft, conntrack, ip, iptables, kmod, the
# test2json converter), the kernel package's networking modules (modules.dep from
# depmod), and /repo: the compiled test binaries beside each package's testdata, laid
# out as in the repository so relative paths resolve. /repo/MANIFEST lists, one a line,
# "LANE IMPORT_PATH DIR BINARY [TEST FLAGS...]" (hack/kernels/tests.txt chose the tests).
# Each lane's binaries run one after another, the lanes side by side (the VM has two
# CPUs; one binary alone keeps about one of them busy under TCG), as go test -p 2 runs
# the host's real-kernel layer.
#
# Output: /dev/ttyS1 carries only test2json events (one stream for all packages), the
# console (/dev/ttyS0) carries progress and ends with
# "SHARDPROXY-GUEST-DONE status=N", N the number of test binaries that failed (the
# host reads it as go test's exit status). A kernel panic or a hang leaves no such line.
set -uo pipefail
if [[ $$ -ne 1 ]]; then
	echo "init.sh is /init of hack/kernels.sh's test VM (PID 1) and nothing else: it mounts, sets the hostname and powers off" >&2
	exit 1
fi
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TMPDIR=/tmp
# A missing tool or module in the guest is the image's fault, never a reason to skip.
export SHARDPROXY_CI=1
# Tests that walk long random sequences through nft shorten them (testutil.Steps).
export SHARDPROXY_EMULATED=1

log() { echo "guest: $*"; }

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /run /tmp
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
# The initramfs is the root file system: make its mounts shared, as systemd does, so
# `ip netns` bind mounts behave as on a node.
mount --make-rshared / 2>/dev/null
ln -sf /proc/self/fd /dev/fd
hostname guest
ip link set lo up

stty -F /dev/ttyS1 raw -echo 2>/dev/null
exec 3>/dev/ttyS1

log "kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2 / 1024 " MiB"}' /proc/meminfo)"

# The modules a node running shardproxy has loaded or autoloads; the rest load on
# demand (the kernel's request_module runs /sbin/modprobe, as on a node).
modules=(
	nf_tables nft_ct nft_nat nft_chain_nat nft_masq nft_numgen nft_hash nft_fib_inet
	nft_fib_ipv4 nft_fib_ipv6 nft_reject_inet nft_limit nft_objref nft_compat
	nf_conntrack nf_conntrack_netlink nf_nat nfnetlink veth dummy br_netfilter
)
modprobe_failed=0
for m in "${modules[@]}"; do
	if ! out="$(modprobe "${m}" 2>&1)"; then
		log "modprobe ${m}: ${out}"
		modprobe_failed=1
	fi
done
# Why (unknown symbols, a refused parameter) is in the kernel's log.
[[ ${modprobe_failed} -ne 0 ]] && dmesg | tail -20 | sed 's/^/guest: dmesg: /'
# br_netfilter sends bridged traffic through iptables; off as on a node without it.
sysctl -qw net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-ip6tables=0 2>/dev/null

set -f # the flags hold regular expressions: no globbing
# run_lane LANE runs the lane's binaries one after another and writes how many failed
# to /run/lane-LANE.failed. Every test2json event is one write(2) to the serial port, and
# a write to a tty is whole (the tty's write lock): the lanes' events interleave by line.
run_lane() {
	local lane="$1" failed=0 l pkg dir bin flags start status
	while read -r l pkg dir bin flags; do
		[[ -z "${l}" || "${l}" == \#* || "${l}" != "${lane}" ]] && continue
		start=$(date +%s)
		log "=== ${pkg} (lane ${lane})"
		# shellcheck disable=SC2086 # flags are words
		(cd "/repo/${dir}" && test2json -t -p "${pkg}" "./${bin}" -test.v=test2json ${flags}) >&3
		status=$?
		log "=== ${pkg} (lane ${lane}): exit ${status} in $(($(date +%s) - start))s"
		[[ ${status} -ne 0 ]] && failed=$((failed + 1))
	done </repo/MANIFEST
	echo "${failed}" >"/run/lane-${lane}.failed"
}
lanes="$(awk '$1 !~ /^#/ {print $1}' /repo/MANIFEST | sort -u)"
for lane in ${lanes}; do
	run_lane "${lane}" &
done
wait
failed=0
for lane in ${lanes}; do
	# A lane that wrote no count died: count it as a failure.
	failed=$((failed + $(cat "/run/lane-${lane}.failed" 2>/dev/null || echo 1)))
done

exec 3>&-
sync
echo "SHARDPROXY-GUEST-DONE status=${failed}"
# The line is in the tty's buffer, not yet out of the serial port: the kernel's own
# "sysrq: Power Off" goes out at once and cut it in two (5.10, on a loaded host).
sleep 2
# Power off (the host's qemu runs with -no-reboot: a panic ends it too).
echo o >/proc/sysrq-trigger
sleep 30
