package app

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
	"sigs.k8s.io/yaml"
)

// outputFlag is -o/--output, as kubectl's: how a command prints what it read.
func outputFlag() *cli.StringFlag {
	return &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "output format: table, json or yaml"}
}

// outputFormat returns the -o of c, a usage error when it is not one shardproxy prints.
func outputFormat(c *cli.Context) (string, error) {
	switch f := c.String("output"); f {
	case "table", "json", "yaml":
		return f, nil
	default:
		return "", newUsageError(c, fmt.Errorf("--output %q: must be table, json or yaml", f))
	}
}

// writeOutput prints v as format says: table calls table, json and yaml encode v (YAML
// through its JSON form, so both carry the same field names).
func writeOutput(w io.Writer, format string, v any, table func() error) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	default:
		return table()
	}
}
