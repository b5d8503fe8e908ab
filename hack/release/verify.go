package main

import (
	"bufio"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// Release is the image repository a release is published to.
const repository = "ghcr.io/shardproxy/shardproxy"

// architectures are those a release builds, with their ELF machine.
var architectures = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// sumsFile lists the sha256 of every other file of the release.
const sumsFile = "SHA256SUMS"

// writeSums writes dir/SHA256SUMS, in sha256sum's format, of every file below dir.
func writeSums(dir string) error {
	files, err := releaseFiles(dir)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, f := range files {
		sum, err := fileSum(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, f)
	}
	return os.WriteFile(filepath.Join(dir, sumsFile), []byte(b.String()), 0o644)
}

// releaseFiles lists the files below dir but SHA256SUMS, by path, sorted.
func releaseFiles(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if rel != sumsFile {
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// runner runs a binary of an architecture with args and returns its output.
type runner func(arch, bin string, args ...string) (string, error)

// runBinary runs bin natively, or under QEMU's user-mode emulator for another
// architecture (qemu-<machine>-static, Debian's qemu-user-static).
func runBinary(arch, bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	if arch != runtime.GOARCH {
		emu := map[string]string{"arm64": "qemu-aarch64-static", "amd64": "qemu-x86_64-static"}[arch]
		path, err := exec.LookPath(emu)
		if err != nil {
			return "", fmt.Errorf("running a linux/%s binary on linux/%s needs %s (apt-get install qemu-user-static): %w", arch, runtime.GOARCH, emu, err)
		}
		cmd = exec.Command(path, append([]string{bin}, args...)...)
	}
	out, err := cmd.Output()
	return string(out), err
}

// verify checks a release directory: the image index holds an image for each of the
// architectures, each binary is an ELF of its architecture that reports the version and
// commit, the SBOM lists the Go modules and the Debian packages of both, the overlays and
// the chart run the image by its digest, and every file has its checksum.
func verify(dir, version, commit string, run runner) error {
	if dir == "" || version == "" || commit == "" {
		return errors.New("want -dir, -version and -commit")
	}
	var errs []error
	digest, plats, err := imageIndex(filepath.Join(dir, "image"), version)
	if err != nil {
		return fmt.Errorf("the image: %w", err)
	}
	for arch, machine := range architectures {
		if !slices.Contains(plats, platform{Architecture: arch, OS: "linux"}) {
			errs = append(errs, fmt.Errorf("the image index %s holds no linux/%s image (it has %v)", digest, arch, plats))
		}
		errs = append(errs, verifyBinary(filepath.Join(dir, "bin", "shardproxy-linux-"+arch), arch, machine, version, commit, run))
	}
	errs = append(errs, verifySBOM(filepath.Join(dir, "sbom.spdx.json")))
	errs = append(errs, verifyPinned(filepath.Join(dir, "deploy"), repository+"@"+digest))
	errs = append(errs, verifyChart(filepath.Join(dir, "shardproxy-"+strings.TrimPrefix(version, "v")+".tgz"), version, repository+"@"+digest))
	errs = append(errs, verifySums(dir))
	return errors.Join(errs...)
}

// verifyBinary: an ELF for machine that, run, prints "shardproxy <version> (commit <commit>".
func verifyBinary(bin, arch string, machine elf.Machine, version, commit string, run runner) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("the %s binary: %w", arch, err)
	}
	m := f.Machine
	f.Close()
	if m != machine {
		return fmt.Errorf("the %s binary is an ELF for %v, not %v", arch, m, machine)
	}
	out, err := run(arch, bin, "--version")
	if err != nil {
		return fmt.Errorf("the %s binary's --version: %w", arch, err)
	}
	if want := "shardproxy " + version + " (commit " + commit; !strings.HasPrefix(out, want) {
		return fmt.Errorf("the %s binary's --version says %q, want %q...", arch, strings.TrimSpace(out), want)
	}
	return nil
}

// verifySBOM: the SPDX document lists, for every architecture, its binary's Go modules
// and its Debian packages.
func verifySBOM(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc spdxDocument
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var errs []error
	for arch := range architectures {
		var mods, debs int
		for _, p := range doc.Packages {
			switch {
			case strings.HasPrefix(p.SPDXID, "SPDXRef-go-"+arch+"-"):
				mods++
			case strings.HasPrefix(p.SPDXID, "SPDXRef-deb-"+arch+"-"):
				debs++
			}
		}
		if mods == 0 || debs == 0 {
			errs = append(errs, fmt.Errorf("the SBOM lists %d Go modules and %d Debian packages for %s", mods, debs, arch))
		}
	}
	return errors.Join(errs...)
}

// verifyPinned: every kustomization of the release that runs the image runs it as image.
func verifyPinned(deploy, image string) error {
	var errs []error
	checked := 0
	for _, dir := range []string{"overlays/alongside-kube-proxy", "overlays/replace-kube-proxy", "cleanup", "monitoring/example", "node-addresses/example", "monitoring/example-node-addresses"} {
		res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(deploy, dir))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range res.Resources() {
			if r.GetKind() != "DaemonSet" && r.GetKind() != "Deployment" {
				continue
			}
			for _, field := range []string{"initContainers", "containers"} {
				cs, _ := r.GetSlice("spec.template.spec." + field)
				for _, c := range cs {
					img := c.(map[string]any)["image"]
					checked++
					if img != image {
						errs = append(errs, fmt.Errorf("deploy/%s: %s %v runs %v, not %s", dir, r.GetName(), c.(map[string]any)["name"], img, image))
					}
				}
			}
		}
	}
	if checked == 0 {
		errs = append(errs, errors.New("no container in the release's overlays"))
	}
	return errors.Join(errs...)
}

// verifyChart: the packaged chart has the release's version and runs the image by digest,
// in the DaemonSet and in the node address writer's Deployment (rendered with
// nodeAddresses.enabled, which the default leaves off).
func verifyChart(path, version, image string) error {
	ch, err := loader.Load(path)
	if err != nil {
		return err
	}
	if ch.Metadata.AppVersion != version || ch.Metadata.Version != strings.TrimPrefix(version, "v") {
		return fmt.Errorf("%s: version %s appVersion %s", path, ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	values := map[string]any{"nodeAddresses": map[string]any{"enabled": true}}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: "shardproxy", Namespace: "kube-system", IsInstall: true}, nil)
	if err != nil {
		return err
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return err
	}
	type workload struct {
		Kind string
		Spec struct {
			Template struct {
				Spec struct{ Containers []struct{ Image string } }
			}
		}
	}
	var errs []error
	for _, want := range []struct{ file, kind string }{
		{"shardproxy/templates/daemonset.yaml", "DaemonSet"},
		{"shardproxy/templates/node-addresses.yaml", "Deployment"},
	} {
		found := false
		for _, doc := range releaseutil.SplitManifests(files[want.file]) {
			var w workload
			if err := sigsyaml.Unmarshal([]byte(doc), &w); err != nil {
				return fmt.Errorf("%s: %s: %w", path, want.file, err)
			}
			if w.Kind != want.kind {
				continue
			}
			found = true
			if cs := w.Spec.Template.Spec.Containers; len(cs) == 0 || cs[0].Image != image {
				errs = append(errs, fmt.Errorf("%s: the %s of %s runs %+v, not %s", path, want.kind, want.file, cs, image))
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("%s: %s renders no %s", path, want.file, want.kind))
		}
	}
	return errors.Join(errs...)
}

// verifySums: SHA256SUMS lists every other file, each with its sum.
func verifySums(dir string) error {
	f, err := os.Open(filepath.Join(dir, sumsFile))
	if err != nil {
		return err
	}
	defer f.Close()
	listed := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			return fmt.Errorf("%s: bad line %q", sumsFile, sc.Text())
		}
		listed[name] = sum
	}
	files, err := releaseFiles(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range files {
		sum, err := fileSum(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if listed[name] != sum {
			errs = append(errs, fmt.Errorf("%s: %s is %s, listed as %q", sumsFile, name, sum, listed[name]))
		}
		delete(listed, name)
	}
	for name := range listed {
		errs = append(errs, fmt.Errorf("%s lists %s, which is not there", sumsFile, name))
	}
	return errors.Join(errs...)
}
