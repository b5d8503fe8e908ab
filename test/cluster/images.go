package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/shardproxy/shardproxy/test/buildcache"
)

// nodeBinaries are the Kubernetes binaries the cluster runs, built by
// hack/build-apiserver.sh --node into the cache.
var nodeBinaries = []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kubectl"}

// checkTools fails with the list of every host tool the node needs that is missing
// (hack/install-deps.sh --cluster installs them).
func checkTools() error {
	var missing []string
	for _, tool := range []string{"containerd", "runc", "ctr", "nsenter", "umoci", "mmdebstrap", "setcap"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, plugin)); err != nil {
			missing = append(missing, "CNI plugin "+plugin)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: run hack/install-deps.sh", strings.Join(missing, ", "))
	}
	return nil
}

// buildBinaries returns the cached node binaries, building the missing ones.
func buildBinaries(ctx context.Context, opts Options) (map[string]string, error) {
	return BuildBinaries(ctx, opts.RepoRoot, nodeBinaries...)
}

// BuildBinaries returns the paths of the named binaries of hack/build-apiserver.sh,
// building the missing ones (minutes the first time).
func BuildBinaries(ctx context.Context, repoRoot string, names ...string) (map[string]string, error) {
	return buildcache.Binaries(ctx, repoRoot, nil, names...)
}

// BuildImages runs hack/build-image.sh for the named images and returns each archive.
func BuildImages(ctx context.Context, repoRoot string, env []string, names ...string) (map[string]string, error) {
	return buildcache.Images(ctx, repoRoot, env, names...)
}

// startRuntimes builds the nodes' own images (pause, CoreDNS) once, then on every node at
// once starts containerd and imports them with the caller's: each node has a containerd
// of its own, so each unpacks every image; the archives are built once and shared.
func (c *Cluster) startRuntimes(ctx context.Context) error {
	own, err := BuildImages(ctx, c.opts.RepoRoot, nil, "pause", "coredns")
	if err != nil {
		return err
	}
	c.dnsArchive = own["coredns"]
	for name, archive := range c.opts.Images {
		own[name] = archive
	}
	c.ownImages = own
	return c.eachNode(func(n *Node, ctx context.Context) error {
		if err := n.startContainerd(ctx); err != nil {
			return err
		}
		names := make([]string, 0, len(own))
		for name := range own {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if err := n.ImportImage(ctx, name, own[name]); err != nil {
				return err
			}
		}
		return nil
	})(ctx)
}

// ImportImage imports an OCI archive of hack/build-image.sh as localhost/NAME:TAG (the
// tag is the archive's) into every node's containerd, all at once.
func (c *Cluster) ImportImage(ctx context.Context, name, archive string) error {
	return c.eachNode(func(n *Node, ctx context.Context) error { return n.ImportImage(ctx, name, archive) })(ctx)
}

// ImportImage imports an OCI archive into the node's containerd (Cluster.ImportImage).
func (n *Node) ImportImage(ctx context.Context, name, archive string) error {
	_, err := n.ctr(ctx, "images", "import", "--base-name", "localhost/"+name, archive)
	return err
}

// TagImage gives an imported image another name on every node (e.g. the one upstream's
// tests ask for).
func (c *Cluster) TagImage(ctx context.Context, source, target string) error {
	return c.eachNode(func(n *Node, ctx context.Context) error {
		_, err := n.ctr(ctx, "images", "tag", "--force", source, target)
		return err
	})(ctx)
}

// ImageName is the name ImportImage gives archive, an image called name by
// hack/build-image.sh (NAME-TAG.tar): localhost/NAME:TAG.
func ImageName(name, archive string) string {
	return "localhost/" + name + ":" + strings.TrimSuffix(strings.TrimPrefix(filepath.Base(archive), name+"-"), ".tar")
}
