package app

import (
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
)

// TestPrintStatusNodeEligibility: `shardproxy status` says why /healthz drains the node.
func TestPrintStatusNodeEligibility(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   healthcheck.StatusResponse
		want string // "" when the node line must be absent
	}{
		{name: "eligible", st: healthcheck.StatusResponse{}},
		{name: "deleting", st: healthcheck.StatusResponse{NodeDeleting: true}, want: "node: being deleted"},
		{name: "autoscaler taint", st: healthcheck.StatusResponse{NodeToBeDeleted: true}, want: "node: tainted ToBeDeletedByClusterAutoscaler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := printStatus(&b, tc.st); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			if tc.want == "" && strings.Contains(out, "node:") {
				t.Errorf("a node line for an eligible node:\n%s", out)
			}
			if tc.want != "" && !strings.Contains(out, tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}
