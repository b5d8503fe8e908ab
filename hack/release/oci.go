package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// OCI media types and the annotation naming a reference in a layout's index.json.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	annotationRefName = "org.opencontainers.image.ref.name"
)

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// index is an OCI image index (and a layout's index.json).
type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Manifests     []descriptor `json:"manifests"`
}

// manifest is the part of an OCI image manifest the release reads.
type manifest struct {
	Config descriptor   `json:"config"`
	Layers []descriptor `json:"layers"`
}

// imageConfig is the part of an OCI image configuration the release reads.
type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// blobPath is where a layout keeps the blob of digest.
func blobPath(layout, digest string) (string, error) {
	alg, hexd, ok := strings.Cut(digest, ":")
	if !ok || alg != "sha256" || len(hexd) != 64 {
		return "", fmt.Errorf("digest %q: want sha256:<64 hex digits>", digest)
	}
	return filepath.Join(layout, "blobs", alg, hexd), nil
}

// readBlob reads a blob of layout and checks it against its digest.
func readBlob(layout, digest string) ([]byte, error) {
	p, err := blobPath(layout, digest)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	if got := digestOf(data); got != digest {
		return nil, fmt.Errorf("blob %s holds content of digest %s", digest, got)
	}
	return data, nil
}

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// writeBlob stores data in layout and returns its descriptor.
func writeBlob(layout, mediaType string, data []byte) (descriptor, error) {
	d := descriptor{MediaType: mediaType, Digest: digestOf(data), Size: int64(len(data))}
	p, _ := blobPath(layout, d.Digest)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return d, err
	}
	return d, os.WriteFile(p, data, 0o644)
}

// singleManifest returns the one image manifest of a layout umoci wrote for one
// architecture, and the platform its configuration names.
func singleManifest(layout string) (descriptor, platform, error) {
	var idx index
	data, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		return descriptor{}, platform{}, err
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return descriptor{}, platform{}, fmt.Errorf("%s/index.json: %w", layout, err)
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].MediaType != mediaTypeManifest {
		return descriptor{}, platform{}, fmt.Errorf("%s: want one image manifest in index.json, have %d", layout, len(idx.Manifests))
	}
	d := idx.Manifests[0]
	p, err := manifestPlatform(layout, d.Digest)
	return d, p, err
}

// manifestPlatform reads the platform from an image manifest's configuration.
func manifestPlatform(layout, digest string) (platform, error) {
	data, err := readBlob(layout, digest)
	if err != nil {
		return platform{}, err
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return platform{}, fmt.Errorf("manifest %s: %w", digest, err)
	}
	cfgData, err := readBlob(layout, m.Config.Digest)
	if err != nil {
		return platform{}, err
	}
	var cfg imageConfig
	if err := json.Unmarshal(cfgData, &cfg); err != nil {
		return platform{}, fmt.Errorf("config %s: %w", m.Config.Digest, err)
	}
	for _, l := range m.Layers {
		if p, err := blobPath(layout, l.Digest); err != nil {
			return platform{}, err
		} else if _, err := os.Stat(p); err != nil {
			return platform{}, fmt.Errorf("manifest %s: layer %s: %w", digest, l.Digest, err)
		}
	}
	return platform{Architecture: cfg.Architecture, OS: cfg.OS}, nil
}

// writeIndex merges one-architecture layouts (ARCH=LAYOUT) into a layout at out whose
// index.json names, as ref, an image index of every architecture; it returns that image
// index's digest, the image's digest for a registry.
func writeIndex(out, ref string, layouts [][2]string) (string, error) {
	if out == "" || ref == "" || len(layouts) == 0 {
		return "", errors.New("want -out, -ref and ARCH=LAYOUT arguments")
	}
	var img index
	img.SchemaVersion, img.MediaType = 2, mediaTypeIndex
	for _, l := range layouts {
		arch, layout := l[0], l[1]
		d, p, err := singleManifest(layout)
		if err != nil {
			return "", err
		}
		if p.Architecture != arch || p.OS != "linux" {
			return "", fmt.Errorf("%s: its image is for %s/%s, not linux/%s", layout, p.OS, p.Architecture, arch)
		}
		if err := copyBlobs(layout, out); err != nil {
			return "", err
		}
		img.Manifests = append(img.Manifests, descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size, Platform: &p})
	}
	data, err := json.Marshal(img)
	if err != nil {
		return "", err
	}
	d, err := writeBlob(out, mediaTypeIndex, data)
	if err != nil {
		return "", err
	}
	d.Annotations = map[string]string{annotationRefName: ref}
	top, err := json.Marshal(index{SchemaVersion: 2, Manifests: []descriptor{d}})
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(out, "index.json"), top, 0o644); err != nil {
		return "", err
	}
	return d.Digest, os.WriteFile(filepath.Join(out, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
}

// copyBlobs copies every blob of layout into out.
func copyBlobs(layout, out string) error {
	src := filepath.Join(layout, "blobs", "sha256")
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	dst := filepath.Join(out, "blobs", "sha256")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// imageIndex reads the image index a layout's index.json names as ref, checks every
// blob it reaches against its digest, and returns its digest and its platforms.
func imageIndex(layout, ref string) (string, []platform, error) {
	data, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		return "", nil, err
	}
	var top index
	if err := json.Unmarshal(data, &top); err != nil {
		return "", nil, err
	}
	i := slices.IndexFunc(top.Manifests, func(d descriptor) bool { return d.Annotations[annotationRefName] == ref })
	if i < 0 || top.Manifests[i].MediaType != mediaTypeIndex {
		return "", nil, fmt.Errorf("%s/index.json names no image index %q", layout, ref)
	}
	d := top.Manifests[i]
	data, err = readBlob(layout, d.Digest)
	if err != nil {
		return "", nil, err
	}
	var img index
	if err := json.Unmarshal(data, &img); err != nil {
		return "", nil, err
	}
	var plats []platform
	for _, m := range img.Manifests {
		if m.Platform == nil {
			return "", nil, fmt.Errorf("image index %s: manifest %s names no platform", d.Digest, m.Digest)
		}
		p, err := manifestPlatform(layout, m.Digest)
		if err != nil {
			return "", nil, err
		}
		if p != *m.Platform {
			return "", nil, fmt.Errorf("image index %s: manifest %s is listed for %s/%s, its configuration says %s/%s",
				d.Digest, m.Digest, m.Platform.OS, m.Platform.Architecture, p.OS, p.Architecture)
		}
		plats = append(plats, p)
	}
	return d.Digest, plats, nil
}
