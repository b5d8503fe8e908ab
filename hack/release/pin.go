package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

// pinnedDirs are the kustomizations of deploy/ a release ships, with what they reach.
var pinnedDirs = []string{"base", "overlays", "cleanup", "monitoring", "node-addresses"}

// pinOverlays copies deploy/'s kustomizations to out with every images: entry of the
// release's image pinned to digest (kustomize's digest field, in place of newTag), the
// comments kept.
func pinOverlays(src, out, image, digest string) error {
	if src == "" || out == "" || image == "" || !strings.HasPrefix(digest, "sha256:") {
		return errors.New("want -src, -out, -image and -digest sha256:...")
	}
	pinned := 0
	for _, d := range pinnedDirs {
		err := filepath.WalkDir(filepath.Join(src, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(src, path)
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if e.Name() == "kustomization.yaml" {
				var n int
				if data, n, err = pinImages(data, image, digest); err != nil {
					return fmt.Errorf("%s: %w", rel, err)
				}
				pinned += n
			}
			dst := filepath.Join(out, rel)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			return os.WriteFile(dst, data, 0o644)
		})
		if err != nil {
			return err
		}
	}
	if pinned == 0 {
		return fmt.Errorf("no images: entry of %s in %s", image, src)
	}
	return nil
}

// pinImages sets digest on the images: entries of a kustomization that name image (as
// name or newName) and removes their newTag; it returns how many it pinned.
func pinImages(data []byte, image, digest string) ([]byte, int, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, 0, err
	}
	if len(doc.Content) == 0 {
		return data, 0, nil
	}
	images := mapValue(doc.Content[0], "images")
	if images == nil {
		return data, 0, nil
	}
	n := 0
	for _, entry := range images.Content {
		name, newName := mapValue(entry, "name"), mapValue(entry, "newName")
		if !(name != nil && name.Value == image || newName != nil && newName.Value == image) {
			continue
		}
		for i := 0; i+1 < len(entry.Content); i += 2 {
			if entry.Content[i].Value == "newTag" || entry.Content[i].Value == "digest" {
				entry.Content = append(entry.Content[:i], entry.Content[i+2:]...)
				i -= 2
			}
		}
		entry.Content = append(entry.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Value: "digest"},
			&yaml.Node{Kind: yaml.ScalarNode, Value: digest})
		n++
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, 0, err
	}
	return b.Bytes(), n, nil
}

// mapValue returns the value of key in a mapping node, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// packageChart packages the chart at src into out as `helm package` would, with the
// release's version and the image pinned to digest by default, every entry dated mtime
// (Helm dates them now: the same release would differ from one build to the next); it
// returns the archive's path.
func packageChart(src, out, version, digest string, mtime time.Time) (string, error) {
	if src == "" || out == "" || version == "" || !strings.HasPrefix(digest, "sha256:") {
		return "", errors.New("want -src, -out, -version and -digest sha256:...")
	}
	ch, err := loader.Load(src)
	if err != nil {
		return "", err
	}
	ch.Metadata.Version = strings.TrimPrefix(version, "v")
	ch.Metadata.AppVersion = version
	const unpinned = "  digest: \"\"\n"
	for _, f := range ch.Raw {
		if f.Name != chartutil.ValuesfileName {
			continue
		}
		if bytes.Count(f.Data, []byte(unpinned)) != 1 {
			return "", fmt.Errorf("%s/values.yaml: want one line %q to pin", src, strings.TrimSpace(unpinned))
		}
		f.Data = bytes.Replace(f.Data, []byte(unpinned), []byte("  digest: \""+digest+"\"\n"), 1)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	path, err := chartutil.Save(ch, out)
	if err != nil {
		return "", err
	}
	return path, redate(path, mtime)
}

// redate rewrites the gzipped tar archive at path with every entry, and the gzip
// header, dated mtime.
func redate(path string, mtime time.Time) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.ModTime = mtime
	tw := tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		h.ModTime, h.AccessTime, h.ChangeTime = mtime, time.Time{}, time.Time{}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
