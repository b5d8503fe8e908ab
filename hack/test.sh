#!/usr/bin/env bash
# test.sh runs every test layer and prints one summary line per layer ("LAYER ..."):
#
#   unit         packages that need nothing but Go (fakes, golden rulesets, packet tracer)
#   real-kernel  packages whose tests load rules with the real nft into network namespaces
#                and send real traffic (their unit tests run here too)
#   integration  packages whose tests talk to a real etcd + kube-apiserver
#   e2e          the real `shardproxy run` binary on a control plane + node namespaces
#   soak         hack/soak.sh for 2 minutes: churn and every kind of fault once, the
#                kernel checked against render at checkpoints (SKIP_SOAK=1 skips it)
#   cluster      a real node (containerd, kubelet, CoreDNS) running deploy/'s overlays with
#                the image built from the repository (test/cluster)
#   fuzz         the fuzz targets (config decoder, Service model), briefly
#   demo         `make demo --once`: the README's main job, end to end
#
# Every package lands in exactly one layer: anything not listed as kernel, integration,
# e2e or cluster is unit. Root is required (CI is root). Exits non-zero if any layer
# failed, after running them all.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
go="${GO:-go}"
flags=(-count=1)

source "${root}/hack/layers.sh"

${go} build -o "${root}/bin/testsum" ./hack/testsum || exit 1

summary=()
rc=0
layer() {
	local name="$1" timeout="$2" parallel="$3"
	shift 3
	[[ $# -eq 0 ]] && return
	echo "=== layer ${name}: $*" | tr '\n' ' '
	echo
	local out
	out="$(mktemp)"
	${go} test "${flags[@]}" -p "${parallel}" -json -timeout "${timeout}" "$@" 2>&1 | "${root}/bin/testsum" -layer "${name}" | tee "${out}"
	local status=${PIPESTATUS[1]}
	summary+=("$(grep '^LAYER ' "${out}")")
	rm -f "${out}"
	[[ ${status} -ne 0 ]] && rc=1
}

# The e2e packages run one at a time: their scenarios count failed connections during
# restarts and handovers, and two environments on two cores would skew the timing.
layer unit 10m 2 ${unit}
layer real-kernel 15m 2 ${kernel}
layer integration 15m 2 ${integration}
layer e2e 20m 1 ${e2e}
# The cluster layer runs alone for the same reason; the first run builds the node's
# binaries and images (cached in ~/.cache/shardproxy).
layer cluster 30m 1 ${cluster}

# soak: the short soak, every fault kind once (make soak runs the long one).
if [[ "${SKIP_SOAK:-}" == "" ]]; then
	echo "=== layer soak: hack/soak.sh for ${soak_ci_duration}"
	start=$(date +%s)
	out="$(mktemp)"
	SOAK_DURATION="${soak_ci_duration}" hack/soak.sh 2>&1 | tee "${out}" | grep -E '^SOAK|fault|checkpoint|soak: (seed|could not)'
	status=${PIPESTATUS[0]}
	detail="$(grep -E '^SOAK (checkpoints|steady connections):' "${out}" | sed 's/^SOAK //' | tr '\n' ';')"
	if [[ ${status} -eq 0 ]]; then
		summary+=("LAYER soak         ok: ${detail} $(($(date +%s) - start))s")
	else
		echo "=== soak failed; the end of its output:"
		tail -80 "${out}"
		summary+=("LAYER soak         FAIL: $(grep -E '^soak: (seed|could not)' "${out}" | head -2 | tr '\n' ' ')${detail} $(($(date +%s) - start))s")
		rc=1
	fi
	rm -f "${out}"
fi

# fuzz: each fuzz target briefly, beyond its seed corpus (which the unit layer runs), for
# a number of executions (10–20 s each on a 2-core CI machine), not a duration: Go
# before 1.27 can fail a duration-bounded run with "context deadline exceeded" when the
# deadline meets a busy worker (golang/go#75804), a failure with no input behind it.
# FUZZTIME overrides both counts (a count "Nx" or a duration).
fuzz_start=$(date +%s)
fuzz_ok=0
fuzz_failed=()
for target in "./supervisor/config FuzzDecode 250000x" "./instance FuzzBuild 70000x"; do
	set -- ${target}
	fuzztime="${FUZZTIME:-$3}"
	echo "=== layer fuzz: $2 in $1 for ${fuzztime}"
	if ${go} test -run '^$' -fuzz "^$2\$" -fuzztime "${fuzztime}" -timeout 10m "$1" 2>&1 | tail -5; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
		fuzz_ok=$((fuzz_ok + 1))
	else
		fuzz_failed+=("$2")
		rc=1
	fi
done
if [[ ${#fuzz_failed[@]} -eq 0 ]]; then
	summary+=("LAYER fuzz         ok: ${fuzz_ok} targets fuzzed (${FUZZTIME:-250000 and 70000 executions}), no failure, $(($(date +%s) - fuzz_start))s")
else
	summary+=("LAYER fuzz         FAIL: ${fuzz_failed[*]} found a failing input (see testdata/fuzz), $(($(date +%s) - fuzz_start))s")
fi

if [[ "${SKIP_DEMO:-}" == "" ]]; then
	echo "=== layer demo: make demo --once"
	start=$(date +%s)
	if ${go} run ./hack/demo --once --repo "${root}"; then
		summary+=("LAYER demo         ok: the demo ran end to end, $(($(date +%s) - start))s")
	else
		summary+=("LAYER demo         FAIL: the demo failed, $(($(date +%s) - start))s")
		rc=1
	fi
fi

echo
printf '%s\n' "${summary[@]}"
exit ${rc}
