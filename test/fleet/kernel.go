package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"

	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
)

// namesOnly is a hollow node's nftables: it keeps which table, chains, sets and maps
// exist, and drops rules and elements. knftables' Fake finds an element by scanning
// every element of its set, so a full sync of 1,000 Services cost seconds of CPU per
// node, and a fleet of hundreds on two cores never finished its first syncs; what the
// fleet measures is the API server's side, for which a transaction that succeeds is
// enough. The syncer's own checks (is our base chain there, which chains and sets
// exist before a full sync) still see the truth. Its cost is linear in the
// transaction: it reads the transaction's text.
type namesOnly struct {
	*knftables.Fake // NewTransaction; the List* methods nobody calls answer empty

	table  string
	mu     sync.Mutex
	exists bool
	// comment is the table's comment: the supervisor tells its own tables by it.
	comment string
	chains  map[string]bool
	sets    map[string]bool // sets and maps: nft lists both as "sets" and "maps"
	runs    int
}

var _ knftables.Interface = &namesOnly{}

func newNamesOnly(fam knftables.Family, table string) *namesOnly {
	return &namesOnly{Fake: knftables.NewFake(fam, table), table: table, chains: map[string]bool{}, sets: map[string]bool{}}
}

// Run applies the transaction's table, chain, set and map commands.
func (n *namesOnly) Run(_ context.Context, tx *knftables.Transaction) error {
	text := tx.String()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.runs++
	for line := range strings.SplitSeq(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		verb, kind := f[0], f[1]
		name := ""
		if len(f) >= 5 {
			name = f[4]
		}
		add := verb == "add" || verb == "create"
		del := verb == "delete" || verb == "destroy"
		switch kind {
		case "table":
			if add {
				n.exists = true
				if _, c, ok := strings.Cut(line, `comment "`); ok {
					n.comment, _, _ = strings.Cut(c, `"`)
				}
			}
			if del {
				n.exists, n.comment = false, ""
				clear(n.chains)
				clear(n.sets)
			}
		case "chain":
			if add {
				n.chains[name] = true
			}
			if del {
				delete(n.chains, name)
			}
		case "set", "map":
			if add {
				n.sets[name] = true
			}
			if del {
				delete(n.sets, name)
			}
		}
	}
	return nil
}

// Check accepts every transaction.
func (n *namesOnly) Check(context.Context, *knftables.Transaction) error { return nil }

// List lists chains, sets or maps by name.
func (n *namesOnly) List(_ context.Context, objectType string) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.exists {
		return nil, fmt.Errorf("table %s: %w", n.table, syscall.ENOENT)
	}
	var m map[string]bool
	switch objectType {
	case "chain", "chains":
		m = n.chains
	case "set", "sets", "map", "maps":
		m = n.sets
	default:
		return nil, fmt.Errorf("namesOnly: cannot list %q", objectType)
	}
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

// listed is the table as nft's listing shows it, and whether it exists.
func (n *namesOnly) listed() (tables.ListedTable, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return tables.ListedTable{Name: n.table, Comment: n.comment}, n.exists
}
