package fleet

import (
	"context"
	"errors"
	"slices"
	"syscall"
	"testing"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
)

// TestNamesOnly: the names-only table keeps what the syncer checks (the table, its
// chains and sets) and answers "not found" for a table that is gone.
func TestNamesOnly(t *testing.T) {
	ctx := context.Background()
	n := newNamesOnly(knftables.IPv4Family, "shardproxy-default")
	if _, err := n.List(ctx, "chains"); !tablesNotFound(err) {
		t.Fatalf("listing a missing table: %v, want not found", err)
	}
	tx := n.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "nat-prerouting"})
	tx.Add(&knftables.Chain{Name: "svc-a"})
	tx.Add(&knftables.Map{Name: "service-ips", Type: "ipv4_addr . inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Rule{Chain: "svc-a", Rule: "counter"})
	tx.Add(&knftables.Element{Map: "service-ips", Key: []string{"10.96.0.10", "tcp", "80"}, Value: []string{"goto svc-a"}})
	if err := n.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx = n.NewTransaction()
	tx.Delete(&knftables.Chain{Name: "svc-a"})
	if err := n.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	chains, err := n.List(ctx, "chains")
	if err != nil || !slices.Equal(chains, []string{"nat-prerouting"}) {
		t.Errorf("chains %v %v, want [nat-prerouting]", chains, err)
	}
	if sets, err := n.List(ctx, "maps"); err != nil || !slices.Equal(sets, []string{"service-ips"}) {
		t.Errorf("maps %v %v, want [service-ips]", sets, err)
	}
	tx = n.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := n.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.List(ctx, "chains"); !tablesNotFound(err) {
		t.Errorf("after deleting the table: %v, want not found", err)
	}
	ft := &fakeTables{fakes: map[string]*knftables.Fake{}, names: map[string]*namesOnly{}}
	if _, err := ft.open(tables.IPv4, "shardproxy-default"); err != nil {
		t.Fatal(err)
	}
	if listed, _ := ft.list(ctx, tables.IPv4); len(listed) != 0 {
		t.Errorf("a table never created is listed: %v", listed)
	}
	// A created table is listed with its comment, which is how a supervisor tells its
	// own tables (the node table's keeper rewrote it every check without it).
	nft, err := ft.open(tables.IPv4, "shardproxy-node")
	if err != nil {
		t.Fatal(err)
	}
	tx = nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: ptr.To("owned by someone")})
	if err := nft.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	listed, _ := ft.list(ctx, tables.IPv4)
	if want := []tables.ListedTable{{Name: "shardproxy-node", Comment: "owned by someone"}}; !slices.Equal(listed, want) {
		t.Errorf("listed %+v, want %+v", listed, want)
	}
}

// tablesNotFound is how the tables package tells a missing table.
func tablesNotFound(err error) bool { return errors.Is(err, syscall.ENOENT) }
