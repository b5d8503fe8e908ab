package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	logsapi "k8s.io/component-base/logs/api/v1"

	// The json log format of --logging-format, as in Kubernetes components.
	_ "k8s.io/component-base/logs/json/register"
)

// Exit codes: a runtime failure is 1, a command line that cannot be parsed (unknown
// flag or command, missing or malformed flag value) is 2, as Go's flag package and
// POSIX tools do.
const (
	exitFailure = 1
	exitUsage   = 2
)

// usageError is a command line shardproxy cannot run: run prints it with the command's
// usage line and exits exitUsage.
type usageError struct {
	// command is the full command, e.g. "shardproxy run".
	command string
	// args is what follows the options in the usage line ("command" for a command
	// with subcommands, the command's ArgsUsage, or nothing).
	args string
	err  error
}

// newUsageError is a usage error of the command c runs (the application itself when
// c.Command is the root).
func newUsageError(c *cli.Context, err error) *usageError {
	name, args := c.App.HelpName, "command"
	if cmd := c.Command; cmd != nil && cmd.HelpName != "" && cmd.HelpName != c.App.HelpName {
		name, args = cmd.HelpName, cmd.ArgsUsage
		if hasSubcommands(cmd) {
			args = "command"
		}
	}
	return &usageError{command: name, args: args, err: err}
}

// hasSubcommands reports whether cmd has subcommands besides the help command urfave/cli
// adds to every command.
func hasSubcommands(cmd *cli.Command) bool {
	return slices.ContainsFunc(cmd.Subcommands, func(sub *cli.Command) bool { return sub.Name != "help" })
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitCode turns an error of app.Run into the process exit code, printing it (and for a
// usage error, the usage line) to stderr.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var usage *usageError
	if errors.As(err, &usage) {
		line := strings.TrimSpace(usage.command + " [options] " + usage.args)
		fmt.Fprintf(stderr, "%s: %v\nUsage: %s\nRun '%s --help' for the options.\n", usage.command, usage.err, line, usage.command)
		return exitUsage
	}
	var coder cli.ExitCoder
	if errors.As(err, &coder) && coder.ExitCode() != 0 {
		fmt.Fprintf(stderr, "shardproxy: %v\n", err)
		if coder.ExitCode() == 3 { // urfave's "No help topic": an unknown command
			return exitUsage
		}
		return coder.ExitCode()
	}
	fmt.Fprintf(stderr, "shardproxy: %v\n", err)
	return exitFailure
}

// loggingFlagNames are the logging flags of Kubernetes components that shardproxy takes.
// The split-stream and buffer options are left out: they are alpha, behind a feature gate
// shardproxy has no flag for.
var loggingFlagNames = []string{"v", "vmodule", "logging-format", logsapi.LogFlushFreqFlagName}

// loggingFlags are the logging flags of Kubernetes components (-v/--v, --vmodule,
// --logging-format text|json, --log-flush-frequency) as k8s.io/component-base/logs
// defines them (names, usage, parsing), bound to cfg.
func loggingFlags(cfg *logsapi.LoggingConfiguration) []cli.Flag {
	fs := flag.NewFlagSet("logging", flag.ContinueOnError)
	logsapi.AddGoFlags(cfg, fs)
	flags := make([]cli.Flag, 0, len(loggingFlagNames))
	for _, name := range loggingFlagNames {
		f := fs.Lookup(name)
		flags = append(flags, &cli.GenericFlag{Name: f.Name, Usage: f.Usage, Value: f.Value, Category: "logging"})
	}
	return flags
}

// setupCommands gives every command the conventions of Kubernetes components: the logging
// flags on the application and on each command (applied once, before the command acts),
// and usage errors (unknown or malformed flags, missing required flags) as *usageError.
// Required flags are checked here rather than by urfave/cli, which would print the whole
// help instead of the usage line.
func setupCommands(cmds []*cli.Command, logFlags []cli.Flag, applyLogging func() error) {
	for _, cmd := range cmds {
		cmd.OnUsageError = onUsageError
		if hasSubcommands(cmd) {
			if cmd.Action == nil {
				cmd.Action = commandNotFound
			}
			setupCommands(cmd.Subcommands, logFlags, applyLogging)
			continue
		}
		var required []string
		for _, f := range cmd.Flags {
			if sf, ok := f.(*cli.StringFlag); ok && sf.Required {
				sf.Required = false
				sf.Usage += " (required)"
				required = append(required, sf.Name)
			}
		}
		cmd.Flags = append(cmd.Flags, logFlags...)
		cmd.Before = func(c *cli.Context) error {
			if err := checkArgs(cmd, c.Args().Slice()); err != nil {
				return newUsageError(c, err)
			}
			var missing []string
			for _, name := range required {
				if !c.IsSet(name) {
					missing = append(missing, "--"+name)
				}
			}
			if len(missing) > 0 {
				return newUsageError(c, fmt.Errorf("required flags not set: %s", strings.Join(missing, ", ")))
			}
			if err := applyLogging(); err != nil {
				return newUsageError(c, fmt.Errorf("logging flags: %w", err))
			}
			return nil
		}
	}
}

// checkArgs refuses what urfave/cli would drop silently: it stops reading flags at the
// first argument, so a flag after one (`migrate move ns/web --to x`) would become an
// argument and its value never set; and arguments of a command that takes none.
func checkArgs(cmd *cli.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.ArgsUsage == "" {
		return fmt.Errorf("unexpected argument %q: %s takes no arguments", args[0], cmd.Name)
	}
	for _, a := range args[1:] {
		if len(a) > 1 && strings.HasPrefix(a, "-") {
			return fmt.Errorf("flag %s after the argument %q: put every flag before the arguments", a, args[0])
		}
	}
	return nil
}

// onUsageError reports a flag that could not be parsed as a *usageError.
func onUsageError(c *cli.Context, err error, _ bool) error { return newUsageError(c, err) }

// commandNotFound is the action of the application and of commands with subcommands:
// help without arguments, a usage error for an unknown command.
func commandNotFound(c *cli.Context) error {
	if c.Args().Present() {
		return newUsageError(c, fmt.Errorf("unknown command %q", c.Args().First()))
	}
	if c.Command != nil && hasSubcommands(c.Command) && c.Command.HelpName != c.App.HelpName {
		return cli.ShowSubcommandHelp(c)
	}
	return cli.ShowAppHelp(c)
}
