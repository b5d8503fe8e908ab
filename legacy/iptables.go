package legacy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"
)

// Exec runs commands: the seam between the iptables cleanup and iptables-save and
// iptables-restore.
type Exec interface {
	// Run runs name with args, stdin (nil for none), and returns its standard output; the
	// error carries its standard error.
	Run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error)
	// LookPath reports whether name is an installed command.
	LookPath(name string) error
}

// RealExec runs commands with os/exec. A command it runs gets CAP_NET_ADMIN when this
// process holds it (passNetAdmin), so that iptables-nft, a multi-call binary whose every
// applet can change any table, needs no file capability of its own.
type RealExec struct{}

var _ Exec = RealExec{}

// Run implements Exec.
func (RealExec) Run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = passNetAdmin()
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// LookPath implements Exec.
func (RealExec) LookPath(name string) error {
	_, err := exec.LookPath(name)
	return err
}

// Tool is one family and backend of iptables: the prefix of its -save and -restore
// commands, e.g. "iptables-nft" or "ip6tables-legacy".
type Tool string

func (t Tool) save() string    { return string(t) + "-save" }
func (t Tool) restore() string { return string(t) + "-restore" }

// restoreWait are iptables-restore's arguments for the xtables lock: wait up to 5 s, as
// kube-proxy does (without its -W 100000, which iptables 1.8.9 ignores with a
// deprecation warning). iptables-legacy-restore takes the
// lock (kubelet and CNI plugins hold it briefly); without -w, older versions fail at
// once and 1.8.x waits with no bound, so a stuck holder would hang the cleanup.
// iptables-nft-restore accepts and ignores them.
var restoreWait = []string{"-w", "5"}

// ErrNoIPTables is returned when no iptables-save is installed, so kube-proxy's rules
// cannot be read (hack/install-deps.sh installs iptables).
var ErrNoIPTables = errors.New("iptables is not installed: cannot read kube-proxy's iptables rules")

// Tools returns the installed iptables commands to clean up with: iptables-nft and
// iptables-legacy (and their ip6tables twins) where installed, since kube-proxy in a
// container may have used either backend whatever the host's default is; otherwise plain
// iptables and ip6tables.
func Tools(ex Exec) ([]Tool, error) {
	var tools []Tool
	for _, fam := range []string{"iptables", "ip6tables"} {
		found := false
		for _, backend := range []string{"-nft", "-legacy"} {
			t := Tool(fam + backend)
			if ex.LookPath(t.save()) == nil && ex.LookPath(t.restore()) == nil {
				tools = append(tools, t)
				found = true
			}
		}
		if t := Tool(fam); !found && ex.LookPath(t.save()) == nil && ex.LookPath(t.restore()) == nil {
			tools = append(tools, t)
		}
	}
	if len(tools) == 0 {
		return nil, ErrNoIPTables
	}
	return tools, nil
}

// savedTable is one table of an iptables-save output.
type savedTable struct {
	name   string
	chains []string // in save order, built-in chains included
	rules  []savedRule
}

// savedRule is one "-A CHAIN SPEC" line.
type savedRule struct {
	chain  string
	spec   string // the rest of the line, quoting as iptables-save wrote it
	target string // the -j or -g target, "" if none
}

// parseSave parses iptables-save output (without counters) into its tables.
func parseSave(data []byte) ([]*savedTable, error) {
	var tables []*savedTable
	var cur *savedTable
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			cur = &savedTable{name: line[1:]}
			tables = append(tables, cur)
		case cur == nil:
			return nil, fmt.Errorf("line %d: %q outside a table", n, line)
		case line == "COMMIT":
			cur = nil
		case strings.HasPrefix(line, ":"):
			fields := strings.Fields(line[1:])
			if len(fields) == 0 {
				return nil, fmt.Errorf("line %d: empty chain line", n)
			}
			cur.chains = append(cur.chains, fields[0])
		case strings.HasPrefix(line, "-A "):
			rest := line[len("-A "):]
			chain, spec, _ := strings.Cut(rest, " ")
			words, err := splitWords(spec)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			r := savedRule{chain: chain, spec: spec}
			for i := 0; i+1 < len(words); i++ {
				switch words[i] {
				case "-j", "--jump", "-g", "--goto":
					r.target = words[i+1]
				}
			}
			cur.rules = append(cur.rules, r)
		default:
			return nil, fmt.Errorf("line %d: unexpected %q", n, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return tables, nil
}

// splitWords splits a rule spec the way iptables-restore does: on blanks, with double
// quotes grouping and a backslash escaping the next character inside them.
func splitWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
		case c == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (c == ' ' || c == '\t'):
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// TablePlan is what the cleanup does to one table of one Tool.
type TablePlan struct {
	Tool  Tool
	Table string
	// Unlinked are the rules removed from chains that stay, as "-A CHAIN SPEC".
	Unlinked []string
	// Chains are the kube-proxy chains flushed and deleted.
	Chains []string
}

// planTable computes the cleanup of one saved table; nil when nothing in it is
// kube-proxy's.
func planTable(tool Tool, t *savedTable) *TablePlan {
	owned := map[string]bool{}
	p := &TablePlan{Tool: tool, Table: t.name}
	for _, c := range t.chains {
		if Owned(t.name, c) && !owned[c] {
			owned[c] = true
			p.Chains = append(p.Chains, c)
		}
	}
	if len(p.Chains) == 0 {
		return nil
	}
	sort.Strings(p.Chains)
	for _, r := range t.rules {
		if !owned[r.chain] && owned[r.target] {
			p.Unlinked = append(p.Unlinked, "-A "+r.chain+" "+r.spec)
		}
	}
	return p
}

// script is the iptables-restore --noflush input that carries out the plan in one
// transaction: delete the jumps in chains that stay (by their exact spec), flush every
// kube-proxy chain (which removes the jumps between them), then delete them.
func (p *TablePlan) script() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%s\n", p.Table)
	for _, c := range p.Chains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, r := range p.Unlinked {
		fmt.Fprintf(&b, "-D %s\n", strings.TrimPrefix(r, "-A "))
	}
	for _, c := range p.Chains {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// PlanIPTables reads every table of every tool and returns what the cleanup would
// remove.
func PlanIPTables(ctx context.Context, ex Exec, tools []Tool) ([]*TablePlan, error) {
	var plans []*TablePlan
	for _, tool := range tools {
		ps, err := planTool(ctx, ex, tool)
		if err != nil {
			return nil, err
		}
		plans = append(plans, ps...)
	}
	return plans, nil
}

func planTool(ctx context.Context, ex Exec, tool Tool) ([]*TablePlan, error) {
	// Without -t, iptables-save lists only the tables that exist: asking for one by name
	// would create it in the legacy backend.
	out, err := ex.Run(ctx, nil, tool.save())
	if err != nil {
		return nil, fmt.Errorf("reading rules with %s: %w", tool.save(), err)
	}
	tables, err := parseSave(out)
	if err != nil {
		return nil, fmt.Errorf("parsing %s output: %w", tool.save(), err)
	}
	var plans []*TablePlan
	for _, t := range tables {
		if p := planTable(tool, t); p != nil {
			plans = append(plans, p)
		}
	}
	return plans, nil
}

// ApplyIPTables carries out the plans, one iptables-restore --noflush transaction per
// table, and then checks with iptables-save that no kube-proxy chain is left.
func ApplyIPTables(ctx context.Context, ex Exec, plans []*TablePlan) error {
	var errs []error
	tools := map[Tool]bool{}
	for _, p := range plans {
		tools[p.Tool] = true
		args := append([]string{"--noflush"}, restoreWait...)
		if _, err := ex.Run(ctx, p.script(), p.Tool.restore(), args...); err != nil {
			errs = append(errs, fmt.Errorf("removing kube-proxy's chains from %s table %s: %w", p.Tool, p.Table, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for tool := range tools {
		left, err := planTool(ctx, ex, tool)
		if err != nil {
			return err
		}
		for _, p := range left {
			errs = append(errs, fmt.Errorf("%s table %s still has kube-proxy chains %v", p.Tool, p.Table, p.Chains))
		}
	}
	return errors.Join(errs...)
}
