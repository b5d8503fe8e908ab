package tables

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// requireRoot skips real-kernel tests where they cannot run; CI runs as root.
func requireRoot(t testing.TB) {
	t.Helper()
	testutil.RequireKernel(t, "nft", "ip")
}

// newNetns creates a fresh network namespace, deleted when the test ends.
func newNetns(t testing.TB) string {
	t.Helper()
	return testutil.NewNetns(t, "sptab-")
}

// kernelNFT returns a knftables.Interface whose nft runs inside namespace ns: New looks
// nft up on PATH once, so a wrapper script found first does the namespace switch.
// wrapperMark marks kernelNFT's wrapper directories, which realNFT skips: a test with
// two namespaces must not wrap the first one's wrapper.
const wrapperMark = ".shardproxy-nft-wrapper"

// realNFT finds the nft binary on PATH, skipping kernelNFT's wrappers.
func realNFT(t testing.TB) string {
	t.Helper()
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(dir, wrapperMark)); err == nil {
			continue
		}
		if p := filepath.Join(dir, "nft"); isExecutable(p) {
			return p
		}
	}
	t.Fatal("nft not found on PATH")
	return ""
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

func kernelNFT(t testing.TB, ns string, fam Family, table string) knftables.Interface {
	t.Helper()
	nftPath := realNFT(t)
	dir := t.TempDir()
	script := "#!/bin/sh\nexec ip netns exec " + ns + " " + nftPath + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "nft"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, wrapperMark), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	f := knftables.IPv4Family
	if fam == IPv6 {
		f = knftables.IPv6Family
	}
	nft, err := knftables.New(f, table)
	if err != nil {
		t.Fatalf("knftables.New in %s: %v", ns, err)
	}
	// As NewNFT's: transactions are streamed to nft (RunScript).
	return &scriptNFT{Interface: nft, path: filepath.Join(dir, "nft")}
}

// kernelSyncer is a Syncer for cfg's table in namespace ns, writing through the real nft
// with as many elements per command as on a node.
func kernelSyncer(t testing.TB, ns string, cfg Config) *Syncer {
	t.Helper()
	s, err := NewSyncer(cfg, kernelNFT(t, ns, cfg.Family, cfg.TableName()))
	if err != nil {
		t.Fatal(err)
	}
	s.SetElementsPerCommand(MaxElementsPerCommand)
	return s
}

func nftIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	// The real nft, not "nft" from PATH: that is the wrapper of the last kernelNFT, which
	// would list that one's namespace whatever ns says.
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, realNFT(t)}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

// TestKernelAcceptsRules loads every feature's rules into a real kernel, in every
// load-balancing mode, then applies partial updates of each kind, and checks the kernel
// holds what the syncer thinks.
func TestKernelAcceptsRules(t *testing.T) {
	requireRoot(t)
	for _, fam := range []Family{IPv4, IPv6} {
		for _, mode := range LBModes() {
			t.Run(fam.String()+" "+string(mode), func(t *testing.T) {
				kernelAcceptsRules(t, fam, mode)
			})
		}
	}
}

// TestRulesetRoundTrips: what nft lists of a table, in every load-balancing mode, loads
// again with nft -f (nftables.service and backups save a host's ruleset with `nft list
// ruleset` and restore it; one table nft cannot read back fails the whole restore).
// nft 1.0.6 prints some expressions it cannot parse back, e.g. a bitwise operation
// inside a concatenation unless it comes first.
func TestRulesetRoundTrips(t *testing.T) {
	requireRoot(t)
	for _, fam := range []Family{IPv4, IPv6} {
		for _, mode := range LBModes() {
			t.Run(fam.String()+" "+string(mode), func(t *testing.T) {
				ns := newNetns(t)
				svcs := featureServices(fam)
				for _, ports := range svcs {
					for _, p := range ports {
						p.LoadBalancing = mode
					}
				}
				if _, err := kernelSyncer(t, ns, testConfig(fam)).Full(context.Background(), svcs); err != nil {
					t.Fatal(err)
				}
				listing := nftIn(t, ns, "list", "ruleset")
				nftIn(t, ns, "flush", "ruleset")
				cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
				cmd.Stdin = strings.NewReader(listing)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("nft -f of the listing: %v: %s", err, out)
				}
				if again := nftIn(t, ns, "list", "ruleset"); again != listing {
					t.Errorf("the reloaded ruleset lists differently")
				}
			})
		}
	}
}

func kernelAcceptsRules(t *testing.T, fam Family, mode LBMode) {
	ns := newNetns(t)
	cfg := testConfig(fam)
	s := kernelSyncer(t, ns, cfg)
	ctx := context.Background()
	svcs := featureServices(fam)
	for _, ports := range svcs {
		for _, p := range ports {
			p.LoadBalancing = mode
		}
	}
	if _, err := s.Full(ctx, svcs); err != nil {
		t.Fatalf("full sync rejected by the kernel: %v", err)
	}
	// A second full sync over the existing table (a restart) must also work.
	if _, err := s.Full(ctx, svcs); err != nil {
		t.Fatalf("second full sync: %v", err)
	}

	name := ServiceName{Namespace: "ns", Name: "cluster"}
	ports := svcs[name]
	grown := *ports[0]
	grown.ClusterEndpoints = append(append([]Endpoint{}, grown.ClusterEndpoints...), Endpoint{IP: grown.ClusterEndpoints[0].IP.Next(), Port: 8080})
	steps := []struct {
		name    string
		changes map[ServiceName][]*ServicePort
	}{
		{"endpoint added (intervals and pick chain change)", map[ServiceName][]*ServicePort{name: {&grown}}},
		{"endpoint removed again", map[ServiceName][]*ServicePort{name: ports}},
		{"service deleted", map[ServiceName][]*ServicePort{name: nil}},
		{"service added back", map[ServiceName][]*ServicePort{name: ports}},
		{"firewall service loses its ranges", func() map[ServiceName][]*ServicePort {
			n := ServiceName{Namespace: "ns", Name: "fw-allow"}
			p := *svcs[n][0]
			p.SourceRanges = nil
			return map[ServiceName][]*ServicePort{n: {&p}}
		}()},
		{"affinity service deleted", map[ServiceName][]*ServicePort{{Namespace: "ns", Name: "affinity"}: nil}},
	}
	for _, st := range steps {
		stats, err := s.Partial(ctx, st.changes)
		if err != nil {
			t.Fatalf("%s: partial sync rejected: %v", st.name, err)
		}
		if stats.Operations == 0 {
			t.Errorf("%s: partial sync did nothing", st.name)
		}
	}
	// The kernel's endpoint map must hold exactly what the syncer wrote.
	epMap := endpointsMap(mapEndpoints, TCP)
	if mode == LBConsistentHash {
		epMap = mapConsistentSlots
	}
	listing := nftIn(t, ns, "list", "map", string(familyName(fam)), cfg.TableName(), epMap)
	for _, e := range svcs[name][0].ClusterEndpoints {
		if !strings.Contains(listing, e.IP.String()) {
			t.Errorf("endpoint %s missing from the kernel map:\n%s", e, listing)
		}
	}
	if strings.Contains(listing, grown.ClusterEndpoints[2].IP.String()) {
		t.Errorf("removed endpoint %s still in the kernel map:\n%s", grown.ClusterEndpoints[2].IP, listing)
	}
	chains := nftIn(t, ns, "list", "chains", string(familyName(fam)))
	if strings.Contains(chains, affinityPrefix) {
		t.Errorf("affinity chain of the deleted Service was not removed:\n%s", chains)
	}

	// The real nft gets many elements per command; knftables' Fake one by one. The
	// same syncs must leave every set and map with the same elements in both.
	fake := knftables.NewFake(KnftFamily(fam), cfg.TableName())
	fs, err := NewSyncer(cfg, fake)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Full(ctx, svcs); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		if _, err := fs.Partial(ctx, st.changes); err != nil {
			t.Fatal(err)
		}
	}
	kernel := kernelElementCounts(t, ns, fam, cfg.TableName())
	total := 0
	for _, n := range kernel {
		total += n
	}
	if total < 20 {
		t.Fatalf("only %d elements in the kernel's sets and maps: the comparison would prove nothing", total)
	}
	for name, set := range fake.Table.Sets {
		if got, want := kernel[name], len(set.Elements); got != want {
			t.Errorf("set %s: %d elements in the kernel, %d in the fake", name, got, want)
		}
	}
	for name, m := range fake.Table.Maps {
		if got, want := kernel[name], len(m.Elements); got != want {
			t.Errorf("map %s: %d elements in the kernel, %d in the fake", name, got, want)
		}
	}
}

func familyName(f Family) knftables.Family {
	if f == IPv6 {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

var _ = time.Second

func TestProbe(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	inNetns := func(fam Family, table string) (knftables.Interface, error) {
		return kernelNFT(t, ns, fam, table), nil
	}
	if err := Probe(context.Background(), inNetns); err != nil {
		t.Fatalf("probe on a real kernel: %v", err)
	}
	if out := nftIn(t, ns, "list", "tables"); strings.TrimSpace(out) != "" {
		t.Errorf("probe must not leave anything behind, found:\n%s", out)
	}
	missing := func(Family, string) (knftables.Interface, error) {
		return nil, exec.ErrNotFound
	}
	err := Probe(context.Background(), missing)
	if err == nil || !strings.Contains(err.Error(), "nft is missing") || !strings.Contains(err.Error(), "IPv6") {
		t.Errorf("probe without nft: want a clear error naming both families, got %v", err)
	}
}

// TestDeleteTableTouchesOnlyItsOwn: cleanup of one instance leaves other instances and
// foreign tables (a legacy kube-proxy's) alone.
func TestDeleteTableTouchesOnlyItsOwn(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	ctx := context.Background()
	nftIn(t, ns, "add", "table", "ip", "kube-proxy")
	for i, inst := range []string{"team-a", "team-b"} {
		for _, fam := range []Family{IPv4, IPv6} {
			cfg := testConfig(fam)
			cfg.Instance, cfg.Slot = inst, i
			s := kernelSyncer(t, ns, cfg)
			if _, err := s.Full(ctx, featureServices(fam)); err != nil {
				t.Fatalf("%s %s: %v", inst, fam, err)
			}
		}
	}
	for _, fam := range []Family{IPv4, IPv6} {
		if err := DeleteTable(ctx, kernelNFT(t, ns, fam, "shardproxy-team-a")); err != nil {
			t.Fatal(err)
		}
	}
	tables := nftIn(t, ns, "list", "tables")
	for _, want := range []string{"table ip kube-proxy", "table ip shardproxy-team-b", "table ip6 shardproxy-team-b"} {
		if !strings.Contains(tables, want) {
			t.Errorf("%q was removed by team-a's cleanup:\n%s", want, tables)
		}
	}
	if strings.Contains(tables, "team-a") {
		t.Errorf("team-a's tables survived cleanup:\n%s", tables)
	}
	// Deleting again is not an error.
	if err := DeleteTable(ctx, kernelNFT(t, ns, IPv4, "shardproxy-team-a")); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

// kernelElementCounts returns the number of elements of every set and map of a table, as
// the kernel holds them.
// kernelJSON is the objects of `nft -j list table` of a table in namespace ns.
func kernelJSON(t *testing.T, ns string, fam Family, table string) []map[string]json.RawMessage {
	t.Helper()
	out := nftIn(t, ns, "-j", "list", "table", string(familyName(fam)), table)
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parsing nft -j: %v", err)
	}
	return doc.Nftables
}

func kernelElementCounts(t *testing.T, ns string, fam Family, table string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, obj := range kernelJSON(t, ns, fam, table) {
		for _, kind := range []string{"set", "map"} {
			raw, ok := obj[kind]
			if !ok {
				continue
			}
			var s struct {
				Name string            `json:"name"`
				Elem []json.RawMessage `json:"elem"`
			}
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatalf("parsing %s: %v", kind, err)
			}
			counts[s.Name] = len(s.Elem)
		}
	}
	return counts
}

// inNetns runs fn on an OS thread switched into namespace ns (sockets it opens and
// processes it starts belong there); the thread is discarded afterwards.
func inNetns(t *testing.T, ns string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		h, err := vnetns.GetFromName(ns)
		if err != nil {
			t.Errorf("opening namespace %s: %v", ns, err)
			return
		}
		defer h.Close()
		if err := vnetns.Set(h); err != nil {
			t.Errorf("entering namespace %s: %v", ns, err)
			return
		}
		fn()
	}()
	<-done
}

// TestTableExistsOverNetlink: with knftables.UseNetlink (as the supervisor opens its
// tables) listing goes over netlink, which answers a missing table with an empty list
// or ENOENT rather than nft's "not found"; a first full sync into a fresh namespace, a
// table deleted from outside and the sync that rebuilds it must all still be seen, also
// when a NetlinkWriter asks the kernel for the base chain alone.
func TestTableExistsOverNetlink(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	inNetns(t, ns, func() {
		ctx := context.Background()
		for _, tc := range []struct {
			fam    Family
			direct bool
		}{{IPv4, false}, {IPv6, false}, {IPv4, true}, {IPv6, true}} {
			fam := tc.fam
			cfg := testConfig(fam)
			// A fresh start: the case before rebuilt this family's table.
			_ = exec.Command("nft", "delete", "table", string(KnftFamily(fam)), cfg.TableName()).Run()
			knft, err := knftables.New(KnftFamily(fam), cfg.TableName(), knftables.UseNetlink)
			if err != nil {
				t.Fatalf("knftables.New: %v", err)
			}
			nft := &listCounter{Interface: knft}
			s, err := NewSyncer(cfg, nft)
			if err != nil {
				t.Fatal(err)
			}
			if tc.direct {
				w, err := NewNetlinkWriter(cfg)
				if err != nil {
					t.Fatal(err)
				}
				s.SetDirect(w)
				defer w.Close()
			}
			check := func(when string, want bool) {
				t.Helper()
				got, err := s.TableExists(ctx)
				if err != nil || got != want {
					t.Errorf("%s (writer asks: %v) %s: TableExists = %v, %v; want %v", fam, tc.direct, when, got, err, want)
				}
			}
			check("before any sync", false)
			if _, err := s.Full(ctx, featureServices(fam)); err != nil {
				t.Fatalf("%s first full sync into a fresh namespace: %v", fam, err)
			}
			nft.lists = 0
			check("after the full sync", true)
			if tc.direct && nft.lists != 0 {
				t.Errorf("%s: TableExists listed chains %d times; the writer should have asked for the base chain alone", fam, nft.lists)
			}
			if out, err := exec.Command("nft", "delete", "table", string(KnftFamily(fam)), cfg.TableName()).CombinedOutput(); err != nil {
				t.Fatalf("deleting the table from outside: %v: %s", err, out)
			}
			check("after the table was deleted from outside", false)
			if _, err := s.Full(ctx, featureServices(fam)); err != nil {
				t.Fatalf("%s rebuilding full sync: %v", fam, err)
			}
			check("after the rebuild", true)
		}
	})
}

// listCounter counts List calls.
type listCounter struct {
	knftables.Interface
	lists int
}

func (l *listCounter) List(ctx context.Context, objectType string) ([]string, error) {
	l.lists++
	return l.Interface.List(ctx, objectType)
}

// TestRunScriptIsAllOrNothing: a streamed script runs whole or not at all, in the real
// kernel: written to the end it is committed; cut short by its writer, or refused by nft
// midway, nothing of it is, and nft's reason reaches the caller.
func TestRunScriptIsAllOrNothing(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	nft := kernelNFT(t, ns, IPv4, "sp-script").(ScriptRunner)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		table   string
		write   func(w io.Writer) error
		wantErr string // "" : committed
	}{
		{"written to the end", "sp-whole", func(w io.Writer) error {
			_, err := io.WriteString(w, "add table ip sp-whole\nadd chain ip sp-whole c\n")
			return err
		}, ""},
		{"cut short by the writer", "sp-cut", func(w io.Writer) error {
			// More than any buffer on the way: nft has read the start when it fails.
			script := "add table ip sp-cut\n"
			for i := range 10000 {
				script += fmt.Sprintf("add chain ip sp-cut c%d\n", i)
			}
			if _, err := io.WriteString(w, script); err != nil {
				return err
			}
			return errors.New("rendering failed")
		}, "rendering failed"},
		{"refused by nft midway", "sp-refused", func(w io.Writer) error {
			_, err := io.WriteString(w, "add table ip sp-refused\nadd chain ip sp-refused c\nadd rule ip sp-refused c no-such-expression\n")
			return err
		}, "no-such-expression"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := nft.RunScript(ctx, false, tc.write)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("RunScript: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("RunScript = %v, want an error saying %q", err, tc.wantErr)
			}
			tables := nftIn(t, ns, "list", "tables")
			if has := strings.Contains(tables, "table ip "+tc.table+"\n"); has != (tc.wantErr == "") {
				t.Errorf("table %s in the kernel: %v, want %v (tables: %q)", tc.table, has, tc.wantErr == "", tables)
			}
		})
	}
}

// TestRotationChainsFollowTheConfig: the rotation chains and their map of slots are in
// a table only while its instance may have consistentHash Services
// (Config.ConsistentHash); a full sync after the setting is turned off deletes what an
// earlier run left, and one after it is turned on again brings them back, in the real
// kernel and in the Fake.
func TestRotationChainsFollowTheConfig(t *testing.T) {
	ctx := context.Background()
	for _, backend := range []string{"fake", "kernel"} {
		t.Run(backend, func(t *testing.T) {
			var ns string
			var fake *knftables.Fake
			if backend == "kernel" {
				requireRoot(t)
				ns = newNetns(t)
			} else {
				cfg := testConfig(IPv4)
				fake = knftables.NewFake(knftables.IPv4Family, cfg.TableName())
			}
			for i, step := range []struct {
				consistentHash bool
				mode           LBMode
			}{{true, LBConsistentHash}, {false, LBRandom}, {true, LBConsistentHash}} {
				cfg := testConfig(IPv4)
				cfg.ConsistentHash = step.consistentHash
				var nft knftables.Interface = fake
				if ns != "" {
					nft = kernelNFT(t, ns, IPv4, cfg.TableName())
				}
				s, err := NewSyncer(cfg, nft)
				if err != nil {
					t.Fatal(err)
				}
				web := sp("web", 80, withEndpoints([]Endpoint{ep("10.244.1.2", 8080), ep("10.244.1.3", 8080), ep("10.244.2.2", 8080)}, nil),
					func(p *ServicePort) { p.LoadBalancing = step.mode })
				if _, err := s.Full(ctx, services(web)); err != nil {
					t.Fatalf("step %d: full sync: %v", i, err)
				}
				rotationChains, chains, maps := rotationState(t, nft)
				want := 0
				if step.consistentHash {
					want = rotations
				}
				if rotationChains != want || slices.Contains(maps, mapConsistentSlots) != step.consistentHash ||
					slices.Contains(chains, "pick-ch-256") != step.consistentHash {
					t.Errorf("step %d (consistentHash %v): %d rotation chains (want %d), maps %v, chains with pick-ch-256: %v",
						i, step.consistentHash, rotationChains, want, maps, slices.Contains(chains, "pick-ch-256"))
				}
			}
		})
	}
}

// TestRotationChainsOfAnEarlierVersion: a table written when every table had 256
// rotation chains (before 128; each chain's rule binds ch-slots) takes one full sync,
// the first, whether the instance still allows consistentHash (the skeleton recreates
// ch-slots, so chains 128-255 are emptied first) or not (all of them and the map go).
func TestRotationChainsOfAnEarlierVersion(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for _, consistentHash := range []bool{true, false} {
		t.Run(fmt.Sprintf("consistentHash %v", consistentHash), func(t *testing.T) {
			ns := newNetns(t)
			cfg := testConfig(IPv4)
			nft := kernelNFT(t, ns, IPv4, cfg.TableName())
			s := nftSyncer(t, cfg, nft)
			web := sp("web", 80, withEndpoints([]Endpoint{ep("10.244.1.2", 8080), ep("10.244.2.2", 8080)}, nil),
				func(p *ServicePort) { p.LoadBalancing = LBConsistentHash })
			if _, err := s.Full(ctx, services(web)); err != nil {
				t.Fatal(err)
			}
			writeRotationLayout(t, nft, s.c, 256)

			cfg.ConsistentHash = consistentHash
			if !consistentHash {
				web.LoadBalancing = LBRandom
			}
			s = nftSyncer(t, cfg, nft)
			if _, err := s.Full(ctx, services(web)); err != nil {
				t.Fatalf("the first full sync over the earlier layout: %v", err)
			}
			left, _, maps := rotationState(t, nft)
			want := 0
			if consistentHash {
				want = rotations
			}
			if left != want || slices.Contains(maps, mapConsistentSlots) != consistentHash {
				t.Errorf("%d rotation chains (want %d), maps %v", left, want, maps)
			}
		})
	}
}

// writeRotationLayout rewrites the rotation chains of the table as a version with n
// rotations had them, in one transaction: ch-slots is recreated with all n chains
// binding it (a rule added later could not use a typeof map).
func writeRotationLayout(t *testing.T, nft knftables.Interface, c *compiler, n int) {
	t.Helper()
	tx := nft.NewTransaction()
	for k := range rotations {
		tx.Flush(&knftables.Chain{Name: rotationChain(k)})
	}
	m := c.skeleton(Priorities{}).Maps
	i := slices.IndexFunc(m, func(m *knftables.Map) bool { return m.Name == mapConsistentSlots })
	tx.Delete(&knftables.Map{Name: mapConsistentSlots})
	tx.Add(m[i])
	for k := range n {
		tx.Add(&knftables.Chain{Name: rotationChain(k)})
		tx.Add(&knftables.Rule{Chain: rotationChain(k), Rule: fmt.Sprintf("dnat %s to %s ^ 0x%x . %s map @%s",
			c.ip, c.slotPayload, k, c.entryKey(), mapConsistentSlots)})
	}
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatalf("writing %d rotation chains: %v", n, err)
	}
}

// rotationState lists the table's chains and maps, and counts its rotation chains.
func rotationState(t *testing.T, nft knftables.Interface) (rotationChains int, chains, maps []string) {
	t.Helper()
	ctx := context.Background()
	chains, err := nft.List(ctx, "chains")
	if err != nil {
		t.Fatal(err)
	}
	maps, err = nft.List(ctx, "maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if _, ok := parseRotationChain(ch); ok {
			rotationChains++
		}
	}
	return rotationChains, chains, maps
}

// TestAffinityChainsOfAnEarlierVersion: a table written by a version with a chain per
// affinity endpoint ("aff-<id>-ep-<ep>", the class chain jumping to them) is taken over
// by the first full sync: the per-endpoint chains and the class chain are deleted (the
// port's rules are in its affinity bucket now), and the clients the sets remember stay.
func TestAffinityChainsOfAnEarlierVersion(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	ns := newNetns(t)
	cfg := testConfig(IPv4)
	nft := kernelNFT(t, ns, IPv4, cfg.TableName())
	s := nftSyncer(t, cfg, nft)
	eps := []Endpoint{ep("10.244.1.2", 8080), ep("10.244.2.2", 8080)}
	sticky := sp("sticky", 80, withEndpoints(eps, nil), func(p *ServicePort) { p.AffinityTimeout = 300 * time.Second })
	if _, err := s.Full(ctx, services(sticky)); err != nil {
		t.Fatal(err)
	}
	// The earlier layout, as that version wrote it, and a remembered client.
	spn := sticky.Name
	spn.Protocol = TCP
	id := portID(spn, sticky.AffinityTimeout)
	class := affinityPrefix + id + "-int"
	tx := nft.NewTransaction()
	tx.Add(&knftables.Chain{Name: class})
	var picks []string
	for i, e := range eps {
		set, chain := affinityPrefix+id+"-"+endpointID(e), affinityPrefix+id+"-ep-"+endpointID(e)
		tx.Add(&knftables.Chain{Name: chain})
		tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("update @%s { ip saddr }", set)})
		tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("meta l4proto tcp dnat ip to %s", e)})
		tx.Add(&knftables.Rule{Chain: class, Rule: fmt.Sprintf("ip saddr @%s goto %s", set, chain)})
		picks = append(picks, fmt.Sprintf("%d : goto %s", i, chain))
	}
	tx.Add(&knftables.Rule{Chain: class, Rule: "numgen random mod 2 vmap { " + strings.Join(picks, " , ") + " }"})
	remembered := affinityPrefix + id + "-" + endpointID(eps[1])
	tx.Add(&knftables.Element{Set: remembered, Key: []string{"198.51.100.7"}})
	if err := nft.Run(ctx, tx); err != nil {
		t.Fatalf("writing the earlier layout: %v", err)
	}

	s = nftSyncer(t, cfg, nft)
	if _, err := s.Full(ctx, services(sticky)); err != nil {
		t.Fatalf("the first full sync over the earlier layout: %v", err)
	}
	if chains := nftIn(t, ns, "list", "chains", "ip"); strings.Contains(chains, "-ep-") {
		t.Errorf("per-endpoint affinity chains left:\n%s", chains)
	}
	// The port's rules are in its bucket now (before, in a chain of its own).
	if chains := nftIn(t, ns, "list", "chains", "ip"); strings.Contains(chains, class) || !strings.Contains(chains, affinityBucketPrefix) {
		t.Errorf("the class chain %s is left, or no affinity bucket:\n%s", class, chains)
	}
	elems, err := nft.ListElements(ctx, "set", remembered)
	if err != nil || len(elems) != 1 || elems[0].Key[0] != "198.51.100.7" {
		t.Errorf("the remembered client: %v, %v; want 198.51.100.7 still in %s", elems, err, remembered)
	}
}

// nftSyncer is a Syncer for cfg over nft, as a (re)started instance has it.
func nftSyncer(t *testing.T, cfg Config, nft knftables.Interface) *Syncer {
	t.Helper()
	s, err := NewSyncer(cfg, nft)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
