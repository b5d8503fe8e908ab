package tables

import (
	"runtime"
	"testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestLedgerHeapPerService bounds the heap a Syncer's ledger keeps per Service after a
// full sync (one port, 10 endpoints, ClusterIP): the ledger is the Syncer's whole memory
// of the table and grows with every Service of the cluster. For random, the bound sits
// between the ledger's size with element ids as text (about 4.0 KB a Service with this
// test's elements; 5.3 KB before with a map per Service and one per port) and its size
// with binary ids (elementid.go; about 2.95 KB, 2.5 KB since). For consistentHash, a
// port's 256-slot table kept as 256 element ids was 17.3 KB a Service, as one slotTable
// 6.7 KB, and 2.6 KB once the affinity chains (one Service in seven) had no 256-slot
// vmap in their rules (b599033).
func TestLedgerHeapPerService(t *testing.T) {
	for _, tc := range []struct {
		mode     LBMode
		maxBytes float64
	}{{LBRandom, 3400}, {LBConsistentHash, 4000}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			const n = 2000
			cfg := testConfig(IPv4)
			c := newCompiler(&cfg)
			ports := map[ServiceName][]*ServicePort{}
			for i := range n {
				p := genPort(i, 10)
				p.LoadBalancing = tc.mode
				ports[ServiceName{Namespace: p.Name.Namespace, Name: p.Name.Name}] = []*ServicePort{p}
			}
			before := testutil.LiveHeap()
			l := newLedger(c, 0)
			l.replace(newChangeLog(false), ports)
			perService := float64(testutil.LiveHeap()-before) / n
			runtime.KeepAlive(l)
			t.Logf("ledger: %.0f bytes of heap per Service", perService)
			if perService > tc.maxBytes {
				t.Errorf("ledger keeps %.0f bytes per Service, want at most %.0f", perService, tc.maxBytes)
			}
		})
	}
}

// TestLedgerPresizedHeap bounds an empty ledger sized for 60,000 entries, as a full
// sync of 30,000 Services makes it: the entry map points to its owners' names instead
// of holding a 64-byte copy each (15.7 MB before, 7.7 after, the Service map half of
// it).
func TestLedgerPresizedHeap(t *testing.T) {
	const entries, maxBytes = 60000, 10 << 20
	cfg := testConfig(IPv4)
	c := newCompiler(&cfg)
	before := testutil.LiveHeap()
	l := newLedger(c, entries)
	size := testutil.LiveHeap() - before
	runtime.KeepAlive(l)
	t.Logf("ledger sized for %d entries: %.1f MB", entries, float64(size)/1e6)
	if size > maxBytes {
		t.Errorf("an empty ledger sized for %d entries keeps %.1f MB, want at most %.1f", entries, float64(size)/1e6, float64(maxBytes)/1e6)
	}
}
