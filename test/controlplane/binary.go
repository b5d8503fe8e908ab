package controlplane

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// KubernetesVersion is the version of kube-apiserver and kube-proxy that
// hack/build-apiserver.sh builds; it must match the k8s.io/kubernetes requirement in
// hack/tools/go.mod (a test checks).
const KubernetesVersion = "v1.36.3"

// Environment variables that point at prebuilt binaries instead of the cache.
const (
	envAPIServer = "SHARDPROXY_KUBE_APISERVER"
	envKubeProxy = "SHARDPROXY_KUBE_PROXY"
	envCache     = "SHARDPROXY_CACHE"
)

// buildScript is the script, relative to the repository root, that builds the binaries.
const buildScript = "hack/build-apiserver.sh"

// APIServerBinary returns the path of a kube-apiserver KubernetesVersion binary: the file
// named by $SHARDPROXY_KUBE_APISERVER if set, else the one hack/build-apiserver.sh caches,
// building it first if it is missing. The first build takes minutes; its progress goes to
// progress (nil for none).
func APIServerBinary(ctx context.Context, progress io.Writer) (string, error) {
	return binary(ctx, "kube-apiserver", envAPIServer, progress)
}

// KubeProxyBinary is APIServerBinary for upstream kube-proxy ($SHARDPROXY_KUBE_PROXY),
// for tests that compare against it.
func KubeProxyBinary(ctx context.Context, progress io.Writer) (string, error) {
	return binary(ctx, "kube-proxy", envKubeProxy, progress)
}

// CachedBinaryPath is where hack/build-apiserver.sh puts the named binary
// (kube-apiserver or kube-proxy).
func CachedBinaryPath(name string) (string, error) {
	cache := os.Getenv(envCache)
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the binary cache: set $%s or $HOME: %w", envCache, err)
		}
		cache = filepath.Join(home, ".cache", "shardproxy")
	}
	return filepath.Join(cache, "bin", name+"-"+KubernetesVersion), nil
}

func binary(ctx context.Context, name, env string, progress io.Writer) (string, error) {
	if path := os.Getenv(env); path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("$%s: %w", env, err)
		}
		return path, nil
	}
	path, err := CachedBinaryPath(name)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	script, err := findBuildScript()
	if err != nil {
		return "", fmt.Errorf("%s is not built (%s) and %w", name, path, err)
	}
	if progress == nil {
		progress = io.Discard
	}
	// The script keeps its own lock, so tests of several packages that get here at once
	// build the binary once.
	cmd := exec.CommandContext(ctx, script, name)
	cmd.Stdout = progress
	cmd.Stderr = progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s with %s: %w", name, script, err)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s built %s somewhere else than %s: does KubernetesVersion match hack/tools/go.mod?", script, name, path)
	}
	return path, nil
}

// findBuildScript looks for hack/build-apiserver.sh above the working directory (tests run
// in their package directory) and above this source file.
func findBuildScript() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			candidate := filepath.Join(dir, buildScript)
			if _, err := os.Stat(candidate); err == nil {
				return candidate, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("cannot find %s to build it: run from inside the repository", buildScript)
}
