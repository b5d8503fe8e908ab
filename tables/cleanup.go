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

// NewNFT returns a knftables.Interface for an instance's table of one family.
func NewNFT(fam Family, tablePrefix, instance string) (knftables.Interface, error) {
	name := (&Config{TablePrefix: tablePrefix, Instance: instance}).TableName()
	nft, err := knftables.New(KnftFamily(fam), name)
	if err != nil {
		return nil, fmt.Errorf("nftables for table %s %s: %w", KnftFamily(fam), name, err)
	}
	return nft, nil
}

// KnftFamily is the knftables family of a table family.
func KnftFamily(f Family) knftables.Family {
	if f == IPv6 {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}
