package app

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// completionCommand is `shardproxy completion bash|zsh|fish`: a shell completion script
// for the commands, subcommands and flags of app. The bash and zsh scripts are static
// (generated from the command tree, they never run shardproxy while completing: nothing
// of the cluster or the node is read at a Tab); fish's is urfave/cli's.
func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script (bash, zsh or fish)",
		ArgsUsage: "bash|zsh|fish",
		Description: `Load it in the current shell, or install it for every new one:
  bash: source <(shardproxy completion bash)     or  shardproxy completion bash > /etc/bash_completion.d/shardproxy
  zsh:  source <(shardproxy completion zsh)      or  shardproxy completion zsh > "${fpath[1]}/_shardproxy"  (needs compinit)
  fish: shardproxy completion fish | source      or  shardproxy completion fish > ~/.config/fish/completions/shardproxy.fish
After a flag that takes a value, file names are completed.`,
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return newUsageError(c, fmt.Errorf("give one shell: bash, zsh or fish"))
			}
			switch shell := c.Args().First(); shell {
			case "bash":
				return writeBashCompletion(c.App.Writer, commandTree(c.App))
			case "zsh":
				return writeZshCompletion(c.App.Writer, commandTree(c.App))
			case "fish":
				script, err := c.App.ToFishCompletion()
				if err != nil {
					return fmt.Errorf("generating the fish completion: %w", err)
				}
				_, err = io.WriteString(c.App.Writer, script)
				return err
			default:
				return newUsageError(c, fmt.Errorf("unknown shell %q: bash, zsh or fish", shell))
			}
		},
	}
}

// completionNode is one command of the tree a completion script knows: its path from
// the application ("" for the application itself, "migrate move"), subcommands and flags.
type completionNode struct {
	path string
	// subs are the visible subcommands, with their usage.
	subs []*cli.Command
	// flags are every name of the visible flags ("--config", "-c"); valueFlags those of
	// them that take a value.
	flags, valueFlags []string
}

// commandTree lists app and every visible command under it, depth first.
func commandTree(app *cli.App) []completionNode {
	var out []completionNode
	var walk func(path string, cmds []*cli.Command, flags []cli.Flag)
	walk = func(path string, cmds []*cli.Command, flags []cli.Flag) {
		n := completionNode{path: path}
		for _, c := range cmds {
			// urfave/cli adds a help subcommand to the command it runs (this one): only
			// the application's is worth completing.
			if !c.Hidden && (path == "" || c.Name != "help") {
				n.subs = append(n.subs, c)
			}
		}
		seen := map[string]bool{}
		for _, f := range append(flags, cli.HelpFlag) {
			if vf, ok := f.(cli.VisibleFlag); ok && !vf.IsVisible() {
				continue
			}
			takesValue := false
			if df, ok := f.(cli.DocGenerationFlag); ok {
				takesValue = df.TakesValue()
			}
			for _, name := range f.Names() {
				dashed := "--" + name
				if len(name) == 1 {
					dashed = "-" + name
				}
				if seen[dashed] {
					continue
				}
				seen[dashed] = true
				n.flags = append(n.flags, dashed)
				if takesValue {
					n.valueFlags = append(n.valueFlags, dashed)
				}
			}
		}
		sort.Strings(n.flags)
		out = append(out, n)
		for _, c := range n.subs {
			walk(strings.TrimSpace(path+" "+c.Name), c.Subcommands, c.Flags)
		}
	}
	walk("", app.Commands, app.Flags)
	return out
}

// subNames are the names of n's subcommands.
func (n completionNode) subNames() []string {
	var names []string
	for _, c := range n.subs {
		names = append(names, c.Names()...)
	}
	return names
}

// writeCase writes one shell case statement over the command paths of tree, each
// branch echoing what value gives for it.
func writeCase(w io.Writer, tree []completionNode, value func(completionNode) string) {
	fmt.Fprintln(w, `  case "$1" in`)
	for _, n := range tree {
		fmt.Fprintf(w, "    %q) echo %s ;;\n", n.path, shellQuote(value(n)))
	}
	fmt.Fprintln(w, "  esac")
}

// shellQuote quotes s for sh, bash and zsh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// writeHelpers writes the functions both scripts share: per command path, its
// subcommands' names, its flags, and the flags that take a value.
func writeHelpers(w io.Writer, tree []completionNode) {
	fmt.Fprintln(w, "__shardproxy_subcommands() {")
	writeCase(w, tree, func(n completionNode) string { return strings.Join(n.subNames(), " ") })
	fmt.Fprintln(w, "}")
	fmt.Fprintln(w, "__shardproxy_flags() {")
	writeCase(w, tree, func(n completionNode) string { return strings.Join(n.flags, " ") })
	fmt.Fprintln(w, "}")
	fmt.Fprintln(w, "__shardproxy_value_flags() {")
	writeCase(w, tree, func(n completionNode) string { return strings.Join(n.valueFlags, " ") })
	fmt.Fprintln(w, "}")
}

// bashCompletionMain finds the command path of the words before the cursor (skipping
// flags and their values) and completes flags, subcommands, or, after a flag that takes
// a value, files (complete -o default).
const bashCompletionMain = `_shardproxy() {
  local cur="${COMP_WORDS[COMP_CWORD]}" cmd="" w i skip=0
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${COMP_WORDS[i]}"
    if ((skip)); then skip=0; continue; fi
    if [[ "$w" == -* ]]; then
      [[ "$w" != *=* && " $(__shardproxy_value_flags "$cmd") " == *" $w "* ]] && skip=1
      continue
    fi
    if [[ " $(__shardproxy_subcommands "$cmd") " == *" $w "* ]]; then
      cmd="${cmd:+$cmd }$w"
    fi
  done
  COMPREPLY=()
  ((skip)) && return 0
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$(__shardproxy_flags "$cmd")" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "$(__shardproxy_subcommands "$cmd")" -- "$cur"))
  fi
}
complete -o default -F _shardproxy shardproxy
`

func writeBashCompletion(w io.Writer, tree []completionNode) error {
	fmt.Fprintln(w, "# bash completion for shardproxy: source <(shardproxy completion bash)")
	writeHelpers(w, tree)
	_, err := io.WriteString(w, bashCompletionMain)
	return err
}

// zshCompletionMain is bashCompletionMain for zsh, with the subcommands' descriptions.
// Sourced, it registers itself with compdef; installed as _shardproxy in $fpath, compinit
// runs the file as the function _shardproxy, which defines the helpers and completes.
const zshCompletionMain = `_shardproxy() {
  local cmd="" w i skip=0
  for ((i = 2; i < CURRENT; i++)); do
    w=${words[i]}
    if ((skip)); then skip=0; continue; fi
    if [[ $w == -* ]]; then
      [[ $w != *=* && " $(__shardproxy_value_flags "$cmd") " == *" $w "* ]] && skip=1
      continue
    fi
    if [[ " $(__shardproxy_subcommands "$cmd") " == *" $w "* ]]; then
      cmd=${cmd:+$cmd }$w
    fi
  done
  if ((skip)); then _files; return; fi
  if [[ ${words[CURRENT]} == -* ]]; then
    local -a flags
    flags=(${(z)"$(__shardproxy_flags "$cmd")"})
    compadd -- $flags
  else
    local -a subs
    subs=(${(f)"$(__shardproxy_described "$cmd")"})
    if ((${#subs})); then _describe 'command' subs; else _files; fi
  fi
}
if [[ ${funcstack[1]} == _shardproxy ]]; then
  _shardproxy "$@"
else
  compdef _shardproxy shardproxy
fi
`

func writeZshCompletion(w io.Writer, tree []completionNode) error {
	fmt.Fprintln(w, "#compdef shardproxy")
	fmt.Fprintln(w, "# zsh completion for shardproxy: source <(shardproxy completion zsh), or save it as _shardproxy in $fpath")
	writeHelpers(w, tree)
	fmt.Fprintln(w, "__shardproxy_described() {")
	writeCase(w, tree, func(n completionNode) string {
		var lines []string
		for _, c := range n.subs {
			lines = append(lines, strings.ReplaceAll(c.Name, ":", `\:`)+":"+c.Usage)
		}
		return strings.Join(lines, "\n")
	})
	fmt.Fprintln(w, "}")
	_, err := io.WriteString(w, zshCompletionMain)
	return err
}
