package app

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"

	"github.com/shardproxy/shardproxy/tables"
)

// netlinkFaultsEnv names a file that makes partial syncs over netlink fail, for tests
// only (the soak, test/soak, injects faults with it): while the file holds a number p
// between 0 and 1, each netlink transaction fails with probability p, before it reaches
// the kernel, as a failed transaction would. Unset in production; an absent or empty file
// injects nothing.
const netlinkFaultsEnv = "SHARDPROXY_TEST_NETLINK_FAULTS"

// netlinkFaults returns the supervisor's Direct applier wrapped with the fault injection
// of netlinkFaultsEnv, or nil (the default applier) when the variable is unset.
func netlinkFaults(getenv func(string) string) func(cfg tables.Config) (tables.Applier, error) {
	path := getenv(netlinkFaultsEnv)
	if path == "" {
		return nil
	}
	return func(cfg tables.Config) (tables.Applier, error) {
		w, err := tables.NewNetlinkWriter(cfg)
		if err != nil {
			return nil, err
		}
		return &faultyApplier{next: w, path: path, share: rand.Float64}, nil
	}
}

// faultyApplier fails a share of Apply calls, read from a file at every call.
type faultyApplier struct {
	next  tables.Applier
	path  string
	share func() float64
}

// Close closes the wrapped applier if it holds something open (a netlink socket).
func (a *faultyApplier) Close() error {
	if c, ok := a.next.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func (a *faultyApplier) Apply(ctx context.Context, d *tables.Diff) error {
	if p := faultShare(a.path); p > 0 && a.share() < p {
		return fmt.Errorf("injected netlink fault (%s=%s holds %v)", netlinkFaultsEnv, a.path, p)
	}
	return a.next.Apply(ctx, d)
}

// faultShare reads the share of transactions to fail from path: 0 when the file is
// absent, empty or not a number.
func faultShare(path string) float64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	p, err := strconv.ParseFloat(strings.TrimSpace(string(data)), 64)
	if err != nil {
		return 0
	}
	return p
}
