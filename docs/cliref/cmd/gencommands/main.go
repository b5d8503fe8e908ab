// Command gencommands rewrites the generated part of docs/commands.md (the command
// reference) from the CLI's command tree (`make docs`). Run it from the repository's
// root.
package main

import (
	"fmt"
	"io"
	"os"

	shardproxy "github.com/shardproxy/shardproxy/cmd/shardproxy/app"
	"github.com/shardproxy/shardproxy/docs/cliref"
)

func main() { os.Exit(run()) }

func run() int {
	const path = "docs/commands.md"
	page, err := os.ReadFile(path)
	if err == nil {
		page, err = cliref.Splice(page, cliref.Generate(shardproxy.New(io.Discard, io.Discard, shardproxy.Build{})))
	}
	if err == nil {
		err = os.WriteFile(path, page, 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gencommands: %v\n", err)
		return 1
	}
	return 0
}
