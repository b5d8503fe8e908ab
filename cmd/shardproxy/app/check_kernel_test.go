package app

import (
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestCheckProbesThisKernel runs `shardproxy check` with its host probe, as an operator
// does before the first start, in a fresh node namespace: the kernel must accept every
// rule shape (both families, every load-balancing mode and detect-local kind), or check
// must fail naming what it refused. hack/kernels.sh runs it on each Debian kernel.
func TestCheckProbesThisKernel(t *testing.T) {
	testutil.RequireKernel(t, "ip", "nft")
	tp := netns.New(t)
	out, errOut, code := runCLIIn(t, tp, tp.Node, "check", "--config", "testdata/config.yaml")
	if code != 0 {
		t.Fatalf("check refused this kernel (exit %d):\n%s\n%s", code, errOut, out)
	}
	if want := "host probe: nft and the kernel accept every rule shape (IPv4 and IPv6)"; !strings.Contains(out, want) {
		t.Errorf("check's output lacks %q:\n%s", want, out)
	}
	// The probe only checks (nft --check): it leaves no table behind.
	tables, err := tp.Exec(tp.Node, "nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(tables) != "" {
		t.Errorf("the probe left tables in the node namespace:\n%s", tables)
	}
}
