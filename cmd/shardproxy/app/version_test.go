package app

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestVersionLine(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}
	}
	for _, tc := range []struct {
		name, version, commit string
		info                  *debug.BuildInfo
		want                  string
	}{
		{name: "a release names its version and commit", version: "v0.2.0", commit: "0123456789ab", info: vcs("ffff", "false"),
			want: "shardproxy v0.2.0 (commit 0123456789ab, " + runtime.Version() + ")"},
		{name: "a development build says so, with Go's recorded commit", version: "dev", info: vcs("abcdef", "false"),
			want: "shardproxy dev (a development build, not a release; commit abcdef, " + runtime.Version() + ")"},
		{name: "uncommitted changes are dirty", version: "dev", info: vcs("abcdef", "true"),
			want: "shardproxy dev (a development build, not a release; commit abcdef-dirty, " + runtime.Version() + ")"},
		{name: "no commit known", version: "v0.2.0", info: &debug.BuildInfo{},
			want: "shardproxy v0.2.0 (commit unknown, " + runtime.Version() + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionLine(tc.version, tc.commit, tc.info); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
