# layers.sh is sourced by test.sh and flakes.sh: it sets unit, kernel, integration, e2e
# and cluster to the packages of each test layer. Every package lands in exactly one
# layer: anything not listed as kernel, integration, e2e or cluster is unit. Needs ${go}.

module="$(${go} list -m)"
kernel_re="^${module}/(tables|test/netns|supervisor/conntrack|supervisor/healthcheck|supervisor/kerneltest|legacy|cmd/shardproxy/app)(/.*)?$"
integration_re="^${module}/(test/controlplane|test/fleet|test/realfleet|deploy)(/.*)?$"
e2e_re="^${module}/test/e2e(/.*)?$"
# test/cluster itself; its subpackages (the e2e report parser, the teardown command) are
# plain Go and run with the unit layer.
cluster_re="^${module}/test/cluster$"

all="$(${go} list ./...)"
kernel="$(grep -E "${kernel_re}" <<<"${all}" || true)"
integration="$(grep -E "${integration_re}" <<<"${all}" || true)"
e2e="$(grep -E "${e2e_re}" <<<"${all}" || true)"
cluster="$(grep -E "${cluster_re}" <<<"${all}" || true)"
unit="$(grep -vE "${kernel_re}|${integration_re}|${e2e_re}|${cluster_re}" <<<"${all}" || true)"

# The soak layer is a program (test/soak/cmd/shardproxy-soak), not a go test package (its
# package's own tests are unit tests): test.sh runs hack/soak.sh for soak_ci_duration.
soak_ci_duration="${SOAK_CI_DURATION:-2m}"
