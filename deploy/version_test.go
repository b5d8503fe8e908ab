package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// releaseImage is the image the release of the VERSION file is published as: `make
// print-image` with the Makefile's defaults.
const releaseRepository = "ghcr.io/shardproxy/shardproxy"

// repoVersion reads the release version (../VERSION).
func repoVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(data))
	if v == "" || strings.ContainsAny(v, " \t\n:/") {
		t.Fatalf("VERSION %q is not a tag", v)
	}
	return v
}

// checkImages: every container of the DaemonSet runs the release's image, fully
// qualified and tagged, never a bare name that resolves to docker.io/library/...:latest.
func checkImages(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	want := releaseRepository + ":" + repoVersion(t)
	pod := ds.Spec.Template.Spec
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		if c.Image != want {
			t.Errorf("container %s runs image %q, want the release's %q", c.Name, c.Image, want)
		}
	}
}

// TestOverlaysNameTheImage: each overlay names the image in its own kustomize images:
// (the knob for a private registry, deploy/README.md), at the release's tag.
func TestOverlaysNameTheImage(t *testing.T) {
	for _, k := range kustomizations {
		if k.dir == "base" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(k.dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var kust struct {
			Images []struct{ Name, NewName, NewTag string }
		}
		if err := yaml.Unmarshal(data, &kust); err != nil {
			t.Fatalf("%s: %v", k.dir, err)
		}
		if len(kust.Images) != 1 || kust.Images[0].Name != releaseRepository || kust.Images[0].NewTag != repoVersion(t) {
			t.Errorf("%s: images %+v, want one entry naming %s with newTag %s", k.dir, kust.Images, releaseRepository, repoVersion(t))
		}
	}
}

// TestVersionMatchesImageTag: `make build` stamps the binary with VERSION, `make
// print-image` tags the image with it, and the manifests run that tag, so `shardproxy
// version` in a pod says which image it is.
func TestVersionMatchesImageTag(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		testutil.Unavailable(t, "make is not installed")
	}
	v := repoVersion(t)
	out, err := exec.Command("make", "-s", "-C", "..", "print-image").Output()
	if err != nil {
		t.Fatalf("make print-image: %v", err)
	}
	if got, want := strings.TrimSpace(string(out)), releaseRepository+":"+v; got != want {
		t.Errorf("make print-image: %q, want %q", got, want)
	}
	bin := filepath.Join(t.TempDir(), "shardproxy")
	if out, err := exec.Command("make", "-s", "-C", "..", "build", "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("shardproxy version: %v", err)
	}
	// "shardproxy v0.1.0 (commit <the checkout's>, go1.26.8)": the version is the image tag.
	commit, err := exec.Command("git", "-C", "..", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	if got, want := strings.TrimSpace(string(out)), "shardproxy "+v+" (commit "+strings.TrimSpace(string(commit)); !strings.HasPrefix(got, want) {
		t.Errorf("shardproxy version: %q, want %q... (the image tag, and the commit)", got, want)
	}
}
