# layers.sh is sourced by test.sh and flakes.sh: it sets unit, kernel, integration, e2e
# and cluster to the packages of each test layer, and kernel_skip to the tests the host's
# real-kernel layer leaves out by name. Every package lands in exactly one layer:
# anything not listed as kernel, integration, e2e or cluster is unit. Needs ${go}.

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
# kernel_skip (go test -skip) leaves out of the host's real-kernel layer, by name, the
# tests this host's kernel cannot run, each with the reason and where they run instead:
#   test/netns TestSCTPWithoutProxy, tables TestSCTPThroughRealKernel,
#   supervisor/conntrack TestKernelCleanupOfRealSCTPFlows: real SCTP traffic. These
#     machines' kernel (6.18.44-fc) is built without SCTP (CONFIG_IP_SCTP unset: socket()
#     answers EPROTONOSUPPORT), and in CI mode a test whose kernel lacks SCTP fails rather
#     than skips (netns.RequireSCTP). Debian's kernels have it: hack/kernels.sh runs them
#     (hack/kernels/tests.txt), make test's kernel-6.1 layer the ci set of them.
kernel_skip='^(TestSCTPWithoutProxy|TestSCTPThroughRealKernel|TestKernelCleanupOfRealSCTPFlows)$'

unit="$(grep -vE "${kernel_re}|${integration_re}|${e2e_re}|${cluster_re}" <<<"${all}" || true)"

# The soak layer is a program (test/soak/cmd/shardproxy-soak), not a go test package (its
# package's own tests are unit tests): test.sh runs hack/soak.sh for soak_ci_duration.
soak_ci_duration="${SOAK_CI_DURATION:-2m}"
