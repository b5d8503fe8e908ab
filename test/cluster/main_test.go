package cluster

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// cl is the cluster every test of the package shares: bringing a node up takes a minute,
// so it is started once. Tests leave it as they found it (their own namespaces, removed).
var cl *Cluster

// shardproxyTag is the tag of the image built from the repository for this run.
const shardproxyTag = "dev"

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if testing.Short() || os.Geteuid() != 0 {
		if testutil.CI() {
			log.Printf("cluster: %s=1 (CI mode) but not root or -short: the cluster layer cannot run", testutil.CIEnv)
			return 1
		}
		log.Printf("cluster: skipped (needs root and no -short)")
		return m.Run()
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		log.Print(err)
		return 1
	}
	// A crashed earlier run's cluster goes first (Start would remove it too): the host
	// as found is the host without it. Snapshotting before that saw the /lib/modules a
	// crashed run had created, which the cleanup then removed: "exists: false, was true".
	RemoveStale(log.Printf)
	before := SnapshotHost()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	images, err := BuildImages(ctx, root, []string{"TAG=" + shardproxyTag}, "shardproxy", "agnhost")
	if err != nil {
		log.Print(err)
		return 1
	}
	agnhostImage = ImageName("agnhost", images["agnhost"])
	imagesTime := time.Since(start)
	c, err := Start(ctx, Options{RepoRoot: root, Logf: log.Printf, Images: images})
	code := 1
	if err != nil {
		log.Printf("cluster start: %v", err)
		if c != nil {
			for _, name := range []string{"kubelet", "containerd", "kube-controller-manager"} {
				if ch := c.Child(name); ch != nil {
					log.Printf("%s log tail:\n%s", name, ch.LogTail(30))
				}
			}
		}
	} else {
		cl = c
		fmt.Printf("cluster: images built in %v; node Ready with CoreDNS %v later\n", imagesTime.Round(time.Second), c.StartTime.Round(time.Second))
		code = m.Run()
	}
	t0 := time.Now()
	if err := c.Close(); err != nil {
		log.Printf("cluster teardown: %v", err)
		code = 1
	}
	if diff := before.Diff(c); diff != "" {
		log.Printf("cluster teardown left the host changed:\n%s", diff)
		return 1
	}
	fmt.Printf("cluster: torn down in %v, host as found (no process, mount, network namespace or cgroup left)\n", time.Since(t0).Round(time.Millisecond))
	return code
}

// need skips a test when there is no cluster (-short, not root).
func need(t *testing.T) *Cluster {
	t.Helper()
	if cl == nil {
		testutil.Unavailable(t, "no cluster (needs root and no -short)")
	}
	return cl
}
