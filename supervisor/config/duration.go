package config

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// Duration is a time.Duration written in YAML as a Go duration string ("250ms", "30s",
// "1h"). Bare numbers are rejected: "5" has no unit, and guessing one hides mistakes.
type Duration struct{ time.Duration }

// UnmarshalYAML parses a duration string. Its errors are *yaml.TypeError so that the
// decoder keeps going and reports them alongside every other problem in the file.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	fail := func(format string, args ...any) error {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: ", n.Line) + fmt.Sprintf(format, args...)}}
	}
	if n.Kind != yaml.ScalarNode {
		return fail("want a duration such as \"30s\", not a %s", kindName(n.Kind))
	}
	switch n.ShortTag() {
	case "!!str":
	case "!!int", "!!float":
		return fail("duration %s has no unit: write it as e.g. \"%ss\" or \"%sms\"", n.Value, n.Value, n.Value)
	default:
		return fail("%q is not a duration: want e.g. \"250ms\", \"30s\" or \"1h\"", n.Value)
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fail("%q is not a duration: want e.g. \"250ms\", \"30s\" or \"1h\"", n.Value)
	}
	d.Duration = v
	return nil
}

// MarshalYAML writes the duration back as a string, so a Config round-trips.
func (d Duration) MarshalYAML() (any, error) {
	return d.Duration.String(), nil
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	case yaml.DocumentNode:
		return "document"
	default:
		return "scalar"
	}
}
