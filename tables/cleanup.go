package tables

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"
)

// DeleteTable removes one instance's table of one family (nft bound to it). A table that
// does not exist is not an error. Nothing outside that table is touched.
func DeleteTable(ctx context.Context, nft knftables.Interface) error {
	tx := nft.NewTransaction()
	// Adding first makes the delete succeed whether or not the table exists.
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("deleting table: %w", err)
	}
	return nil
}
