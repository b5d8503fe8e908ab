package main

import (
	"bufio"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// spdxDocument is an SPDX 2.3 document in JSON, as much of it as the release writes.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreation       `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name             string        `json:"name"`
	SPDXID           string        `json:"SPDXID"`
	VersionInfo      string        `json:"versionInfo,omitempty"`
	DownloadLocation string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	PrimaryPurpose   string        `json:"primaryPackagePurpose,omitempty"`
	ExternalRefs     []spdxExtRef  `json:"externalRefs,omitempty"`
	Comment          string        `json:"comment,omitempty"`
	Supplier         string        `json:"supplier,omitempty"`
	Checksums        []interface{} `json:"checksums,omitempty"`
}

type spdxExtRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// debPackage is an installed package of a root file system's dpkg status.
type debPackage struct{ Name, Version, Architecture string }

// dpkgInstalled reads the packages dpkg lists as installed in rootfs.
func dpkgInstalled(rootfs string) ([]debPackage, error) {
	f, err := os.Open(filepath.Join(rootfs, "var", "lib", "dpkg", "status"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []debPackage
	var cur debPackage
	var installed bool
	flush := func() {
		if installed && cur.Name != "" {
			out = append(out, cur)
		}
		cur, installed = debPackage{}, false
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		k, v, ok := strings.Cut(line, ": ")
		if !ok || strings.HasPrefix(line, " ") {
			continue
		}
		switch k {
		case "Package":
			cur.Name = v
		case "Version":
			cur.Version = v
		case "Architecture":
			cur.Architecture = v
		case "Status":
			installed = strings.HasSuffix(v, " installed")
		}
	}
	flush()
	return out, sc.Err()
}

// writeSBOM writes an SPDX document of the release: per architecture (ARCH=BINARY:ROOTFS)
// the image, the binary with the Go modules built into it, and the Debian packages of
// the root file system.
func writeSBOM(out, version, commit, created string, arches [][2]string) error {
	if out == "" || version == "" || len(arches) == 0 {
		return errors.New("want -out, -version and ARCH=BINARY:ROOTFS arguments")
	}
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              "shardproxy-" + version,
		DocumentNamespace: fmt.Sprintf("https://github.com/shardproxy/shardproxy/releases/%s/sbom-%s", version, commit),
		CreationInfo:      spdxCreation{Created: created, Creators: []string{"Tool: shardproxy hack/release"}},
	}
	rel := func(a, typ, b string) {
		doc.Relationships = append(doc.Relationships, spdxRelationship{a, typ, b})
	}
	for _, a := range arches {
		arch := a[0]
		bin, rootfs, ok := strings.Cut(a[1], ":")
		if !ok {
			return fmt.Errorf("%s=%s: want ARCH=BINARY:ROOTFS", a[0], a[1])
		}
		imageID := "SPDXRef-image-" + arch
		doc.Packages = append(doc.Packages, spdxPackage{
			Name: "shardproxy-image-linux-" + arch, SPDXID: imageID, VersionInfo: version, DownloadLocation: "NOASSERTION",
			PrimaryPurpose: "CONTAINER",
			ExternalRefs:   []spdxExtRef{{"PACKAGE-MANAGER", "purl", fmt.Sprintf("pkg:oci/shardproxy@%s?arch=%s&repository_url=ghcr.io/shardproxy", version, arch)}},
		})
		rel("SPDXRef-DOCUMENT", "DESCRIBES", imageID)
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			return fmt.Errorf("%s: %w", bin, err)
		}
		binID := "SPDXRef-binary-" + arch
		doc.Packages = append(doc.Packages, spdxPackage{
			Name: info.Main.Path, SPDXID: binID, VersionInfo: version, DownloadLocation: "https://github.com/shardproxy/shardproxy",
			PrimaryPurpose: "APPLICATION", Comment: fmt.Sprintf("/usr/local/bin/shardproxy, linux/%s, built with %s at commit %s", arch, info.GoVersion, commit),
			ExternalRefs: []spdxExtRef{{"PACKAGE-MANAGER", "purl", fmt.Sprintf("pkg:golang/%s@%s", info.Main.Path, version)}},
		})
		rel(imageID, "CONTAINS", binID)
		for i, dep := range info.Deps {
			m := dep
			if dep.Replace != nil {
				m = dep.Replace
			}
			id := fmt.Sprintf("SPDXRef-go-%s-%d", arch, i)
			doc.Packages = append(doc.Packages, spdxPackage{
				Name: m.Path, SPDXID: id, VersionInfo: m.Version, DownloadLocation: "NOASSERTION", PrimaryPurpose: "LIBRARY",
				ExternalRefs: []spdxExtRef{{"PACKAGE-MANAGER", "purl", fmt.Sprintf("pkg:golang/%s@%s", m.Path, m.Version)}},
			})
			rel(binID, "DEPENDS_ON", id)
		}
		debs, err := dpkgInstalled(rootfs)
		if err != nil {
			return fmt.Errorf("%s's Debian packages: %w", arch, err)
		}
		for i, d := range debs {
			id := fmt.Sprintf("SPDXRef-deb-%s-%d", arch, i)
			doc.Packages = append(doc.Packages, spdxPackage{
				Name: d.Name, SPDXID: id, VersionInfo: d.Version, DownloadLocation: "NOASSERTION", Supplier: "Organization: Debian",
				ExternalRefs: []spdxExtRef{{"PACKAGE-MANAGER", "purl", fmt.Sprintf("pkg:deb/debian/%s@%s?arch=%s&distro=debian-12", d.Name, d.Version, d.Architecture)}},
			})
			rel(imageID, "CONTAINS", id)
		}
	}
	data, err := json.MarshalIndent(doc, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}
