#!/usr/bin/env bash
# flakes.sh runs the unit and real-kernel layers COUNT times (go test -count, default 10)
# and the e2e layer E2E_COUNT times (default 3, each run its own process), and lists
# every test that failed at least once (hack/flakes). Root only, like make test. Exits
# non-zero if any test failed.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
go="${GO:-go}"
count="${COUNT:-10}"
e2e_count="${E2E_COUNT:-3}"

source "${root}/hack/layers.sh"

${go} build -o "${root}/bin/flakes" ./hack/flakes || exit 1

rc=0
summary=()
# run NAME N TIMEOUT PARALLEL [separate] PACKAGES...: N runs of the packages, reported as
# one layer. "separate" makes each run its own go test process (the e2e layer: its
# environment and objects are set up once per process, so -count=2 would meet the first
# run's objects); otherwise -count=N in one process.
run() {
	local name="$1" n="$2" timeout="$3" parallel="$4"
	shift 4
	local separate=false
	if [[ "${1:-}" == separate ]]; then
		separate=true
		shift
	fi
	[[ $# -eq 0 ]] && return
	echo "=== flakes ${name}: ${n} runs of $*" | tr '\n' ' '
	echo
	local out
	out="$(mktemp)"
	if ${separate}; then
		for _ in $(seq "${n}"); do
			${go} test -count=1 -p "${parallel}" -json -timeout "${timeout}" "$@" 2>&1
		done
	else
		${go} test -count="${n}" -p "${parallel}" -json -timeout "${timeout}" "$@" 2>&1
	fi | "${root}/bin/flakes" -layer "${name}" | tee "${out}"
	[[ ${PIPESTATUS[1]} -ne 0 ]] && rc=1
	summary+=("$(grep '^FLAKES ' "${out}")")
	rm -f "${out}"
}

run unit "${count}" 60m 2 ${unit}
run real-kernel "${count}" 90m 2 -skip "${kernel_skip}" ${kernel}
run e2e "${e2e_count}" 30m 1 separate ${e2e}

echo
printf '%s\n' "${summary[@]}"
exit ${rc}
