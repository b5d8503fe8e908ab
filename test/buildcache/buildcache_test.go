package buildcache

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The scripts run in a copy of their part of the repository, with a cache in a temporary
// directory and fake tools first in $PATH: a go whose env is the real one's but whose
// build writes a small file naming its inputs (so a binary's content follows its
// sources), and an mmdebstrap, umoci and setcap that only make directories. Every call
// of the fakes is logged, which tells a rebuild from a reuse.

// fakeGo is go for the scripts: env and list are the real go's (with $FAKE_GOVERSION as
// the version if set), mod does nothing, build and test -c write -o's file, install
// writes $GOBIN's.
const fakeGo = `#!/usr/bin/env bash
echo "go $*" >>"${FAKE_LOG}"
case "$1" in
env | list)
	if [[ -n "${FAKE_GOVERSION:-}" ]]; then
		"${REAL_GO}" "$@" | sed "s/^go1\.[0-9.]*$/${FAKE_GOVERSION}/"
	else
		exec "${REAL_GO}" "$@"
	fi
	;;
mod) ;;
install)
	# go install PKG@VERSION: the binary, named for PKG's last element, into $GOBIN.
	pkg="${@: -1}"
	name="${pkg%@*}"
	{
		echo "fake binary ${FAKE_GO_CONTENT:-}"
		echo "$*"
	} >"${GOBIN}/${name##*/}"
	chmod +x "${GOBIN}/${name##*/}"
	;;
build | test)
	out=""
	while [[ $# -gt 0 ]]; do
		if [[ "$1" == -o ]]; then out="$2"; fi
		shift
	done
	{
		echo "fake binary ${FAKE_GO_CONTENT:-}"
		cat go.mod go.sum *.go 2>/dev/null | sha256sum
	} >"${out}"
	chmod +x "${out}"
	;;
*)
	echo "fake go: unexpected $1" >&2
	exit 1
	;;
esac
`

const fakeMmdebstrap = `#!/usr/bin/env bash
if [[ "$1" == --version ]]; then echo "mmdebstrap 1.0-fake"; exit 0; fi
echo "mmdebstrap $*" >>"${FAKE_LOG}"
target="${@: -1}"
mkdir -p "${target}/usr/local/bin" "${target}/usr/sbin" "${target}/var/lib/apt/lists" "${target}/var/cache/apt"
`

const fakeUmoci = `#!/usr/bin/env bash
if [[ "$1" == --version ]]; then echo "umoci ${FAKE_UMOCI_VERSION:-0.4-fake}"; exit 0; fi
echo "umoci $*" >>"${FAKE_LOG}"
if [[ "$1" == init ]]; then mkdir -p "$3"; fi
`

const fakeSetcap = `#!/usr/bin/env bash
echo "setcap $*" >>"${FAKE_LOG}"
`

// repoFiles are what the scripts read, copied from the repository into the sandbox.
var repoFiles = []string{
	"VERSION",
	"hack/build-apiserver.sh",
	"hack/build-helm.sh",
	"hack/build-image.sh",
	"hack/lib/cache.sh",
	"hack/tools/go.mod",
	"hack/tools/go.sum",
	"hack/tools/tools.go",
	"hack/tools/coredns/go.mod",
	"hack/tools/coredns/go.sum",
	"hack/tools/coredns/main.go",
}

type sandbox struct {
	root, cache, log string
}

// newSandbox copies the scripts and their inputs into a temporary repository and points
// $PATH, $SHARDPROXY_CACHE and the fakes' variables at it for the rest of the test.
func newSandbox(t *testing.T) *sandbox {
	t.Helper()
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the fake go calls the real one for go env: %v", err)
	}
	repo, err := RepoRoot("")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &sandbox{root: filepath.Join(dir, "repo"), cache: filepath.Join(dir, "cache"), log: filepath.Join(dir, "fake.log")}
	for _, f := range repoFiles {
		data, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(f, ".sh") {
			mode = 0o755
		}
		writeFile(t, filepath.Join(s.root, f), string(data), mode)
	}
	bin := filepath.Join(dir, "bin")
	for name, script := range map[string]string{"go": fakeGo, "mmdebstrap": fakeMmdebstrap, "umoci": fakeUmoci, "setcap": fakeSetcap} {
		writeFile(t, filepath.Join(bin, name), script, 0o755)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("REAL_GO", realGo)
	t.Setenv("FAKE_LOG", s.log)
	t.Setenv("SHARDPROXY_CACHE", s.cache)
	for _, env := range []string{"FAKE_GOVERSION", "FAKE_GO_CONTENT", "FAKE_UMOCI_VERSION", "TAG"} {
		t.Setenv(env, "")
		os.Unsetenv(env)
	}
	return s
}

func writeFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

// edit replaces old, which must be there, with new in the sandbox's file.
func (s *sandbox) edit(t *testing.T, file, old, new string) {
	t.Helper()
	path := filepath.Join(s.root, file)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s has no %q to change: update the test", file, old)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, strings.Replace(string(data), old, new, 1), info.Mode())
}

// calls returns the fakes' calls so far and forgets them.
func (s *sandbox) calls(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(s.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Remove(s.log); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(data)
}

// built reports whether the fake go built the named binary (its -o is its cached path).
func built(calls, path string) bool {
	for _, line := range strings.Split(calls, "\n") {
		if (strings.HasPrefix(line, "go build ") || strings.HasPrefix(line, "go test ")) && strings.Contains(line, filepath.Base(path)) {
			return true
		}
	}
	return false
}

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestBinaryKeyFollowsInputs(t *testing.T) {
	names := []string{"kube-apiserver", "coredns"}
	for _, tc := range []struct {
		name    string
		change  func(t *testing.T, s *sandbox)
		rebuilt []string
	}{
		{
			name:   "nothing changed: both reused",
			change: func(*testing.T, *sandbox) {},
		},
		{
			name: "a replace in hack/tools/go.mod rebuilds Kubernetes' binaries",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/tools/go.mod", "k8s.io/api => k8s.io/api v0.36.3", "k8s.io/api => k8s.io/api v0.36.2")
			},
			rebuilt: []string{"kube-apiserver"},
		},
		{
			name: "a module hash in hack/tools/go.sum rebuilds Kubernetes' binaries",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/tools/go.sum", "h1:", "h1:A")
			},
			rebuilt: []string{"kube-apiserver"},
		},
		{
			name: "CoreDNS's plugin list rebuilds CoreDNS",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/tools/coredns/main.go", "\t\"log\",\n", "")
			},
			rebuilt: []string{"coredns"},
		},
		{
			name: "CoreDNS's pin rebuilds CoreDNS",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/tools/coredns/go.sum", "h1:", "h1:A")
			},
			rebuilt: []string{"coredns"},
		},
		{
			name: "comments, usage and the shared cache plumbing rebuild nothing",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/build-apiserver.sh", "# kube_ldflags VERSION prints", "# kube_ldflags VERSION writes")
				s.edit(t, "hack/build-apiserver.sh", "build kube-apiserver and kube-proxy", "build both kube-apiserver and kube-proxy")
				s.edit(t, "hack/lib/cache.sh", "another build is running, waiting for it", "a build is running: waiting")
			},
		},
		{
			name: "the ldflags in the script rebuild both",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/build-apiserver.sh", `ldflags="-s -w"`, `ldflags="-w"`)
			},
			rebuilt: names,
		},
		{
			name:    "another Go version rebuilds both",
			change:  func(t *testing.T, _ *sandbox) { t.Setenv("FAKE_GOVERSION", "go1.99.0") },
			rebuilt: names,
		},
		{
			name:    "GOFLAGS rebuild both",
			change:  func(t *testing.T, _ *sandbox) { t.Setenv("GOFLAGS", "-tags=netgo") },
			rebuilt: names,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t)
			ctx := context.Background()
			before, err := Binaries(ctx, s.root, nil, names...)
			if err != nil {
				t.Fatal(err)
			}
			calls := s.calls(t)
			for _, name := range names {
				if !built(calls, before[name]) {
					t.Fatalf("%s was not built into %s:\n%s", name, before[name], calls)
				}
				if !strings.HasPrefix(before[name], filepath.Join(s.cache, "bin", name+"-v")) {
					t.Errorf("%s is cached at %s, outside %s", name, before[name], s.cache)
				}
			}
			old := map[string]string{}
			for _, name := range names {
				old[name] = read(t, before[name])
			}

			tc.change(t, s)
			after, err := Binaries(ctx, s.root, nil, names...)
			if err != nil {
				t.Fatal(err)
			}
			calls = s.calls(t)
			for _, name := range names {
				want := false
				for _, r := range tc.rebuilt {
					want = want || r == name
				}
				switch {
				case want && after[name] == before[name]:
					t.Errorf("%s: the key did not change, %s would be reused", name, before[name])
				case want && !built(calls, after[name]):
					t.Errorf("%s: not rebuilt into %s:\n%s", name, after[name], calls)
				case !want && after[name] != before[name]:
					t.Errorf("%s: the key changed (%s, was %s) with none of its inputs", name, after[name], before[name])
				case !want && built(calls, after[name]):
					t.Errorf("%s: rebuilt with none of its inputs changed:\n%s", name, calls)
				}
				if want {
					// The stale binary stays for other checkouts, but nothing takes it.
					if read(t, before[name]) != old[name] {
						t.Errorf("%s: the binary of the old key was overwritten", name)
					}
				}
			}
		})
	}
}

func TestImageKeyFollowsInputs(t *testing.T) {
	names := []string{"shardproxy", "coredns", "pause"}
	for _, tc := range []struct {
		name    string
		change  func(t *testing.T, s *sandbox)
		rebuilt []string
		rootfs  bool // the root filesystem is built again
	}{
		{
			name:   "nothing changed: every archive reused",
			change: func(*testing.T, *sandbox) {},
		},
		{
			name:    "the repository's sources rebuild shardproxy's and pause's images",
			change:  func(t *testing.T, _ *sandbox) { t.Setenv("FAKE_GO_CONTENT", "changed main.go") },
			rebuilt: []string{"shardproxy", "pause"}, // pause is built from the repository too
		},
		{
			name:    "the tag rebuilds shardproxy's image",
			change:  func(t *testing.T, _ *sandbox) { t.Setenv("TAG", "v9.9.9") },
			rebuilt: []string{"shardproxy"},
		},
		{
			name: "CoreDNS's plugin list rebuilds CoreDNS's image",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/tools/coredns/main.go", "\t\"log\",\n", "")
			},
			rebuilt: []string{"coredns"},
		},
		{
			name: "the package list rebuilds the root filesystem and every image",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/build-image.sh", "shardproxy_packages=(nftables", "shardproxy_packages=(ethtool nftables")
			},
			rebuilt: names,
			rootfs:  true,
		},
		{
			name:    "another umoci rebuilds every image",
			change:  func(t *testing.T, _ *sandbox) { t.Setenv("FAKE_UMOCI_VERSION", "0.5-fake") },
			rebuilt: names,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t)
			ctx := context.Background()
			before, err := Images(ctx, s.root, nil, names...)
			if err != nil {
				t.Fatal(err)
			}
			calls := s.calls(t)
			if !strings.Contains(calls, "mmdebstrap ") {
				t.Fatalf("no root filesystem was built:\n%s", calls)
			}
			for _, name := range names {
				if !strings.Contains(calls, "umoci init --layout") || !exists(before[name]) {
					t.Fatalf("%s's image was not built at %s:\n%s", name, before[name], calls)
				}
			}

			tc.change(t, s)
			after, err := Images(ctx, s.root, nil, names...)
			if err != nil {
				t.Fatal(err)
			}
			calls = s.calls(t)
			if got := strings.Contains(calls, "mmdebstrap "); got != tc.rootfs {
				t.Errorf("root filesystem built again: %v, want %v:\n%s", got, tc.rootfs, calls)
			}
			if len(tc.rebuilt) == 0 && strings.Contains(calls, "umoci init") {
				t.Errorf("an image was packed again with none of its inputs changed:\n%s", calls)
			}
			for _, name := range names {
				want := false
				for _, r := range tc.rebuilt {
					want = want || r == name
				}
				switch {
				case want && after[name] == before[name]:
					t.Errorf("%s: the key did not change, %s would be reused", name, before[name])
				case want && !exists(after[name]):
					t.Errorf("%s: printed %s, which is not there", name, after[name])
				case !want && after[name] != before[name]:
					t.Errorf("%s: the key changed (%s, was %s) with none of its inputs", name, after[name], before[name])
				}
				if filepath.Dir(filepath.Dir(after[name])) != filepath.Join(s.cache, "images") {
					t.Errorf("%s: archive %s outside %s", name, after[name], filepath.Join(s.cache, "images"))
				}
			}
			if tag := os.Getenv("TAG"); tag != "" && filepath.Base(after["shardproxy"]) != "shardproxy-"+tag+".tar" {
				t.Errorf("shardproxy's archive is %s, want the tag %s in its name", after["shardproxy"], tag)
			}
		})
	}
}

// TestShardproxyImageCapabilities: `make image` gives file capabilities to the
// supervisor and nft and to nothing else in the shardproxy image, no iptables binary
// among them (xtables-nft-multi serves every applet whatever its file is named; the
// supervisor passes its own capability to iptables-nft-save, legacy/caps.go).
func TestShardproxyImageCapabilities(t *testing.T) {
	s := newSandbox(t)
	if _, err := Images(context.Background(), s.root, nil, "shardproxy"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(s.calls(t), "\n") {
		if rest, ok := strings.CutPrefix(line, "setcap "); ok {
			caps, file, _ := strings.Cut(rest, " ")
			// The file inside the image: the script sets them on a copy of the root.
			_, inImage, _ := strings.Cut(file, "/shardproxy-root")
			got = append(got, caps+" "+inImage)
		}
	}
	if want := []string{"cap_net_admin=ep /usr/local/bin/shardproxy", "cap_net_admin=ep /usr/sbin/nft"}; !slices.Equal(got, want) {
		t.Errorf("make image runs setcap %q, want exactly %q", got, want)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestUnusedKeysPruned checks what a build removes: entries of other keys of the same
// artifact unused for longer than the scripts keep them (a week for binaries, a day for
// images), and nothing else: not recent ones (another checkout may use them), not other
// artifacts, not files of other shapes.
func TestUnusedKeysPruned(t *testing.T) {
	s := newSandbox(t)
	ctx := context.Background()
	bin := filepath.Join(s.cache, "bin")
	images := filepath.Join(s.cache, "images")
	old := time.Now().Add(-9 * 24 * time.Hour)
	entries := map[string]bool{ // path: pruned
		filepath.Join(bin, "coredns-v1.14.6-0123456789abcdef"):        true,
		filepath.Join(bin, "coredns-v1.14.7-fedcba9876543210"):        true,
		filepath.Join(bin, "kube-apiserver-v1.36.3-0123456789abcdef"): false, // not built now
		filepath.Join(bin, "coredns-v1.14.7"):                         false, // not of a key
		filepath.Join(images, "pause-0123456789abcdef"):               true,
		filepath.Join(images, "pausefoo-0123456789abcdef"):            false,
		filepath.Join(images, "shardproxy-0123456789abcdef"):          false, // not built now
		filepath.Join(images, "pause-3.10.tar"):                       false,
	}
	for path := range entries {
		writeFile(t, path, "old", 0o755)
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	recent := filepath.Join(bin, "coredns-v1.14.7-aaaaaaaaaaaaaaaa")
	writeFile(t, recent, "recent", 0o755)
	entries[recent] = false

	if _, err := Binaries(ctx, s.root, nil, "coredns"); err != nil {
		t.Fatal(err)
	}
	if _, err := Images(ctx, s.root, nil, "pause"); err != nil {
		t.Fatal(err)
	}
	for path, pruned := range entries {
		if got := !exists(path); got != pruned {
			t.Errorf("%s removed: %v, want %v", path, got, pruned)
		}
	}
}

func TestHelmKeyFollowsInputs(t *testing.T) {
	const pin = "helm.sh/helm/v3 v3.21.4"
	for _, tc := range []struct {
		name    string
		change  func(t *testing.T, s *sandbox)
		rebuilt bool
		// version is what go install must name once the change is made.
		version string
	}{
		{
			name:    "nothing changed: reused",
			change:  func(*testing.T, *sandbox) {},
			version: "v3.21.4",
		},
		{
			name:    "the version go.mod requires rebuilds it at that version",
			change:  func(t *testing.T, s *sandbox) { s.edit(t, "go.mod", pin, "helm.sh/helm/v3 v3.22.0") },
			rebuilt: true,
			version: "v3.22.0",
		},
		{
			name:    "another Go version rebuilds it",
			change:  func(t *testing.T, _ *sandbox) { t.Setenv("FAKE_GOVERSION", "go1.99.0") },
			rebuilt: true,
			version: "v3.21.4",
		},
		{
			name: "comments and the shared cache plumbing rebuild nothing",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/build-helm.sh", "names it, and the Kubernetes version", "names it, and the Kubernetes minor version")
				s.edit(t, "hack/lib/cache.sh", "another build is running, waiting for it", "a build is running: waiting")
			},
			version: "v3.21.4",
		},
		{
			name: "a command in the recipe rebuilds it",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/build-helm.sh", `CGO_ENABLED=0 GOBIN="${gobin}" go install -trimpath`, `CGO_ENABLED=0 GOBIN="${gobin}" go install`)
			},
			rebuilt: true,
			version: "v3.21.4",
		},
		{
			name: "the ldflags in the script rebuild it",
			change: func(t *testing.T, s *sandbox) {
				s.edit(t, "hack/build-helm.sh", `ldflags="-s -w `, `ldflags="-w `)
			},
			rebuilt: true,
			version: "v3.21.4",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t)
			repo, err := RepoRoot("")
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"go.mod", "hack/build-helm.sh"} {
				mode := os.FileMode(0o644)
				if strings.HasSuffix(f, ".sh") {
					mode = 0o755
				}
				writeFile(t, filepath.Join(s.root, f), read(t, filepath.Join(repo, f)), mode)
			}
			// The test pins its own version: the repository's may move on.
			data := read(t, filepath.Join(s.root, "go.mod"))
			for _, line := range strings.Split(data, "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "helm.sh/helm/v3" {
					s.edit(t, "go.mod", strings.TrimSpace(line), pin)
				}
			}
			// Helm's go.mod in the module cache names its client-go (the Kubernetes
			// version stamped into the binary): v0.36 for v3.21.4, v0.37 for v3.22.0.
			modcache := t.TempDir()
			t.Setenv("GOMODCACHE", modcache)
			for version, clientGo := range map[string]string{"v3.21.4": "v0.36.2", "v3.22.0": "v0.37.0"} {
				writeFile(t, filepath.Join(modcache, "cache/download/helm.sh/helm/v3/@v", version+".mod"),
					"module helm.sh/helm/v3\n\nrequire (\n\tk8s.io/api "+clientGo+"\n\tk8s.io/client-go "+clientGo+"\n)\n", 0o644)
			}
			ctx := context.Background()
			before, err := Helm(ctx, s.root, nil)
			if err != nil {
				t.Fatal(err)
			}
			calls := s.calls(t)
			if !strings.Contains(calls, "go install ") || !strings.HasPrefix(before, filepath.Join(s.cache, "bin", "helm-v3.21.4-")) {
				t.Fatalf("not built into the cache as helm-v3.21.4-KEY (%s):\n%s", before, calls)
			}
			old := read(t, before)

			tc.change(t, s)
			after, err := Helm(ctx, s.root, nil)
			if err != nil {
				t.Fatal(err)
			}
			calls = s.calls(t)
			installed := strings.Contains(calls, "go install ")
			switch {
			case tc.rebuilt && after == before:
				t.Errorf("the key did not change, %s would be reused", before)
			case tc.rebuilt && !installed:
				t.Errorf("not rebuilt into %s:\n%s", after, calls)
			case !tc.rebuilt && (after != before || installed):
				t.Errorf("rebuilt (%s, was %s) with none of its inputs changed:\n%s", after, before, calls)
			}
			if !strings.HasPrefix(filepath.Base(after), "helm-"+tc.version+"-") {
				t.Errorf("cached as %s, want helm-%s-KEY", after, tc.version)
			}
			// The binary is Helm's module at go.mod's version, stamped with it and with its
			// client-go's Kubernetes version, as Helm's release build does.
			minor := map[string]string{"v3.21.4": "36", "v3.22.0": "37"}[tc.version]
			want := []string{"helm.sh/helm/v3/cmd/helm@" + tc.version, "-X helm.sh/helm/v3/internal/version.version=" + tc.version,
				"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=" + minor}
			for _, w := range want {
				if got := read(t, after); !strings.Contains(got, w) {
					t.Errorf("the binary was built without %q: %s", w, got)
				}
			}
			if tc.rebuilt && read(t, before) != old {
				t.Errorf("the binary of the old key was overwritten")
			}
		})
	}
}
