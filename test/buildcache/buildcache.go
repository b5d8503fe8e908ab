// Package buildcache finds the binaries and images that hack/build-apiserver.sh and
// hack/build-image.sh cache (in $SHARDPROXY_CACHE, default ~/.cache/shardproxy), building
// what is missing. Each artifact lies at a path keyed by a hash of its inputs (Go version,
// module pins and replaces, ldflags, CoreDNS's plugin list, the image recipe), so that a
// change to any of them builds it anew. The scripts alone define the keys: this package
// only asks them for the paths, so the tests cannot take an artifact the scripts would
// rebuild.
package buildcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Scripts, relative to the repository root.
const (
	binaryScript = "hack/build-apiserver.sh"
	imageScript  = "hack/build-image.sh"
	helmScript   = "hack/build-helm.sh"
)

// Binaries returns the cached paths of the named binaries of hack/build-apiserver.sh
// (kube-apiserver, kube-proxy, kubelet, ..., coredns), building the missing ones first:
// minutes the first time, while the script's progress goes to progress (nil for none).
func Binaries(ctx context.Context, repoRoot string, progress io.Writer, names ...string) (map[string]string, error) {
	script := filepath.Join(repoRoot, binaryScript)
	paths, err := binaryPaths(ctx, script, names)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, name := range names {
		if _, err := os.Stat(paths[name]); err != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return paths, nil
	}
	if progress == nil {
		progress = io.Discard
	}
	// The script keeps its own lock, so tests of several packages that get here at once
	// build each binary once.
	var out strings.Builder
	cmd := exec.CommandContext(ctx, script, missing...)
	cmd.Stdout = io.MultiWriter(progress, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("building %v with %s: %w: %s", missing, script, err, tail(out.String()))
	}
	for _, name := range missing {
		if _, err := os.Stat(paths[name]); err != nil {
			return nil, fmt.Errorf("%s built %s, yet not at %s, the path it printed", script, name, paths[name])
		}
	}
	return paths, nil
}

// binaryPaths asks script where the named binaries are cached.
func binaryPaths(ctx context.Context, script string, names []string) (map[string]string, error) {
	out, err := exec.CommandContext(ctx, script, append([]string{"--print-path"}, names...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("%s --print-path %v: %w%s", script, names, err, stderr(err))
	}
	lines := strings.Fields(string(out))
	if len(lines) != len(names) {
		return nil, fmt.Errorf("%s --print-path %v printed %q", script, names, out)
	}
	paths := make(map[string]string, len(names))
	for i, name := range names {
		paths[name] = lines[i]
	}
	return paths, nil
}

// Helm returns the cached path of the Helm CLI of hack/build-helm.sh (go.mod's
// helm.sh/helm/v3), building it first if missing: a minute or two the first time, while
// the script's progress goes to progress (nil for none).
func Helm(ctx context.Context, repoRoot string, progress io.Writer) (string, error) {
	script := filepath.Join(repoRoot, helmScript)
	out, err := exec.CommandContext(ctx, script, "--print-path").Output()
	if err != nil {
		return "", fmt.Errorf("%s --print-path: %w%s", script, err, stderr(err))
	}
	path := strings.TrimSpace(string(out))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if progress == nil {
		progress = io.Discard
	}
	var log strings.Builder
	cmd := exec.CommandContext(ctx, script)
	cmd.Stdout = io.MultiWriter(progress, &log)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building Helm with %s: %w: %s", script, err, tail(log.String()))
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s built Helm, yet not at %s, the path it printed", script, path)
	}
	return path, nil
}

// Images runs hack/build-image.sh for the named images (shardproxy, pause, coredns,
// agnhost, kube-proxy) with env added to the environment (TAG=...), and returns each
// archive; the script reuses an archive whose key is cached.
func Images(ctx context.Context, repoRoot string, env []string, names ...string) (map[string]string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot, imageScript), names...)
	cmd.Env = append(os.Environ(), env...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %v: %w: %s", imageScript, names, err, tail(errOut.String()))
	}
	paths := strings.Fields(string(out))
	if len(paths) != len(names) {
		return nil, fmt.Errorf("%s %v printed %q", imageScript, names, out)
	}
	archives := make(map[string]string, len(names))
	for i, name := range names {
		archives[name] = paths[i]
	}
	return archives, nil
}

// RepoRoot finds the repository (the directory holding hack/build-apiserver.sh) above the
// working directory, where tests run, or above dir if that is not inside it.
func RepoRoot(dir string) (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if dir != "" {
		starts = append(starts, dir)
	}
	for _, dir := range starts {
		for {
			if _, err := os.Stat(filepath.Join(dir, binaryScript)); err == nil {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("cannot find %s: run from inside the repository", binaryScript)
}

func stderr(err error) string {
	var exit *exec.ExitError
	if errors.As(err, &exit) && len(exit.Stderr) > 0 {
		return ": " + tail(string(exit.Stderr))
	}
	return ""
}

// tail is the end of a script's output, enough to show why it failed.
func tail(s string) string {
	const max = 4000
	s = strings.TrimSpace(s)
	if len(s) > max {
		s = "..." + s[len(s)-max:]
	}
	return s
}
