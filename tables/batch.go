package tables

import (
	"context"

	"sigs.k8s.io/knftables"
)

// Batch is one atomic change of a table that needs no rule text: what most partial syncs
// are (endpoints come and go, Services appear and disappear through map elements). It is
// applied in this order: element deletions, chain flushes, element additions, chain
// deletions, set deletions.
type Batch struct {
	DeleteElements []*knftables.Element
	FlushChains    []string
	AddElements    []*knftables.Element
	DeleteChains   []string
	DeleteSets     []string
}

// Len is the number of operations in the batch.
func (b *Batch) Len() int {
	return len(b.DeleteElements) + len(b.FlushChains) + len(b.AddElements) + len(b.DeleteChains) + len(b.DeleteSets)
}

// BatchWriter applies a Batch to one table in one kernel transaction, all or nothing.
//
// It exists because the nft binary reads every chain and set of the node before each
// transaction, however small: at 30,000 Services that costs ~30 ms and grows with
// every table on the node, while the partial sync it carries touches a few elements
// (see NetlinkWriter).
type BatchWriter interface {
	WriteBatch(ctx context.Context, b *Batch) error
}

// MaxBatchElements bounds the elements a partial sync sends through a BatchWriter; a
// larger change goes through nft, whose fixed cost is then small beside the work. It
// keeps a batch well inside one netlink message buffer (the kernel refuses a send larger
// than the socket's send buffer, 208 KiB by default; an IPv6 map element is ~100 bytes).
const MaxBatchElements = 1000

// MaxBatchMessages bounds the netlink messages of a batch. google/nftables v0.3.0 asks
// the kernel to acknowledge every message and reads the acknowledgements only after
// sending them all; the kernel queues them in the socket's receive buffer (208 KiB by
// default, ~700 bytes each), so past ~280 messages the batch is applied but reported as
// failed (ENOBUFS) and the next sync would be a needless full one. Deleting a
// ClientIP-affinity Service with 100 endpoints takes ~300 (a flush and a delete per
// chain, a delete per set); such a sync goes through nft.
const MaxBatchMessages = 128

// batchMessages counts the messages of a batch of the given element ids (sorted, so
// each set's are together), chain removals (a flush and a delete each) and set removals:
// one message per set and netlinkChunk elements.
func batchMessages(added, deleted []string, goneChains, goneSets int) int {
	n := 2*goneChains + goneSets
	for _, ids := range [][]string{added, deleted} {
		run := 0
		for i, id := range ids {
			if i == 0 || run == netlinkChunk || idSet(id) != idSet(ids[i-1]) {
				n++
				run = 0
			}
			run++
		}
	}
	return n
}
