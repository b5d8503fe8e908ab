package main

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fakeLayout writes a one-image OCI layout as umoci leaves it, for an image whose
// configuration says arch, and returns its directory.
func fakeLayout(t *testing.T, arch string) string {
	t.Helper()
	dir := t.TempDir()
	cfg, err := writeBlob(dir, "application/vnd.oci.image.config.v1+json", []byte(`{"architecture":"`+arch+`","os":"linux"}`))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := writeBlob(dir, "application/vnd.oci.image.layer.v1.tar+gzip", []byte("layer of "+arch))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaTypeManifest, "config": cfg, "layers": []descriptor{layer}})
	md, err := writeBlob(dir, mediaTypeManifest, m)
	if err != nil {
		t.Fatal(err)
	}
	md.Annotations = map[string]string{annotationRefName: "v9.9.9"}
	idx, _ := json.Marshal(index{SchemaVersion: 2, Manifests: []descriptor{md}})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), idx, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestImageIndex(t *testing.T) {
	amd, arm := fakeLayout(t, "amd64"), fakeLayout(t, "arm64")
	for _, tc := range []struct {
		name      string
		layouts   [][2]string
		breakBlob bool
		wantErr   string
		wantPlats []platform
	}{
		{name: "both architectures in one index", layouts: [][2]string{{"amd64", amd}, {"arm64", arm}},
			wantPlats: []platform{{"amd64", "linux"}, {"arm64", "linux"}}},
		{name: "a layout for another architecture than named is refused", layouts: [][2]string{{"amd64", arm}}, wantErr: "not linux/amd64"},
		{name: "a blob whose content is not its digest fails the check", layouts: [][2]string{{"amd64", amd}}, breakBlob: true, wantErr: "holds content of digest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			digest, err := writeIndex(out, "v9.9.9", tc.layouts)
			if err == nil && tc.breakBlob {
				var top index
				data, _ := os.ReadFile(filepath.Join(out, "index.json"))
				_ = json.Unmarshal(data, &top)
				p, _ := blobPath(out, top.Manifests[0].Digest)
				err = os.WriteFile(p, []byte(`{"manifests":[]}`), 0o644)
			}
			if err == nil {
				var plats []platform
				var got string
				got, plats, err = imageIndex(out, "v9.9.9")
				if err == nil {
					if got != digest {
						t.Errorf("imageIndex digest %s, writeIndex said %s", got, digest)
					}
					if len(plats) != len(tc.wantPlats) || plats[0] != tc.wantPlats[0] || len(plats) > 1 && plats[1] != tc.wantPlats[1] {
						t.Errorf("platforms %v, want %v", plats, tc.wantPlats)
					}
				}
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestPinImages(t *testing.T) {
	const digest = "sha256:ab0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd"
	for _, tc := range []struct {
		name, in string
		wantN    int
		want     []string
		wantNot  []string
	}{
		{name: "an overlay's entry: digest for newTag, comments kept",
			in:    "# the image\nimages:\n- name: ghcr.io/shardproxy/shardproxy # knob\n  newName: ghcr.io/shardproxy/shardproxy\n  newTag: v0.1.0\n",
			wantN: 1, want: []string{"digest: " + digest, "# the image", "# knob"}, wantNot: []string{"newTag"}},
		{name: "the base's entry names the image by newName",
			in:    "images:\n- name: shardproxy\n  newName: ghcr.io/shardproxy/shardproxy\n  newTag: v0.1.0\n",
			wantN: 1, want: []string{"name: shardproxy", "digest: " + digest}},
		{name: "another image is left alone",
			in:    "images:\n- name: registry.example/other\n  newTag: v1\n",
			wantN: 0, want: []string{"newTag: v1"}, wantNot: []string{"digest"}},
		{name: "no images", in: "resources:\n- a.yaml\n", wantN: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, n, err := pinImages([]byte(tc.in), "ghcr.io/shardproxy/shardproxy", digest)
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.wantN {
				t.Errorf("pinned %d, want %d", n, tc.wantN)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("no %q in:\n%s", w, out)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(string(out), w) {
					t.Errorf("%q in:\n%s", w, out)
				}
			}
		})
	}
}

// TestPinnedReleaseDeploy pins the repository's deploy/ and renders every overlay: each
// container runs the image by digest, and the chart packaged with the digest does too.
func TestPinnedReleaseDeploy(t *testing.T) {
	const digest = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	out := t.TempDir()
	if err := pinOverlays("../../deploy", filepath.Join(out, "deploy"), repository, digest); err != nil {
		t.Fatal(err)
	}
	if err := verifyPinned(filepath.Join(out, "deploy"), repository+"@"+digest); err != nil {
		t.Error(err)
	}
	if err := verifyPinned(filepath.Join(out, "deploy"), repository+"@sha256:other"); err == nil {
		t.Error("verifyPinned accepts another digest")
	}
	date := time.Unix(1_800_000_000, 0).UTC()
	path, err := packageChart("../../deploy/helm/shardproxy", out, "v9.9.9", digest, date)
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // Helm dates entries by the second
	if _, err := packageChart("../../deploy/helm/shardproxy", out, "v9.9.9", digest, date); err != nil {
		t.Fatal(err)
	}
	if again, err := os.ReadFile(path); err != nil || !bytes.Equal(first, again) {
		t.Errorf("the chart packaged twice differs (%v): its entries are not dated by the release", err)
	}
	if filepath.Base(path) != "shardproxy-9.9.9.tgz" {
		t.Errorf("chart packaged as %s", path)
	}
	if err := verifyChart(path, "v9.9.9", repository+"@"+digest); err != nil {
		t.Error(err)
	}
	if err := verifyChart(path, "v9.9.8", repository+"@"+digest); err == nil {
		t.Error("verifyChart accepts another version")
	}
}

func TestVerifyBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	native := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]
	other := elf.EM_AARCH64
	if native == elf.EM_AARCH64 {
		other = elf.EM_X86_64
	}
	says := func(out string, err error) runner {
		return func(string, string, ...string) (string, error) { return out, err }
	}
	for _, tc := range []struct {
		name    string
		machine elf.Machine
		run     runner
		wantErr string
	}{
		{name: "an ELF of its architecture reporting the version", machine: native, run: says("shardproxy v9.9.9 (commit abc, go1.26)\n", nil)},
		{name: "an ELF of another architecture", machine: other, run: says("shardproxy v9.9.9 (commit abc, go1.26)\n", nil), wantErr: "is an ELF for"},
		{name: "a development build", machine: native, run: says("shardproxy dev (a development build, not a release; commit abc)\n", nil), wantErr: `want "shardproxy v9.9.9 (commit abc"`},
		{name: "another commit", machine: native, run: says("shardproxy v9.9.9 (commit def, go1.26)\n", nil), wantErr: "want"},
		{name: "a binary that does not run", machine: native, run: says("", errors.New("exec format error")), wantErr: "exec format error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := verifyBinary(self, "x", tc.machine, "v9.9.9", "abc", tc.run)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestDpkgInstalled(t *testing.T) {
	root := t.TempDir()
	status := "Package: nftables\nStatus: install ok installed\nArchitecture: arm64\nVersion: 1.0.6-2+deb12u2\nDescription: x\n more\n\n" +
		"Package: gone\nStatus: deinstall ok config-files\nArchitecture: arm64\nVersion: 1\n\n" +
		"Package: libc6\nStatus: install ok installed\nArchitecture: arm64\nVersion: 2.36-9\n"
	if err := os.MkdirAll(filepath.Join(root, "var/lib/dpkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := dpkgInstalled(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []debPackage{{"nftables", "1.0.6-2+deb12u2", "arm64"}, {"libc6", "2.36-9", "arm64"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestSums(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"a": "1", "bin/b": "2"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSums(dir); err != nil {
		t.Fatal(err)
	}
	if err := verifySums(dir); err != nil {
		t.Fatalf("fresh sums: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/b"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new"), []byte("3"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := verifySums(dir)
	if err == nil || !strings.Contains(err.Error(), "bin/b is") || !strings.Contains(err.Error(), `new is`) {
		t.Errorf("err = %v, want bin/b and new named", err)
	}
}
