// Command release assembles and checks what `make release VERSION=...` publishes
// (hack/release.sh runs it): the multi-architecture OCI image index, the SBOM, the
// overlays pinned to the image's digest, the packaged chart, the checksums, and a check
// of the whole directory. Run from the repository's root.
//
//	release index  -out LAYOUT -ref VERSION ARCH=LAYOUT...
//	release sbom   -out FILE -version V -commit C -created RFC3339 ARCH=BINARY:ROOTFS...
//	release pin    -src deploy -out DIR -image REPOSITORY -digest sha256:...
//	release chart  -src deploy/helm/shardproxy -out DIR -version V -digest sha256:...
//	release sums   -dir DIR
//	release verify -dir DIR -version V -commit C
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: release index|sbom|pin|chart|sums|verify [flags]")
		return 2
	}
	fs := flag.NewFlagSet("release "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "output file or directory")
	dir := fs.String("dir", "", "the release directory")
	src := fs.String("src", "", "the source directory")
	ref := fs.String("ref", "", "the image's reference name (the version)")
	version := fs.String("version", "", "the release's version")
	commit := fs.String("commit", "", "the release's commit")
	created := fs.String("created", "", "the SBOM's creation time, RFC 3339 (the commit's)")
	image := fs.String("image", "", "the image's repository")
	digest := fs.String("digest", "", "the image index's digest")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	var err error
	switch args[0] {
	case "index":
		var d string
		if d, err = writeIndex(*out, *ref, pairs(fs.Args())); err == nil {
			fmt.Fprintln(stdout, d)
		}
	case "sbom":
		err = writeSBOM(*out, *version, *commit, *created, pairs(fs.Args()))
	case "pin":
		err = pinOverlays(*src, *out, *image, *digest)
	case "chart":
		var path string
		if path, err = packageChart(*src, *out, *version, *digest, sourceDate()); err == nil {
			fmt.Fprintln(stdout, path)
		}
	case "sums":
		err = writeSums(*dir)
	case "verify":
		err = verify(*dir, *version, *commit, runBinary)
		if err == nil {
			fmt.Fprintf(stdout, "release %s in %s: verified\n", *version, *dir)
		}
	default:
		fmt.Fprintf(stderr, "release: unknown command %q\n", args[0])
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "release %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// sourceDate is $SOURCE_DATE_EPOCH (hack/release.sh sets the commit's), else the epoch.
func sourceDate() time.Time {
	sec, _ := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	return time.Unix(sec, 0).UTC()
}

// pairs splits KEY=VALUE arguments, in order.
func pairs(args []string) [][2]string {
	out := make([][2]string, 0, len(args))
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		out = append(out, [2]string{k, v})
	}
	return out
}
