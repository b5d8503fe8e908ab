package cluster

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// cl is the cluster every test of the package shares: bringing the nodes up takes minutes,
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
			if ch := c.Child("kube-controller-manager"); ch != nil {
				log.Printf("kube-controller-manager log tail:\n%s", ch.LogTail(30))
			}
			for _, n := range c.Nodes {
				for _, name := range []string{"kubelet", "containerd"} {
					if ch := n.Child(name); ch != nil {
						log.Printf("%s's %s log tail:\n%s", n.Name, name, ch.LogTail(30))
					}
				}
			}
		}
	} else {
		cl = c
		fmt.Printf("cluster: images built in %v; %d nodes (dual stack) Ready with CoreDNS %v later\n", imagesTime.Round(time.Second), len(c.Nodes), c.StartTime.Round(time.Second))
		code = m.Run()
	}
	if dst := os.Getenv(keepLogsEnv); dst != "" && code != 0 && c != nil {
		if err := keepLogs(c.Dir, dst); err != nil {
			log.Printf("keeping the logs: %v", err)
		} else {
			log.Printf("cluster: the failed run's logs are in %s", dst)
		}
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

// keepLogsEnv names a directory to copy a failed run's logs (every *.log of the cluster's
// directory: the control plane's, each node's kubelet and containerd, the pods') to
// before the teardown removes them.
const keepLogsEnv = "CLUSTER_KEEP_LOGS"

func keepLogs(dir, dst string) error {
	return filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") || !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		target := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
}

// need skips a test when there is no cluster (-short, not root).
func need(t *testing.T) *Cluster {
	t.Helper()
	if cl == nil {
		testutil.Unavailable(t, "no cluster (needs root and no -short)")
	}
	return cl
}
