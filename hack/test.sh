#!/usr/bin/env bash
# test.sh is `make test`: it installs and builds what the tests need, then runs every
# test layer and prints one summary line per layer ("LAYER ..."), the wall time of every
# stage, and a closing total:
#
#   setup        hack/install-deps.sh, the Kubernetes binaries (hack/build-apiserver.sh,
#                cached in ~/.cache/shardproxy), Helm (hack/build-helm.sh, same cache),
#                go vet, testsum (one-time builds included)
#   unit         packages that need nothing but Go (fakes, golden rulesets, packet tracer)
#   real-kernel  packages whose tests load rules with the real nft into network namespaces
#                and send real traffic (their unit tests run here too)
#   kernel-6.1   the kernel tests of those packages on Debian 12's 6.1 kernel in a QEMU VM
#                (hack/kernels.sh; `make kernels` runs the 5.10/6.1/6.12 matrix)
#   integration  packages whose tests talk to a real etcd + kube-apiserver
#   e2e          the real `shardproxy run` binary on a control plane + node namespaces
#   cluster      two real dual-stack nodes (containerd, kubelet, CoreDNS; CLUSTER_NODES for
#                more) running deploy/'s overlays with the image built from the repository
#                (test/cluster)
#   soak         hack/soak.sh for 2 minutes: churn and every kind of fault once, the
#                kernel checked against render at checkpoints
#   fuzz         the fuzz targets (config decoder, Service model), briefly
#   demo         `make demo --once`: the README's main job, end to end
#
# Every layer prints exactly one LAYER line: ok only when it ran tests and all passed
# (hack/testsum reads go test's exit status and stderr too), FAIL otherwise, SKIPPED
# when SKIP_<LAYER>=1 asked (SKIP_REAL_KERNEL, SKIP_SOAK, ...; .ci/run fails on any
# SKIPPED line). Every layer runs under a ceiling (coreutils timeout, the whole process
# group) below its share of CI's 90 minutes; go test's own -timeout per package is at
# least as long as the longest context a test of the layer sets itself, so a test that
# runs out of its context fails and cleans up before go test would panic.
#
# Every package lands in exactly one layer: anything not listed as kernel, integration,
# e2e or cluster is unit. Root is required (CI is root). Exits non-zero if any stage
# failed, after running them all.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
go="${GO:-go}"
flags=(-count=1)

if [[ $(id -u) -ne 0 ]]; then
	echo "test.sh: make test runs as root (network namespaces, nftables, a kubelet); CI is root" >&2
	exit 1
fi

total_start=$(date +%s)
summary=()
times=()
rc=0

# dur SECONDS prints a duration as 1m02s.
dur() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# timed NAME COMMAND...: runs a set-up step, records its wall time.
timed() {
	local name="$1" start status
	shift
	echo "=== stage ${name}: $*"
	start=$(date +%s)
	"$@"
	status=$?
	times+=("${name} $(dur $(($(date +%s) - start)))")
	if [[ ${status} -ne 0 ]]; then
		echo "=== stage ${name} FAILED (exit ${status})"
		summary+=("$(printf 'LAYER %-12s FAIL: exited %d' "${name}" "${status}")")
	fi
	return ${status}
}

# skipped NAME: true (and a SKIPPED line) when SKIP_<NAME>=1 asks to leave the layer out.
skipped() {
	local var
	var="SKIP_$(tr 'a-z.-' 'A-Z__' <<<"$1")"
	if [[ -n "${!var:-}" ]]; then
		summary+=("$(printf 'LAYER %-12s SKIPPED (%s=%s)' "$1" "${var}" "${!var}")")
		times+=("$1 skipped")
		return 0
	fi
	return 1
}

# golayer NAME CEILING TIMEOUT PARALLEL [GO FLAGS --] PACKAGES...: one go test run of the
# layer's packages, summarized by testsum. CEILING bounds the whole layer; TIMEOUT is go
# test's -timeout (per package).
golayer() {
	local name="$1" ceiling="$2" timeout="$3" parallel="$4"
	shift 4
	local extra=()
	if [[ " $* " == *" -- "* ]]; then
		while [[ "$1" != "--" ]]; do
			extra+=("$1")
			shift
		done
		shift
	fi
	skipped "${name}" && return
	if [[ $# -eq 0 ]]; then
		summary+=("$(printf 'LAYER %-12s FAIL: no packages in this layer (hack/layers.sh)' "${name}")")
		rc=1
		return
	fi
	echo "=== layer ${name} (ceiling ${ceiling}, go test -timeout ${timeout} ${extra[*]}): $*" | tr '\n' ' '
	echo
	local out err status start line
	out="$(mktemp)" err="$(mktemp)" status="$(mktemp)"
	start=$(date +%s)
	{
		timeout --kill-after=1m "${ceiling}" ${go} test "${flags[@]}" "${extra[@]}" -p "${parallel}" -json -timeout "${timeout}" "$@" 2>"${err}"
		echo $? >"${status}"
	} | "${root}/bin/testsum" -layer "${name}" -go-status "${status}" -stderr "${err}" | tee "${out}"
	[[ ${PIPESTATUS[1]} -ne 0 ]] && rc=1
	line="$(grep '^LAYER ' "${out}")"
	if [[ "$(cat "${status}")" == 124 || "$(cat "${status}")" == 137 ]]; then
		line+=" (the layer's ceiling of ${ceiling} ran out)"
	fi
	summary+=("${line}")
	times+=("${name} $(dur $(($(date +%s) - start)))")
	rm -f "${out}" "${err}" "${status}"
}

# The one-time builds (minutes on a fresh machine, seconds after) are stages of their
# own, so a layer's time is its tests' and the cold cost is visible.
setup_ok=true
timed deps hack/install-deps.sh || setup_ok=false
${setup_ok} && { timed builds hack/build-apiserver.sh --all --node --dns --conformance --kubemark || setup_ok=false; }
${setup_ok} && { timed helm hack/build-helm.sh || setup_ok=false; }
${setup_ok} && { timed vet ${go} vet ./... || setup_ok=false; }
${setup_ok} && { timed testsum ${go} build -o "${root}/bin/testsum" ./hack/testsum || setup_ok=false; }
if ! ${setup_ok}; then
	echo
	printf '%s\n' "${summary[@]}"
	echo "TIME $(printf '%s; ' "${times[@]}")total $(dur $(($(date +%s) - total_start)))"
	exit 1
fi

source "${root}/hack/layers.sh"

# The unit and integration layers run under the race detector: the dispatcher,
# supervisor, health servers and conntrack sweeper are concurrent (on this 2-core machine
# -race adds ~45 s to the two with a warm build cache; the kernel layer's tables package
# alone would take 3+ minutes under it, so that layer runs without).
golayer unit 10m 8m 2 -race -- ${unit}
# The tests this host's kernel cannot run are left out by name (hack/layers.sh's
# kernel_skip, with the reasons): the kernel-6.1 layer runs them.
golayer real-kernel 10m 8m 2 -skip "${kernel_skip}" -- ${kernel}
# kernel-6.1: the real-kernel layer's kernel tests again on Debian 12's kernel, the most
# deployed, in a QEMU VM under software emulation (hack/kernels.sh; hack/kernels/tests.txt's
# "ci" selection; `make kernels` runs more, on 5.10, 6.1 and 6.12). The VM's own ceiling
# is KERNEL_CEILING; this one covers the one-time root file system and kernel download.
if ! skipped kernel-6.1; then
	echo "=== layer kernel-6.1: hack/kernels.sh 6.1"
	start=$(date +%s)
	out="$(mktemp)"
	KERNEL_SET=ci KERNEL_CEILING="${KERNEL_CEILING:-10m}" timeout --kill-after=1m 14m hack/kernels.sh 6.1 | tee "${out}"
	status=${PIPESTATUS[0]}
	line="$(grep '^LAYER kernel-6.1 ' "${out}")"
	[[ -z "${line}" ]] && line="$(printf 'LAYER %-12s FAIL: hack/kernels.sh exited %d with no LAYER line' kernel-6.1 "${status}")"
	[[ ${status} -eq 124 || ${status} -eq 137 ]] && line+=" (the layer's ceiling of 14m ran out)"
	[[ ${status} -ne 0 ]] && rc=1
	summary+=("${line}")
	times+=("kernel-6.1 $(dur $(($(date +%s) - start)))")
	rm -f "${out}"
fi
golayer integration 8m 6m 2 -race -- ${integration}
# The e2e packages run one at a time: their scenarios count failed connections during
# restarts and handovers, and two environments on two cores would skew the timing.
golayer e2e 16m 12m 1 ${e2e}
# The cluster layer runs alone for the same reason. Its -timeout covers the cluster's
# start (TestMain: 15m at most, ~3m warm), the tests before TestConformance (~8m) and
# TestConformance's own context (24m in CI, test/cluster/upstream_test.go), so that
# even a conformance run that hangs ends in the test's own failure and teardown.
golayer cluster 38m 36m 1 ${cluster}
# A cluster layer cut off by its ceiling or go test's -timeout dies before its
# teardown: tear down whatever node it left (a no-op when it cleaned up itself).
timed cluster-teardown ${go} run ./test/cluster/cmd/cluster-teardown || rc=1

# soak: the short soak, every fault kind once (make soak runs the long one).
if ! skipped soak; then
	echo "=== layer soak: hack/soak.sh for ${soak_ci_duration}"
	start=$(date +%s)
	out="$(mktemp)"
	SOAK_DURATION="${soak_ci_duration}" timeout --kill-after=1m 8m hack/soak.sh 2>&1 | tee "${out}" | grep -E '^SOAK|fault|checkpoint|soak: (seed|could not)'
	status=${PIPESTATUS[0]}
	detail="$(grep -E '^SOAK (checkpoints|steady connections|full syncs|faults injected):' "${out}" | sed 's/^SOAK //' | tr '\n' ';')"
	if [[ ${status} -eq 0 ]] && grep -q '^SOAK checkpoints:' "${out}"; then
		summary+=("LAYER soak         ok: ${detail} $(($(date +%s) - start))s")
	else
		echo "=== soak failed (exit ${status}); the end of its output:"
		tail -80 "${out}"
		why=""
		[[ ${status} -eq 124 || ${status} -eq 137 ]] && why="(the layer's ceiling of 8m ran out) "
		summary+=("LAYER soak         FAIL: ${why}$(grep -E '^soak: (seed|could not)' "${out}" | head -2 | tr '\n' ' ')${detail} $(($(date +%s) - start))s")
		rc=1
	fi
	times+=("soak $(dur $(($(date +%s) - start)))")
	rm -f "${out}"
fi

# fuzz: each fuzz target briefly, beyond its seed corpus (which the unit layer runs), for
# a number of executions (10–20 s each on a 2-core CI machine), not a duration: Go
# before 1.27 can fail a duration-bounded run with "context deadline exceeded" when the
# deadline meets a busy worker (golang/go#75804), a failure with no input behind it.
# FUZZTIME overrides both counts (a count "Nx" or a duration).
# Minimizing is bounded by a count too (FUZZMINIMIZE, default 10000x): go test's own
# bound is 60 s and, under a -fuzztime count, half the run's executions per new
# interesting input; those executions count toward -fuzztime, and the budget a
# minimization holds can leave the other worker idle (a run stalled 20 s at 212530 of
# 250000). FuzzDecode from the same corpus, one run each beside a conformance run:
# CPU 70.5 s with go test's bound, 34.0 s with 10000x, which found 51 new inputs
# against 30.
if ! skipped fuzz; then
	fuzz_start=$(date +%s)
	fuzz_ok=0
	fuzz_failed=()
	for target in "./supervisor/config FuzzDecode 250000x" "./instance/modelfuzz FuzzBuild 70000x"; do
		set -- ${target}
		fuzztime="${FUZZTIME:-$3}"
		echo "=== layer fuzz: $2 in $1 for ${fuzztime}"
		if ${go} test -run '^$' -fuzz "^$2\$" -fuzztime "${fuzztime}" -fuzzminimizetime "${FUZZMINIMIZE:-10000x}" -timeout 3m "$1" 2>&1 | tail -5; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
			fuzz_ok=$((fuzz_ok + 1))
		else
			fuzz_failed+=("$2")
			rc=1
		fi
	done
	if [[ ${#fuzz_failed[@]} -eq 0 ]]; then
		summary+=("LAYER fuzz         ok: ${fuzz_ok} targets fuzzed (${FUZZTIME:-250000 and 70000 executions}), no failure, $(($(date +%s) - fuzz_start))s")
	else
		summary+=("LAYER fuzz         FAIL: ${fuzz_failed[*]} failed (a failing input is in testdata/fuzz, or go test -timeout 3m ran out), $(($(date +%s) - fuzz_start))s")
	fi
	times+=("fuzz $(dur $(($(date +%s) - fuzz_start)))")
fi

if ! skipped demo; then
	echo "=== layer demo: make demo --once"
	start=$(date +%s)
	if timeout --kill-after=30s 4m ${go} run ./hack/demo --once --repo "${root}"; then
		summary+=("LAYER demo         ok: the demo ran end to end, $(($(date +%s) - start))s")
	else
		summary+=("LAYER demo         FAIL: the demo failed (or ran past its ceiling of 4m), $(($(date +%s) - start))s")
		rc=1
	fi
	times+=("demo $(dur $(($(date +%s) - start)))")
fi

echo
printf '%s\n' "${summary[@]}"
echo "TIME $(printf '%s; ' "${times[@]}")total $(dur $(($(date +%s) - total_start)))"
# The go layers' counts added up, as one plain closing line.
grep -oE '[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' <<<"$(printf '%s\n' "${summary[@]}")" |
	awk '{p += $1; f += $3; s += $5} END {printf "total: %d passed, %d failed, %d skipped\n", p, f, s}'
exit ${rc}
