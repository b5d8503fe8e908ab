package kerneltest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/legacy"
	"github.com/shardproxy/shardproxy/supervisor"
	"github.com/shardproxy/shardproxy/supervisor/conntrack"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestSupervisorsSharingAPrefixKeepEachOthersTables runs two supervisors on one node
// namespace with the same tablePrefix and different instances, as a second DaemonSet
// beside the first would be: each one's orphan cleanup (after its instances' first full
// syncs) deletes the tables of its own removed instances only, never the other's, in
// whichever order they start and restart.
func TestSupervisorsSharingAPrefixKeepEachOthersTables(t *testing.T) {
	testutil.RequireKernel(t, "ip", "nft")
	tp := netns.New(t)
	ns := tp.Node
	nftInNode(t, ns)
	tablesIn := func() string {
		out, err := tp.Exec(ns, "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	has := func(table string) bool { return strings.Contains(tablesIn()+"\n", table+"\n") }

	portA, portB := freePort(t), freePort(t)
	// A starts with alpha and gamma, then gamma is removed from its configuration.
	a := start(t, tp, ns, portA, 0, "alpha", "gamma")
	testutil.Eventually(t, time.Minute, "A's tables", func() bool {
		return has("table ip shardproxy-alpha") && has("table ip6 shardproxy-gamma")
	})
	b := start(t, tp, ns, portB, 4, "beta")
	testutil.Eventually(t, time.Minute, "B's tables", func() bool { return has("table ip6 shardproxy-beta") })
	// B's orphan cleanup runs once its instances have synced: wait for its verdict on
	// A's tables (left alone, or deleted without the marker naming A).
	testutil.Eventually(t, time.Minute, "B's orphan cleanup to look at A's tables", func() bool {
		return b.logged("shardproxy-alpha") || !has("table ip shardproxy-alpha")
	})
	a.stop()
	a = start(t, tp, ns, portA, 0, "alpha")
	testutil.Eventually(t, time.Minute, "A's cleanup of its removed instance gamma", func() bool {
		return !has("table ip shardproxy-gamma") && !has("table ip6 shardproxy-gamma")
	})
	testutil.Eventually(t, time.Minute, "A's orphan cleanup to look at B's tables", func() bool {
		return a.logged("shardproxy-beta") || !has("table ip shardproxy-beta")
	})
	left := tablesIn()
	for _, kept := range []string{"table ip shardproxy-alpha", "table ip6 shardproxy-alpha", "table ip shardproxy-beta", "table ip6 shardproxy-beta"} {
		if !strings.Contains(left+"\n", kept+"\n") {
			t.Errorf("%s was deleted by the other supervisor:\n%s", kept, left)
		}
	}
	fmt.Printf("kernel: two supervisors with tablePrefix shardproxy on one node, A restarted without gamma: tables left %s\n",
		strings.Join(strings.Fields(strings.ReplaceAll(left, "table ", "")), " "))
	b.stop()
	a.stop()
}

// running is one supervisor of the test, with its log.
type running struct {
	stop func()
	mu   sync.Mutex
	log  strings.Builder
}

// logged reports whether a line mentioning s, from the orphan cleanup, was logged.
func (r *running) logged(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, line := range strings.Split(r.log.String(), "\n") {
		if strings.Contains(line, s) && strings.Contains(line, "Leaving alone") {
			return true
		}
	}
	return false
}

// start runs a supervisor of the given instances (slots from firstSlot), health port
// port and prefix shardproxy, writing the tables of namespace ns (through the nft wrapper nftInNode
// installs) over a fake API holding node-1.
func start(t *testing.T, tp *netns.Topology, ns string, port, firstSlot int, instances ...string) *running {
	t.Helper()
	yaml := fmt.Sprintf("apiVersion: shardproxy.io/v1alpha1\nkind: SupervisorConfig\nnodeName: node-1\n"+
		"healthzBindAddress: 127.0.0.1:%d\nmetricsBindAddress: 127.0.0.1:%d\nserviceCIDRDrop: false\nstatusNamespace: \"-\"\ninstances:\n", port, freePort(t))
	for i, name := range instances {
		yaml += fmt.Sprintf("- name: %s\n  proxyNames: [%s]\n  slot: %d\n  syncPeriod: 30s\n  tenant:\n    namespaces: [%s]\n", name, name, firstSlot+i, name)
	}
	cfg := decodeConfig(t, yaml, "test.yaml")
	r := &running{}
	logger := funcr.New(func(prefix, args string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.log.WriteString(prefix + " " + args + "\n")
	}, funcr.Options{Verbosity: 2})
	client := testutil.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	r.stop = runSupervisor(t, cfg, nodeDeps(tp, ns, client, logr.Logger(logger)))
	return r
}

// nodeDeps are a supervisor's seams for one in the node namespace ns: the real nft
// (nftInNode puts the namespace's first on PATH) and table listing there, the rest of
// the host (conntrack, interfaces, sysctls, legacy rules) faked.
func nodeDeps(tp *netns.Topology, ns string, client kubernetes.Interface, logger logr.Logger) supervisor.Deps {
	return supervisor.Deps{
		Client: client,
		NFT: func(fam tables.Family, table string) (knftables.Interface, error) {
			return knftables.New(tables.KnftFamily(fam), table)
		},
		ListTables: func(ctx context.Context, fam tables.Family) (out []tables.ListedTable, err error) {
			if doErr := tp.Do(ns, func() error { out, err = tables.ListTables(ctx, fam); return nil }); doErr != nil {
				return nil, doErr
			}
			return out, err
		},
		Conntrack:         conntrack.NewFake(),
		InterfaceAddrs:    func() ([]netip.Addr, error) { return nil, nil },
		Sysctl:            func(string, string) error { return nil },
		ConntrackHashsize: func(int) error { return nil },
		LegacyRules:       func(context.Context) (map[string]legacy.ServiceRules, error) { return nil, nil },
		Logger:            logger,
	}
}

// nftInNode puts first on PATH an nft that runs the real one inside ns, so that the
// supervisors' knftables write the namespace's tables, never the host's.
func nftInNode(t *testing.T, ns string) {
	t.Helper()
	real, err := exec.LookPath("nft")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := "#!/bin/sh\nexec ip netns exec " + ns + " " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "nft"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// freePort returns a TCP port free on loopback now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
