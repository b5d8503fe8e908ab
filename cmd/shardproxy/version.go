package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version and commit are set at build time: -ldflags "-X main.version=v0.1.0 -X
// main.commit=<git commit>" (`make release`, hack/release.sh). A binary built without
// them is a development build and says so.
var (
	version = "dev"
	commit  = ""
)

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

func printVersion(w io.Writer) {
	info, _ := debug.ReadBuildInfo()
	fmt.Fprintln(w, versionLine(version, commit, info))
}
