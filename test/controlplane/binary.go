package controlplane

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	"github.com/shardproxy/shardproxy/test/buildcache"
)

// KubernetesVersion is the version of kube-apiserver and kube-proxy that
// hack/build-apiserver.sh builds; it must match the k8s.io/kubernetes requirement in
// hack/tools/go.mod (a test checks).
const KubernetesVersion = "v1.36.3"

// Environment variables that point at prebuilt binaries instead of the cache.
const (
	envAPIServer = "SHARDPROXY_KUBE_APISERVER"
	envKubeProxy = "SHARDPROXY_KUBE_PROXY"
	envKubemark  = "SHARDPROXY_KUBEMARK"
)

// buildScript is the script, relative to the repository root, that builds the binaries.
const buildScript = "hack/build-apiserver.sh"

// APIServerBinary returns the path of a kube-apiserver KubernetesVersion binary: the file
// named by $SHARDPROXY_KUBE_APISERVER if set, else the one hack/build-apiserver.sh caches
// for the current inputs (test/buildcache), building it first if it is missing. The first
// build takes minutes; its progress goes to progress (nil for none).
func APIServerBinary(ctx context.Context, progress io.Writer) (string, error) {
	return binary(ctx, "kube-apiserver", envAPIServer, progress)
}

// KubeProxyBinary is APIServerBinary for upstream kube-proxy ($SHARDPROXY_KUBE_PROXY),
// for tests that compare against it.
func KubeProxyBinary(ctx context.Context, progress io.Writer) (string, error) {
	return binary(ctx, "kube-proxy", envKubeProxy, progress)
}

// KubemarkBinary is APIServerBinary for upstream kubemark ($SHARDPROXY_KUBEMARK), whose
// --morph=proxy is the hollow kube-proxy test/fleet measures shardproxy against.
func KubemarkBinary(ctx context.Context, progress io.Writer) (string, error) {
	return binary(ctx, "kubemark", envKubemark, progress)
}

func binary(ctx context.Context, name, env string, progress io.Writer) (string, error) {
	if path := os.Getenv(env); path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("$%s: %w", env, err)
		}
		return path, nil
	}
	script, err := findBuildScript()
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", name, err)
	}
	paths, err := buildcache.Binaries(ctx, filepath.Dir(filepath.Dir(script)), progress, name)
	if err != nil {
		return "", err
	}
	return paths[name], nil
}

// findBuildScript looks for hack/build-apiserver.sh above the working directory (tests run
// in their package directory) and above this source file.
func findBuildScript() (string, error) {
	var dir string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir = filepath.Dir(file)
	}
	root, err := buildcache.RepoRoot(dir)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, buildScript), nil
}
