// Command gendocs rewrites the generated part of docs/configuration.md from the
// configuration's Go types and example.yaml (`make docs`). Run it from the repository's
// root.
package main

import (
	"fmt"
	"os"
	"reflect"

	"github.com/shardproxy/shardproxy/docs/configref"
	"github.com/shardproxy/shardproxy/supervisor/config"
)

func main() { os.Exit(run()) }

func run() int {
	page, err := configref.Page(".", reflect.TypeFor[config.Config]())
	if err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		return 1
	}
	if err := os.WriteFile("docs/configuration.md", page, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		return 1
	}
	return 0
}
