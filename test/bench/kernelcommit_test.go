package bench

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// BenchmarkKernelCommit is the kernel's own cost of the transaction a one-endpoint
// partial sync sends (issue 13: the partial sync at 100,000 Services against 1,000):
// deleting one element of a map and adding another, in one netlink transaction on a
// kept socket, in a table whose map holds `elements` elements beside `chains` empty
// chains; the median of each table is reported. The sizes are those of make bench's one
// instance with 5 endpoints and half of the Services IPv6: ~8,000 and ~800,000 elements
// per family at 1,000 and 100,000 Services, and the chains of its two tables, which the
// kernel's commit walks whatever the transaction touched: 669 at 1,000 Services and
// 1,839 at 10,000 (nft list chains; 130 and 1,300 of them ClientIP-affinity chains, 6–7
// for each of the 2% of Services with affinity, and 512 rotation chains, which tables
// without consistentHash no longer have), so ~13,500 at 100,000. Needs root; not
// run by make test:
//
//	go test ./test/bench -run '^$' -bench KernelCommit -benchtime 4000x
func BenchmarkKernelCommit(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (a network namespace, nft)")
	}
	type table struct {
		name             string
		elements, chains int
		conn             *nftables.Conn
		took             []time.Duration
	}
	var tables []*table
	for _, sz := range [][2]int{{8_000, 700}, {800_000, 700}, {8_000, 13_500}, {800_000, 13_500}} {
		tables = append(tables, &table{name: fmt.Sprintf("elements=%d,chains=%d", sz[0], sz[1]),
			elements: sz[0], chains: sz[1], conn: commitTable(b, sz[0], sz[1])})
	}
	set := &nftables.Set{Name: "m", Table: &nftables.Table{Name: "kc", Family: nftables.TableFamilyIPv4}}
	b.ResetTimer()
	// One commit into each table in turn, so a busy machine weighs on them alike.
	for i := range b.N {
		for _, t := range tables {
			// Element k gets another value: a delete and an add, as when the endpoint
			// behind a Service entry is replaced.
			k := i % t.elements
			start := time.Now()
			if err := t.conn.SetDeleteElements(set, []nftables.SetElement{{Key: commitKey(k)}}); err != nil {
				b.Fatal(err)
			}
			if err := t.conn.SetAddElements(set, []nftables.SetElement{{Key: commitKey(k), Val: commitKey(k + i + 1)}}); err != nil {
				b.Fatal(err)
			}
			if err := t.conn.Flush(); err != nil {
				b.Fatal(err)
			}
			t.took = append(t.took, time.Since(start))
		}
	}
	b.StopTimer()
	for _, t := range tables {
		slices.Sort(t.took)
		b.ReportMetric(float64(t.took[len(t.took)/2].Microseconds()), "µs-median:"+t.name)
	}
}

// commitTable loads table ip kc (map m of n elements, k = i: value i, and chains empty
// chains) into a new namespace with nft -f, and returns a kept netlink connection into it.
func commitTable(b *testing.B, n, chains int) *nftables.Conn {
	b.Helper()
	ns, err := newNamespace("spcommit")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteNamespace(ns) })
	var s strings.Builder
	s.WriteString("table ip kc {\n\tmap m {\n\t\ttype ipv4_addr . inet_service : ipv4_addr . inet_service\n\t}\n")
	for i := range chains {
		fmt.Fprintf(&s, "\tchain c%d {\n\t}\n", i)
	}
	s.WriteString("}\n")
	for i := range n {
		switch {
		case i%10_000 == 0:
			s.WriteString("add element ip kc m { ")
		default:
			s.WriteString(", ")
		}
		fmt.Fprintf(&s, "%s : %s", commitText(i), commitText(i))
		if i%10_000 == 9_999 || i == n-1 {
			s.WriteString(" }\n")
		}
	}
	path := filepath.Join(b.TempDir(), "kc.nft")
	if err := os.WriteFile(path, []byte(s.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-f", path).CombinedOutput(); err != nil {
		b.Fatalf("nft -f: %v: %s", err, out)
	}
	fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	conn, err := nftables.New(nftables.WithNetNSFd(fd), nftables.AsLasting())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.CloseLasting() })
	return conn
}

// commitAddr is the address . port of index i: 10.x.y.z . 1000 + i/2^24.
func commitAddr(i int) ([4]byte, uint16) {
	return [4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}, uint16(1000 + i>>24)
}

func commitText(i int) string {
	a, p := commitAddr(i)
	return fmt.Sprintf("%d.%d.%d.%d . %d", a[0], a[1], a[2], a[3], p)
}

// commitKey is index i's address . port as the kernel stores it: each field padded to 4
// bytes.
func commitKey(i int) []byte {
	a, p := commitAddr(i % (1 << 24))
	k := make([]byte, 8)
	copy(k, a[:])
	binary.BigEndian.PutUint16(k[4:], p)
	return k
}
