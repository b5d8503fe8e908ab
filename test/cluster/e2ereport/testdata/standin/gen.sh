#!/usr/bin/env bash
# gen.sh records the stand-in suite's Ginkgo JSON reports (and exit statuses) that
# e2ereport's tests read, in ../. Offline: the module cache already holds Ginkgo (make deps).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "${here}"
cp ../../../../../hack/tools/go.sum go.sum
trap 'rm -f go.sum standin.test' EXIT
GOFLAGS=-mod=mod GOPROXY=off go test -c -o standin.test . || exit 1

focus='\[sig-network\] Services '
skip='\[Slow\]'
# record NAME [ENV...] -- [FLAGS...]: run the suite once and keep NAME.json and NAME.exit.
record() {
	local name="$1" env=() flags=()
	shift
	while [[ $# -gt 0 && "$1" != -- ]]; do env+=("$1"); shift; done
	shift
	flags=("$@")
	env "${env[@]}" ./standin.test --ginkgo.seed=1 --ginkgo.no-color \
		--ginkgo.json-report="../${name}.json" "${flags[@]}" >/dev/null 2>&1
	echo $? >"../${name}.exit"
	# The reports carry absolute paths and times: keep them stable and short.
	sed -i -e "s#${here}#/standin#g" "../${name}.json"
	echo "${name}: exit $(cat "../${name}.exit")"
}
record all-passed -- --ginkgo.focus="${focus}" --ginkgo.skip="${skip}"
record one-failed STANDIN_FAIL="up and down" -- --ginkgo.focus="${focus}" --ginkgo.skip="${skip}"
record suite-timeout STANDIN_SLOW="affinity timeout" -- --ginkgo.focus="${focus}" --ginkgo.skip="${skip}" --ginkgo.timeout=3s
record suite-broken STANDIN_BREAK_SUITE=1 -- --ginkgo.focus="${focus}" --ginkgo.skip="${skip}"
record other-skip -- --ginkgo.focus="${focus}" --ginkgo.skip="${skip}|service-proxy-name"
