package testutil

import "runtime"

// LiveHeap is the heap in use after a collection: what the objects still reachable
// take, for tests that bound the bytes a structure keeps per item.
func LiveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
