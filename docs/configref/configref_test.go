package configref

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/supervisor/config"
)

// TestConfigurationPageUpToDate fails when docs/configuration.md's reference is not what
// the configuration's types and example.yaml make of it today, or when a field has no
// doc comment or no line in example.yaml.
func TestConfigurationPageUpToDate(t *testing.T) {
	want, err := Page("../..", reflect.TypeFor[config.Config]())
	if err != nil {
		t.Fatalf("the configuration reference cannot be generated: %v", err)
	}
	got, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/configuration.md is not what the configuration's types and example.yaml make of it: run `make docs` and commit it")
	}
}

type lbSection struct {
	Mode string `yaml:"mode"`
}

type entry struct {
	Name    string           `yaml:"name"`
	Timeout *config.Duration `yaml:"timeout"`
	Hidden  string           `yaml:"-"`
	LB      lbSection        `yaml:"lb"`
}

type root struct {
	Kind    string   `yaml:"kind"`
	Entries []entry  `yaml:"entries"`
	CIDRs   []string `yaml:"cidrs,omitempty"`
	private string
}

func TestFields(t *testing.T) {
	all := FieldDocs{
		"root.Kind": "Kind is the kind.", "root.Entries": "Entries are the entries.",
		"root.CIDRs": "CIDRs are <ranges> | more.", "entry.Name": "Name names it.",
		"entry.Timeout": "Timeout bounds it. A pointer so that an explicit 0 survives Default. Default 1s.",
		"entry.LB":      "LB balances.", "lbSection.Mode": "Mode is the mode.",
	}
	without := func(key string) FieldDocs {
		d := FieldDocs{}
		for k, v := range all {
			if k != key {
				d[k] = v
			}
		}
		return d
	}
	tests := []struct {
		name      string
		docs      FieldDocs
		wantPaths []string
		wantErr   string
		wantDoc   map[string]string
		wantType  map[string]string
	}{
		{
			name:      "every field by its YAML path, depth first, skipping unexported and '-' fields",
			docs:      all,
			wantPaths: []string{"kind", "entries", "entries[].name", "entries[].timeout", "entries[].lb", "entries[].lb.mode", "cidrs"},
			wantDoc: map[string]string{
				"cidrs":             "`cidrs` are &lt;ranges&gt; \\| more.",
				"entries[].timeout": "`timeout` bounds it. Default 1s.",
			},
			wantType: map[string]string{"entries": "list of objects", "entries[].timeout": "duration", "cidrs": "list of strings", "entries[].lb": "object"},
		},
		{
			name:    "a field without a doc comment is an error naming its path",
			docs:    without("lbSection.Mode"),
			wantErr: "entries[].lb.mode (lbSection.Mode) has no doc comment",
		},
		{
			name:    "a top-level field without a doc comment too",
			docs:    without("root.CIDRs"),
			wantErr: "cidrs (root.CIDRs) has no doc comment",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fields, err := Fields(reflect.TypeFor[root](), tt.docs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for _, f := range fields {
				paths = append(paths, f.Path)
				if want, ok := tt.wantDoc[f.Path]; ok && f.Doc != want {
					t.Errorf("%s: doc %q, want %q", f.Path, f.Doc, want)
				}
				if want, ok := tt.wantType[f.Path]; ok && f.Type != want {
					t.Errorf("%s: type %q, want %q", f.Path, f.Type, want)
				}
			}
			if !reflect.DeepEqual(paths, tt.wantPaths) {
				t.Errorf("paths %q, want %q", paths, tt.wantPaths)
			}
		})
	}
}

func TestMissingFromExample(t *testing.T) {
	fields := []Field{{Path: "kind", Key: "kind"}, {Path: "entries[].name", Key: "name"}, {Path: "entries[].timeout", Key: "timeout"}}
	tests := []struct {
		name    string
		example string
		want    []string
	}{
		{name: "keys, list entries and commented-out keys count", example: "kind: X\nentries:\n  - name: a\n    # timeout: 1s\n", want: nil},
		{name: "a key only in prose does not", example: "kind: X\n# the timeout of each entry\nentries:\n  - name: a\n", want: []string{"entries[].timeout"}},
		{name: "nothing named", example: "", want: []string{"entries[].name", "entries[].timeout", "kind"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MissingFromExample(fields, []byte(tt.example)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSplice(t *testing.T) {
	gen := Begin + "\nnew\n" + End + "\n"
	tests := []struct {
		name, page, want, wantErr string
	}{
		{name: "replaces the generated part, keeps the rest", page: "intro\n" + Begin + "\nold\n" + End + "\noutro\n", want: "intro\n" + gen + "outro\n"},
		{name: "appends to a page without one", page: "intro\n", want: "intro\n\n" + gen},
		{name: "an end marker alone is an error", page: "intro\n" + End + "\n", wantErr: "markers"},
		{name: "markers out of order are an error", page: End + "\n" + Begin + "\n", wantErr: "markers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Splice([]byte(tt.page), []byte(gen))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
