package app

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Build is what the linker stamped into the binary: package main's version and commit,
// set at build time with -ldflags "-X main.version=v0.1.0 -X main.commit=<git commit>"
// (`make release`, hack/release.sh). A binary built without them is a development build
// and says so.
type Build struct {
	// Version is the release; "dev" or empty for a development build.
	Version string
	// Commit is the commit it was built from; empty if not stamped.
	Commit string
}

// version is b's version, "dev" for a development build.
func (b Build) version() string {
	if b.Version == "" {
		return "dev"
	}
	return b.Version
}

// versionLine is what `shardproxy --version` prints: the version, the commit it was built
// from and the Go version; a development build says it is one and names the commit Go's
// build information recorded, if any.
func versionLine(version, commit string, info *debug.BuildInfo) string {
	if commit == "" && info != nil {
		var modified bool
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if commit != "" && modified {
			commit += "-dirty"
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	if version == "dev" {
		return fmt.Sprintf("shardproxy dev (a development build, not a release; commit %s, %s)", commit, runtime.Version())
	}
	return fmt.Sprintf("shardproxy %s (commit %s, %s)", version, commit, runtime.Version())
}

// printVersion prints b's versionLine.
func printVersion(w io.Writer, b Build) {
	info, _ := debug.ReadBuildInfo()
	fmt.Fprintln(w, versionLine(b.version(), b.Commit, info))
}
