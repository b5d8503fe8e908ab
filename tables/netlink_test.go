package tables

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// fakeNetlink applies Diffs to a knftables.Fake as NetlinkWriter applies them to the
// kernel (refusing those with rule text, in the same order), counting what it got.
type fakeNetlink struct {
	fake    *knftables.Fake
	applied int
}

func (w *fakeNetlink) Apply(ctx context.Context, d *Diff) error {
	if d.NeedsRuleText() {
		return fmt.Errorf("a Diff with rule text reached the netlink applier")
	}
	w.applied++
	tx := w.fake.NewTransaction()
	for _, id := range d.DeleteElements {
		tx.Delete(elementFromID(id).object())
	}
	for _, ch := range d.FlushChains {
		tx.Flush(&knftables.Chain{Name: ch})
	}
	// As NetlinkWriter: an edit's removed rules one by one by handle (by position),
	// then its appended ones; other chains rewritten.
	for _, ch := range d.WriteChains {
		if ch.Edit != nil {
			chain := w.fake.Table.Chains[ch.Name]
			if chain == nil {
				return fmt.Errorf("chain %s is not there", ch.Name)
			}
			rules := chain.Rules
			if len(rules) != ch.Edit.Held {
				return fmt.Errorf("chain %s has %d rules; want %d", ch.Name, len(rules), ch.Edit.Held)
			}
			for _, rm := range ch.Edit.Remove {
				if rules[rm.At].Rule != rm.Rule.String() {
					return fmt.Errorf("chain %s: rule %d is %q; want %q", ch.Name, rm.At, rules[rm.At].Rule, rm.Rule)
				}
				tx.Delete(&knftables.Rule{Chain: ch.Name, Handle: rules[rm.At].Handle})
			}
			for _, r := range ch.Edit.Append {
				tx.Add(&knftables.Rule{Chain: ch.Name, Rule: r.String()})
			}
			continue
		}
		tx.Add(&knftables.Chain{Name: ch.Name})
		if ch.MayExist {
			tx.Flush(&knftables.Chain{Name: ch.Name})
		}
		for _, r := range ch.text() {
			tx.Add(&knftables.Rule{Chain: ch.Name, Rule: r})
		}
	}
	for _, id := range d.AddElements {
		tx.Add(elementFromID(id).object())
	}
	for _, ch := range d.DeleteChains {
		tx.Delete(&knftables.Chain{Name: ch})
	}
	for _, st := range d.DeleteSets {
		tx.Delete(&knftables.Set{Name: st})
	}
	return w.fake.Run(ctx, tx)
}

func TestParseFields(t *testing.T) {
	for _, tc := range []struct {
		spec   string
		typeOf bool
		want   []field
		err    bool
	}{
		{"ipv4_addr . inet_proto . inet_service", false, []field{fieldIPv4, fieldProto, fieldPort}, false},
		{"ipv6_addr . ipv6_addr", false, []field{fieldIPv6, fieldIPv6}, false},
		{"verdict", false, []field{fieldVerdict}, false},
		{"ip daddr . tcp dport . numgen random mod 1", true, []field{fieldIPv4, fieldPort, fieldIndex}, false},
		{"ip6 daddr . sctp dport", true, []field{fieldIPv6, fieldPort}, false},
		{"ether_addr", false, nil, true},
		{"meta mark", true, nil, true},
	} {
		got, err := parseFields(tc.spec, tc.typeOf)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("parseFields(%q, %v) = %v, %v; want %v (error: %v)", tc.spec, tc.typeOf, got, err, tc.want, tc.err)
		}
	}
}

// TestEncodeElements pins the byte layout nft uses: every concatenated field padded to
// 4 bytes, ports big-endian, numgen's index in host order, ranges as key and key end.
func TestEncodeElements(t *testing.T) {
	schemas4, err := schemasOf(testConfig(IPv4))
	if err != nil {
		t.Fatal(err)
	}
	schemas6, err := schemasOf(testConfig(IPv6))
	if err != nil {
		t.Fatal(err)
	}
	index1 := binary.NativeEndian.AppendUint32(nil, 1) // numgen writes its register in host order
	for _, tc := range []struct {
		name    string
		schemas map[string]setSchema
		el      *knftables.Element
		want    nftables.SetElement
	}{
		{"cluster IP", schemas4, &knftables.Element{Set: setClusterIPs, Key: []string{"172.30.0.1"}},
			nftables.SetElement{Key: []byte{172, 30, 0, 1}}},
		{"entry to pick chain", schemas4, &knftables.Element{Map: mapServiceIPs, Key: []string{"172.30.0.1", "udp", "53"}, Value: []string{"goto pick-2"}},
			nftables.SetElement{Key: []byte{172, 30, 0, 1, 17, 0, 0, 0, 0, 53, 0, 0}, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "pick-2"}}},
		{"no endpoints drop", schemas4, &knftables.Element{Map: mapNoEndpoints, Key: []string{"172.30.0.1", "sctp", "8080"}, Value: []string{"drop"}},
			nftables.SetElement{Key: []byte{172, 30, 0, 1, 132, 0, 0, 0, 0x1f, 0x90, 0, 0}, VerdictData: &expr.Verdict{Kind: expr.VerdictDrop}}},
		{"endpoint", schemas4, &knftables.Element{Map: endpointsMap(mapEndpoints, TCP), Key: []string{"172.30.0.1", "80", "1"}, Value: []string{"10.244.0.7", "8080"}},
			nftables.SetElement{Key: append([]byte{172, 30, 0, 1, 0, 80, 0, 0}, index1...), Val: []byte{10, 244, 0, 7, 0x1f, 0x90, 0, 0}}},
		{"source range", schemas4, &knftables.Element{Set: setFirewallAllow, Key: []string{"192.168.1.1", "tcp", "80", "10.1.0.0/16"}},
			nftables.SetElement{Key: []byte{192, 168, 1, 1, 6, 0, 0, 0, 0, 80, 0, 0, 10, 1, 0, 0}, KeyEnd: []byte{192, 168, 1, 1, 6, 0, 0, 0, 0, 80, 0, 0, 10, 1, 255, 255}}},
		{"consistentHash entry to its port: a lone inet_service is 2 bytes", schemas4, &knftables.Element{Map: mapClusterPortOf, Key: []string{"192.168.1.1", "tcp", "30080"}, Value: []string{"80"}},
			nftables.SetElement{Key: []byte{192, 168, 1, 1, 6, 0, 0, 0, 0x75, 0x80, 0, 0}, Val: []byte{0, 80}}},
		{"consistentHash entry to its cluster IP", schemas4, &knftables.Element{Map: mapClusterIPOf, Key: []string{"192.168.1.1", "tcp", "30080"}, Value: []string{"172.30.0.1"}},
			nftables.SetElement{Key: []byte{192, 168, 1, 1, 6, 0, 0, 0, 0x75, 0x80, 0, 0}, Val: []byte{172, 30, 0, 1}}},
		{"consistentHash slot", schemas4, &knftables.Element{Map: mapConsistentSlots, Key: []string{"7", "172.30.0.1", "tcp", "80"}, Value: []string{"10.244.0.7", "8080"}},
			nftables.SetElement{Key: []byte{7, 0, 0, 0, 172, 30, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0}, Val: []byte{10, 244, 0, 7, 0x1f, 0x90, 0, 0}}},
		{"hairpin v6", schemas6, &knftables.Element{Set: setHairpin, Key: []string{"fd00::1", "fd00::1"}},
			nftables.SetElement{Key: append(netip.MustParseAddr("fd00::1").AsSlice(), netip.MustParseAddr("fd00::1").AsSlice()...)}},
		{"source range v6", schemas6, &knftables.Element{Set: setFirewallAllow, Key: []string{"fd00::1", "tcp", "80", "fd01::/127"}},
			nftables.SetElement{
				Key:    slices.Concat(netip.MustParseAddr("fd00::1").AsSlice(), []byte{6, 0, 0, 0, 0, 80, 0, 0}, netip.MustParseAddr("fd01::").AsSlice()),
				KeyEnd: slices.Concat(netip.MustParseAddr("fd00::1").AsSlice(), []byte{6, 0, 0, 0, 0, 80, 0, 0}, netip.MustParseAddr("fd01::1").AsSlice())}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.schemas[setOf(tc.el)].encode(tc.el, false)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("encoding (-want +got):\n%s", diff)
			}
			// The writer encodes straight from element ids.
			got, err = tc.schemas[setOf(tc.el)].encodeID(idOf(tc.el), false)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("encoding from the id (-want +got):\n%s", diff)
			}
		})
	}

	for _, bad := range []*knftables.Element{
		{Set: setClusterIPs, Key: []string{"fd00::1"}},                                           // wrong family
		{Map: mapServiceIPs, Key: []string{"172.30.0.1", "icmp", "80"}, Value: []string{"drop"}}, // unknown protocol
		{Map: mapServiceIPs, Key: []string{"172.30.0.1", "tcp", "80"}, Value: []string{"queue"}}, // unknown verdict
		{Map: mapServiceIPs, Key: []string{"172.30.0.1", "tcp"}, Value: []string{"drop"}},        // short key
		{Map: mapServiceIPs, Key: []string{"172.30.0.1", "tcp", "80"}},                           // no value
	} {
		if _, err := schemas4[setOf(bad)].encode(bad, false); err == nil {
			t.Errorf("element %+v encoded without an error", bad)
		}
		if _, err := schemas4[setOf(bad)].encodeID(idOf(bad), false); err == nil {
			t.Errorf("element %+v encoded from its id without an error", bad)
		}
	}
}

// randomChanges changes, deletes or re-adds 1-3 of 50 generated Services (in fam's
// addresses), applies the changes to state and returns them.
func randomChanges(rng *rand.Rand, state map[ServiceName][]*ServicePort, fam Family) map[ServiceName][]*ServicePort {
	changes := map[ServiceName][]*ServicePort{}
	for k := 0; k < 1+rng.Intn(3); k++ {
		i := rng.Intn(50)
		name := ServiceName{"gen", fmt.Sprintf("svc-%d", i)}
		if rng.Intn(4) == 0 {
			changes[name] = nil
			delete(state, name)
			continue
		}
		p := genPort(i, rng.Intn(4))
		withGenMode(p)
		if rng.Intn(3) == 0 {
			p.AffinityTimeout = 0
		}
		if rng.Intn(4) == 0 {
			// A Service changes its mode (its annotation); consistentHash is svc-3's
			// alone (consistentSvc3), its 256-slot tables being large.
			p.LoadBalancing = LBModes()[rng.Intn(3)]
		}
		if fam == IPv6 {
			p = toIPv6(p)
		}
		changes[name] = []*ServicePort{p}
		state[name] = changes[name]
	}
	return changes
}

// toIPv6 moves a generated IPv4 port into IPv6: fd00::<the IPv4 address>.
func toIPv6(p *ServicePort) *ServicePort {
	v6 := func(a netip.Addr) netip.Addr {
		b := a.As4()
		return netip.AddrFrom16([16]byte{0: 0xfd, 12: b[0], 13: b[1], 14: b[2], 15: b[3]})
	}
	q := *p
	q.ClusterIP = v6(p.ClusterIP)
	q.LoadBalancerIPs, q.SourceRanges, q.ClusterEndpoints, q.LocalEndpoints = nil, nil, nil, nil
	for _, a := range p.LoadBalancerIPs {
		q.LoadBalancerIPs = append(q.LoadBalancerIPs, v6(a))
	}
	for _, r := range p.SourceRanges {
		q.SourceRanges = append(q.SourceRanges, netip.PrefixFrom(v6(r.Addr()), 96+r.Bits()))
	}
	for _, e := range p.ClusterEndpoints {
		q.ClusterEndpoints = append(q.ClusterEndpoints, Endpoint{IP: v6(e.IP), Port: e.Port})
	}
	for _, e := range p.LocalEndpoints {
		q.LocalEndpoints = append(q.LocalEndpoints, Endpoint{IP: v6(e.IP), Port: e.Port})
	}
	return &q
}

// TestNetlinkWriterMatchesNft runs the same random partial syncs on two real tables, one
// written only by nft and one whose element changes go over netlink, and compares what
// `nft list` shows of both after every step: the netlink encoding must be nft's.
func TestNetlinkWriterMatchesNft(t *testing.T) {
	requireRoot(t)
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			cfg := testConfig(fam)
			nsNft, nsNetlink := newNetns(t), newNetns(t)
			byNft := kernelSyncer(t, nsNft, cfg)
			byNetlink := netlinkSyncer(t, nsNetlink, cfg)

			ctx := context.Background()
			state := map[ServiceName][]*ServicePort{}
			for name, ports := range generated(40) {
				if fam == IPv6 {
					ports = []*ServicePort{toIPv6(ports[0])}
				}
				state[name] = ports
			}
			consistentSvc3(state)
			for _, s := range []*Syncer{byNft, byNetlink} {
				if _, err := s.Full(ctx, state); err != nil {
					t.Fatal(err)
				}
			}
			rng := rand.New(rand.NewSource(3))
			direct, steps := 0, testutil.Steps(60)
			for step := 0; step < steps; step++ {
				changes := randomChanges(rng, state, fam)
				consistentSvc3(changes) // ch-slots, and its one-byte slot, over netlink too
				if _, err := byNft.Partial(ctx, changes); err != nil {
					t.Fatalf("step %d through nft: %v", step, err)
				}
				stats, err := byNetlink.Partial(ctx, changes)
				if err != nil {
					t.Fatalf("step %d over netlink: %v", step, err)
				}
				if stats.Direct {
					direct++
				}
				want := kernelContent(t, nsNft, fam, cfg.TableName())
				if diff := cmp.Diff(want, kernelContent(t, nsNetlink, fam, cfg.TableName())); diff != "" {
					t.Fatalf("step %d (direct: %v): tables differ (-nft +netlink):\n%s", step, stats.Direct, diff)
				}
			}
			if direct < steps/4 {
				t.Errorf("only %d of %d partial syncs went over netlink: the comparison proves little", direct, steps)
			}
		})
	}
}

// kernelContent is every set's and map's elements and every chain's rules of a table in
// the kernel, as `nft -j list table` shows them, sorted (set order is the kernel's).
func kernelContent(t *testing.T, ns string, fam Family, table string) []string {
	t.Helper()
	var lines []string
	for _, obj := range kernelJSON(t, ns, fam, table) {
		for kind, raw := range obj {
			var o struct {
				Name  string            `json:"name"`
				Chain string            `json:"chain"`
				Elem  []json.RawMessage `json:"elem"`
				Expr  json.RawMessage   `json:"expr"`
			}
			if err := json.Unmarshal(raw, &o); err != nil {
				continue // metainfo
			}
			switch kind {
			case "set", "map", "chain":
				lines = append(lines, kind+" "+o.Name)
				for _, e := range o.Elem {
					lines = append(lines, kind+" "+o.Name+" "+string(e))
				}
			case "rule":
				lines = append(lines, "rule "+o.Chain+" "+string(o.Expr))
			}
		}
	}
	sort.Strings(lines)
	if len(lines) < 50 {
		t.Fatalf("only %d lines in table %s: nothing to compare", len(lines), table)
	}
	return lines
}

// TestLargeRemovalsGoThroughNft: a partial sync whose netlink transaction would take more
// messages than the socket can acknowledge (deleting a ClientIP-affinity Service with
// 150 endpoints: a delete per set and per rule of its bucket group) goes through nft;
// a small one goes through the direct applier.
func TestLargeRemovalsGoThroughNft(t *testing.T) {
	for _, tc := range []struct {
		endpoints int
		direct    bool
	}{
		{3, true},
		{150, false},
	} {
		s, fake := newFake(t, testConfig(IPv4))
		s.SetDirect(&fakeNetlink{fake: fake})
		p := genPort(7, tc.endpoints) // every 7th generated port has ClientIP affinity
		if p.AffinityTimeout == 0 {
			t.Fatal("genPort(7) has no affinity")
		}
		name := ServiceName{"gen", "svc-7"}
		fullSync(t, s, services(p))
		stats, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{name: nil})
		if err != nil {
			t.Fatal(err)
		}
		if stats.Direct != tc.direct {
			t.Errorf("%d endpoints: deleting the affinity Service went over netlink: %v, want %v", tc.endpoints, stats.Direct, tc.direct)
		}
		fixed, left := skeletonNames(), 0
		for name := range fake.Table.Chains {
			if !fixed["chain "+name] {
				left++
			}
		}
		for name := range fake.Table.Sets {
			if !fixed["set "+name] {
				left++
			}
		}
		if left > 0 {
			t.Errorf("%d endpoints: %d chains and sets besides the skeleton's left after the deletion", tc.endpoints, left)
		}
	}
}

func TestNetlinkMessages(t *testing.T) {
	ids := func(set string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = element{set: set, key: []string{fmt.Sprintf("10.0.0.%d", i)}}.id()
		}
		return out
	}
	r1, r2, r3, r4 := roundRobinRule(entry{}, 1), roundRobinRule(entry{}, 2), roundRobinRule(entry{}, 3), roundRobinRule(entry{}, 4)
	for _, tc := range []struct {
		name           string
		added, deleted []string
		chains, sets   int
		write          []ChainRules
		want           int
	}{
		{"nothing", nil, nil, 0, 0, nil, 0},
		{"one set each way", ids("a", 3), ids("a", 2), 0, 0, nil, 2},
		{"two sets", append(ids("a", 3), ids("b", 1)...), nil, 0, 0, nil, 2},
		{"chunks", ids("a", 2*netlinkChunk+1), nil, 0, 0, nil, 3},
		{"chains and sets", nil, ids("a", 1), 10, 10, nil, 31},
		// A bucket: add (and flush, if it may exist) and two messages per rule (its
		// echo and its ack), or a delete per removed rule and two per appended one.
		{"new bucket", nil, nil, 0, 0, []ChainRules{{Name: "b", Rules: []string{"r1", "r2"}}}, 5},
		{"rewritten bucket", nil, nil, 0, 0, []ChainRules{{Name: "b", Rules: []string{"r1", "r2"}, MayExist: true}}, 6},
		{"delta", nil, nil, 0, 0, []ChainRules{{Name: "b", Bucket: []BucketRule{r1, r4}, MayExist: true,
			Edit: &ChainEdit{Held: 3, Remove: []PlacedRule{{1, r2}, {2, r3}}, Append: []BucketRule{r4}}}}, 4},
	} {
		d := &Diff{AddElements: tc.added, DeleteElements: tc.deleted, WriteChains: tc.write}
		for i := 0; i < tc.chains; i++ {
			d.FlushChains = append(d.FlushChains, fmt.Sprintf("aff-x-%d", i))
		}
		d.DeleteChains = d.FlushChains
		for i := 0; i < tc.sets; i++ {
			d.DeleteSets = append(d.DeleteSets, fmt.Sprintf("aff-x-%d", i))
		}
		if got := netlinkMessages(d); got != tc.want {
			t.Errorf("%s: %d messages, want %d", tc.name, got, tc.want)
		}
	}
}

// TestKernelLargeAffinityRemoval: on a real table with the netlink writer, deleting a
// ClientIP-affinity Service with 400 endpoints (a set removal each: more messages than
// the socket can acknowledge, ~280) goes through nft, succeeds, and leaves none of its
// chains and sets behind. (With a chain per endpoint, before b599033, 100 endpoints
// took ~300 messages; 150 now take ~150, which netlink would acknowledge too.)
func TestKernelLargeAffinityRemoval(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(IPv4)
	ns := newNetns(t)
	s := netlinkSyncer(t, ns, cfg)
	ctx := context.Background()
	p := genPort(7, 0)
	for e := range 400 {
		p.ClusterEndpoints = append(p.ClusterEndpoints, Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(e >> 8), byte(e)}), Port: 8080})
	}
	p.HasEndpoints = true
	if _, err := s.Full(ctx, services(p)); err != nil {
		t.Fatal(err)
	}
	st, err := s.Partial(ctx, map[ServiceName][]*ServicePort{{"gen", "svc-7"}: nil})
	if err != nil {
		t.Fatalf("deleting the affinity Service: %v", err)
	}
	if st.Direct {
		t.Errorf("the removal of %d affinity sets went over netlink", len(p.ClusterEndpoints))
	}
	if chains := nftIn(t, ns, "list", "chains", "ip"); strings.Contains(chains, affinityPrefix) {
		t.Errorf("affinity chains left:\n%s", chains)
	}
	if sets := nftIn(t, ns, "list", "sets", "ip"); strings.Contains(sets, affinityPrefix) {
		t.Errorf("affinity sets left:\n%s", sets)
	}
}

// netlinkSyncer is a Syncer for cfg's table in namespace ns, its full syncs through nft
// and its partial syncs, where they can, through a NetlinkWriter into ns.
func netlinkSyncer(t testing.TB, ns string, cfg Config) *Syncer {
	t.Helper()
	s := kernelSyncer(t, ns, cfg)
	h, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	w, err := NewNetlinkWriter(cfg, nftables.WithNetNSFd(int(h.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	s.SetDirect(w)
	// The writer keeps its socket, which would keep the namespace alive after its
	// deletion; cleanups run last first, so this runs before h closes.
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// idOf is the element id of el.
func idOf(el *knftables.Element) string {
	return element{set: setOf(el), isMap: el.Map != "", key: el.Key, value: el.Value}.id()
}

// TestEncodeFromIDs: every element the features compile to, in both families, encodes
// from its id exactly as from its text (the writer's path before it read ids).
func TestEncodeFromIDs(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		cfg := testConfig(fam)
		schemas, err := schemasOf(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := newCompiler(&cfg)
		n := 0
		for _, ports := range featureServices(fam) {
			for _, sp := range ports {
				for _, m := range []LBMode{LBRandom, LBRoundRobin, LBConsistentHash} {
					p := *sp
					p.LoadBalancing = m
					comp := c.compile(&p, func(string) bool { return true })
					ids := slices.Clone(comp.shared)
					for _, ee := range comp.entries {
						ids = append(ids, ee.allIDs(c.slotPrefix)...)
					}
					for _, id := range ids {
						sc := schemas[idSet(id)]
						for _, del := range []bool{false, true} {
							n++
							want, err := sc.encode(elementFromID(id).object(), del)
							if err != nil {
								t.Fatalf("%s %s: %v", fam, idString(id), err)
							}
							got, err := sc.encodeID(id, del)
							if err != nil {
								t.Fatalf("%s %s: from the id: %v", fam, idString(id), err)
							}
							if diff := cmp.Diff(want, got); diff != "" {
								t.Errorf("%s %s (-text +id):\n%s", fam, idString(id), diff)
							}
						}
					}
				}
			}
		}
		if n < 1000 {
			t.Errorf("%s: only %d elements encoded", fam, n)
		}
	}
}

// setOf is the set or map an element belongs to.
func setOf(el *knftables.Element) string {
	if el.Map != "" {
		return el.Map
	}
	return el.Set
}

// TestNetlinkWriterSocketLifecycle: the writer keeps its socket between transactions
// (closing it after a deletion waits out an RCU grace period), so a failed transaction
// must not leave replies or queued messages behind for the next one, and Close must
// leave a writer that reopens on its next Apply.
func TestNetlinkWriterSocketLifecycle(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	cfg := testConfig(IPv4)
	ns := newNetns(t)
	s := netlinkSyncer(t, ns, cfg)
	w := s.direct.(*NetlinkWriter)
	if _, err := s.Full(ctx, services(genPort(1, 2))); err != nil {
		t.Fatal(err)
	}
	add := func(i int) *Diff {
		ip := fmt.Sprintf("10.9.0.%d", i)
		return &Diff{AddElements: []string{element{set: setHairpin, key: []string{ip, ip}}.id()}}
	}
	missing := &Diff{DeleteElements: []string{element{set: setHairpin, key: []string{"10.99.0.1", "10.99.0.1"}}.id()}}
	steps := []struct {
		name    string
		do      func() error
		wantErr bool
		want    []string // hairpin elements in the kernel afterwards
	}{
		{"first add opens the socket", func() error { return w.Apply(ctx, add(1)) }, false, []string{"10.9.0.1"}},
		{"second add reuses it", func() error { return w.Apply(ctx, add(2)) }, false, []string{"10.9.0.1", "10.9.0.2"}},
		{"deleting a missing element fails", func() error { return w.Apply(ctx, missing) }, true, []string{"10.9.0.1", "10.9.0.2"}},
		{"the next transaction is not poisoned", func() error { return w.Apply(ctx, add(3)) }, false, []string{"10.9.0.1", "10.9.0.2", "10.9.0.3"}},
		{"close", w.Close, false, []string{"10.9.0.1", "10.9.0.2", "10.9.0.3"}},
		{"close twice", w.Close, false, []string{"10.9.0.1", "10.9.0.2", "10.9.0.3"}},
		{"apply after close reopens", func() error { return w.Apply(ctx, add(4)) }, false, []string{"10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.0.4"}},
	}
	var first *nftables.Conn
	for i, st := range steps {
		err := st.do()
		if (err != nil) != st.wantErr {
			t.Fatalf("%s: err = %v, want error: %v", st.name, err, st.wantErr)
		}
		switch i {
		case 0:
			first = w.conn
		case 1:
			if w.conn == nil || w.conn != first {
				t.Fatalf("%s: the second transaction opened another socket", st.name)
			}
		}
		var got []string
		for _, line := range kernelContent(t, ns, IPv4, cfg.TableName()) {
			if strings.Contains(line, setHairpin) && strings.Contains(line, "10.9.0.") {
				got = append(got, line)
			}
		}
		if len(got) != len(st.want) {
			t.Fatalf("%s: hairpin elements %q, want %d of them (%v)", st.name, got, len(st.want), st.want)
		}
		for i, ip := range st.want {
			if !strings.Contains(got[i], ip) {
				t.Fatalf("%s: hairpin elements %q, want %v", st.name, got, st.want)
			}
		}
	}
}

// TestNetlinkAddsConsistentHashNodePort: a consistentHash NodePort Service added by a
// partial sync, while another keeps the shared pick chains, goes over netlink (no rule
// text) with its NodePort's cluster-ip-of and cluster-port-of elements, and the table
// is then what nft writes. cluster-port-of's value, a lone inet_service, was once sent
// padded to 4 bytes, which the kernel refused (EINVAL): every such Service fell back
// to a full sync.
func TestNetlinkAddsConsistentHashNodePort(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	cfg := testConfig(IPv4)
	nsNft, nsNetlink := newNetns(t), newNetns(t)
	byNft, byNetlink := kernelSyncer(t, nsNft, cfg), netlinkSyncer(t, nsNetlink, cfg)
	nodePortCH := func(i int) *ServicePort {
		p := genPort(i, 3)
		p.NodePort, p.AffinityTimeout, p.LoadBalancing = uint16(30000+i), 0, LBConsistentHash
		return p
	}
	first := map[ServiceName][]*ServicePort{{"gen", "svc-1"}: {nodePortCH(1)}}
	added := map[ServiceName][]*ServicePort{{"gen", "svc-2"}: {nodePortCH(2)}}
	for _, s := range []*Syncer{byNft, byNetlink} {
		if _, err := s.Full(ctx, first); err != nil {
			t.Fatal(err)
		}
		stats, err := s.Partial(ctx, added)
		if err != nil {
			t.Fatalf("adding a consistentHash NodePort Service: %v", err)
		}
		if s == byNetlink && !stats.Direct {
			t.Fatal("the partial sync did not go over netlink: the test proves nothing")
		}
	}
	if diff := cmp.Diff(kernelContent(t, nsNft, IPv4, cfg.TableName()), kernelContent(t, nsNetlink, IPv4, cfg.TableName())); diff != "" {
		t.Errorf("tables differ (-nft +netlink):\n%s", diff)
	}
}

// bucketPair is two namespaces of one family, one written through nft alone and one
// with the netlink writer, for Service ports whose cluster IP entries share a bucket.
type bucketPair struct {
	fam              Family
	cfg              Config
	nsNft, nsNetlink string
	byNft, byNetlink *Syncer
	eps              []Endpoint
	base             netip.Addr
	bucket           int
}

func newBucketPair(t *testing.T, fam Family) *bucketPair {
	b := &bucketPair{fam: fam, cfg: testConfig(fam), nsNft: newNetns(t), nsNetlink: newNetns(t),
		eps: []Endpoint{ep("10.244.1.2", 8080), ep("10.244.2.2", 8080), ep("10.244.3.2", 8080)}, base: netip.MustParseAddr("172.30.0.1")}
	if fam == IPv6 {
		b.eps = []Endpoint{ep("fd00:10:244:1::2", 8080), ep("fd00:10:244:2::2", 8080), ep("fd00:10:244:3::2", 8080)}
		b.base = netip.MustParseAddr("fd00:30::1")
	}
	b.byNft, b.byNetlink = kernelSyncer(t, b.nsNft, b.cfg), netlinkSyncer(t, b.nsNetlink, b.cfg)
	b.bucket = bucketOf(entry{b.base, TCP, 80})
	return b
}

// ports returns n Service ports named <prefix><i> over b.eps, port 80, tcp, udp and
// sctp in turn, NodePort 30000+i, on the first cluster IPs from b.base in b.bucket;
// mod finishes port i.
func (b *bucketPair) ports(prefix string, n int, mod func(i int, p *ServicePort)) []*ServicePort {
	var ports []*ServicePort
	for a := b.base; len(ports) < n; a = a.Next() {
		i, proto := len(ports), allProtocols()[len(ports)%3]
		if bucketOf(entry{a, proto, 80}) != b.bucket {
			continue
		}
		ports = append(ports, sp(fmt.Sprintf("%s%d", prefix, i), 80, withEndpoints(b.eps, nil), func(p *ServicePort) {
			p.ClusterIP, p.Protocol, p.NodePort = a, proto, 30000+uint16(i)
			mod(i, p)
		}))
	}
	return ports
}

// full fully syncs both namespaces to svcs.
func (b *bucketPair) full(t *testing.T, svcs map[ServiceName][]*ServicePort) {
	t.Helper()
	for _, s := range []*Syncer{b.byNft, b.byNetlink} {
		if _, err := s.Full(context.Background(), svcs); err != nil {
			t.Fatal(err)
		}
	}
}

// step applies one change to both namespaces, checks that chain then lists the same in
// both, in order, and returns the netlink side's stats and nft's listing of chain.
func (b *bucketPair) step(t *testing.T, name string, change map[ServiceName][]*ServicePort, chain string) (Stats, string) {
	t.Helper()
	ctx := context.Background()
	if _, err := b.byNft.Partial(ctx, change); err != nil {
		t.Fatalf("%s through nft: %v", name, err)
	}
	stats, err := b.byNetlink.Partial(ctx, change)
	if err != nil {
		t.Fatalf("%s over netlink: %v", name, err)
	}
	want := b.listChain(t, b.nsNft, chain)
	if got := b.listChain(t, b.nsNetlink, chain); got != want {
		t.Errorf("%s: %s over netlink:\n%s\nthrough nft:\n%s", name, chain, got, want)
	}
	return stats, want
}

func (b *bucketPair) listChain(t *testing.T, ns, chain string, flags ...string) string {
	t.Helper()
	return nftIn(t, ns, append(flags, "list", "chain", string(familyName(b.fam)), b.cfg.TableName(), chain)...)
}

// sameTables checks that the two namespaces hold the same table.
func (b *bucketPair) sameTables(t *testing.T) {
	t.Helper()
	if diff := cmp.Diff(kernelContent(t, b.nsNft, b.fam, b.cfg.TableName()), kernelContent(t, b.nsNetlink, b.fam, b.cfg.TableName())); diff != "" {
		t.Errorf("tables differ (-nft +netlink):\n%s", diff)
	}
}

// TestNetlinkWritesRoundRobinBuckets: a roundRobin Service coming, going or changing
// its endpoint count changes its bucket chain over netlink (no nft), and the chain
// then lists exactly as nft writes it, rule for rule and in order, for each protocol
// and both families; the port's traffic is checked in the real-kernel layer
// (TestRoundRobinCountersThroughRealKernel).
func TestNetlinkWritesRoundRobinBuckets(t *testing.T) {
	requireRoot(t)
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			b := newBucketPair(t, fam)
			// Four ports in one bucket: one of each protocol, and one more to add later.
			ports := b.ports("rr", 4, func(_ int, p *ServicePort) { p.LoadBalancing = LBRoundRobin })
			b.full(t, services(ports[:3]...))
			fewer := *ports[1]
			fewer.ClusterEndpoints = b.eps[:2]
			// In every step the other ports' rules keep their handles: the bucket is not
			// rewritten, so their numgen counters go on (and adding rules would cost a
			// validation of the whole table).
			steps := []struct {
				name   string
				change map[ServiceName][]*ServicePort
				rules  int
			}{
				{"a Service comes", services(ports[3]), 4},
				{"an endpoint goes", services(&fewer), 4},
				{"a Service goes", map[ServiceName][]*ServicePort{{Namespace: "ns", Name: "rr0"}: nil}, 3},
			}
			chain := roundRobinBucketChain(b.bucket)
			handles := func() map[string]string {
				out := map[string]string{}
				for _, line := range strings.Split(b.listChain(t, b.nsNetlink, chain, "-a"), "\n") {
					if rule, handle, ok := strings.Cut(strings.TrimSpace(line), " # handle "); ok && strings.Contains(rule, "numgen") {
						out[rule] = handle
					}
				}
				return out
			}
			for _, st := range steps {
				before := handles()
				stats, want := b.step(t, st.name, st.change, chain)
				if !stats.Direct {
					t.Errorf("%s: went through nft; want the netlink writer", st.name)
				}
				if n := strings.Count(want, "numgen inc"); n != st.rules {
					t.Errorf("%s: %s holds %d rules; want %d:\n%s", st.name, chain, n, st.rules, want)
				}
				kept := 0
				for rule, h := range handles() {
					if was, ok := before[rule]; ok {
						kept++
						if was != h {
							t.Errorf("%s: rule %q has handle %s, had %s; want it left in place", st.name, rule, h, was)
						}
					}
				}
				if kept < 2 {
					t.Errorf("%s: only %d rules were there before and after", st.name, kept)
				}
			}
			b.sameTables(t)
		})
	}
}

// TestAffinityEndpointGoesOverNetlink: an affinity port losing an endpoint needs no new
// set, so its changed rules are written over netlink (BucketRule.exprs), in every mode
// but consistentHash (whose picks compare with an anonymous set of slots: through nft),
// IPv4 and IPv6; the bucket then holds, expression for expression (nft
// --debug=netlink), what nft wrote in the other namespace, and the tables are the same.
// The port has 21 endpoints, the most whose change fits MaxNetlinkMessages (42 rules
// deleted, 40 added at two messages each, a set deleted): the acknowledgements and
// echoes of the largest such transaction fit the socket's receive buffer.
func TestAffinityEndpointGoesOverNetlink(t *testing.T) {
	requireRoot(t)
	for _, fam := range []Family{IPv4, IPv6} {
		for _, mode := range []LBMode{LBRandom, LBRoundRobin, LBSourceHash, LBConsistentHash} {
			t.Run(fam.String()+"/"+string(mode), func(t *testing.T) {
				b := newBucketPair(t, fam)
				for len(b.eps) < 21 {
					b.eps = append(b.eps, Endpoint{IP: b.eps[len(b.eps)-1].IP.Next(), Port: 8080})
				}
				ports := b.ports("aff", 3, func(_ int, p *ServicePort) {
					p.AffinityTimeout = 300 * time.Second
					p.LoadBalancing = mode
				})
				b.full(t, services(ports...))
				fewer := *ports[1]
				fewer.ClusterEndpoints = b.eps[1:]
				chain := affinityBucketChain(b.bucket)
				stats, _ := b.step(t, "an endpoint goes", services(&fewer), chain)
				if want := mode != LBConsistentHash; stats.Direct != want {
					t.Errorf("over netlink: %v, want %v (%d operations)", stats.Direct, want, stats.Operations)
				}
				if got, want := ruleExprLines(b.listChain(t, b.nsNetlink, chain, "--debug=netlink")), ruleExprLines(b.listChain(t, b.nsNft, chain, "--debug=netlink")); got != want {
					t.Errorf("%s's expressions over netlink:\n%s\nthrough nft:\n%s", chain, got, want)
				}
				b.step(t, "the port goes", map[ServiceName][]*ServicePort{{Namespace: "ns", Name: "aff1"}: nil}, chain)
				b.sameTables(t)
			})
		}
	}
}

// ruleExprLines returns the expression lines of nft --debug=netlink's output, without
// the handles and set dumps around them, which differ between writers.
func ruleExprLines(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "[ ") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n")
}

// TestAffinityBucketThroughNetlink: ClientIP-affinity ports of both modes that place
// new clients without hashing (random, roundRobin), one of them with two ports, share
// an affinity bucket in a real kernel, IPv4 and IPv6, each protocol; Services come
// (through nft: their rules come with sets), go (over netlink: their rules deleted by
// position) and change, and after every step the bucket lists exactly, in order, as in
// a namespace written through nft alone.
func TestAffinityBucketThroughNetlink(t *testing.T) {
	requireRoot(t)
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			b := newBucketPair(t, fam)
			ports := b.ports("aff", 5, func(i int, p *ServicePort) {
				p.AffinityTimeout = 300 * time.Second
				p.LoadBalancing = []LBMode{LBRandom, LBRoundRobin}[i%2]
			})
			// A second port of aff0 in the same bucket.
			var two *ServicePort
			for port := uint16(81); two == nil; port++ {
				if bucketOf(entry{ports[0].ClusterIP, ports[0].Protocol, port}) == b.bucket {
					q := *ports[0]
					q.Port, q.NodePort = port, 31000
					q.Name.Port = "q"
					two = &q
				}
			}
			b.full(t, services(append(ports[:3:3], two)...))
			fewer := *ports[2]
			fewer.ClusterEndpoints = b.eps[:2]
			gone := func(n string) map[ServiceName][]*ServicePort {
				return map[ServiceName][]*ServicePort{{Namespace: "ns", Name: n}: nil}
			}
			back := services(ports[1])
			back[ServiceName{Namespace: "ns", Name: "aff4"}] = nil
			// direct: only rules go, so the netlink writer deletes them.
			steps := []struct {
				name   string
				change map[ServiceName][]*ServicePort
				direct bool
			}{
				{"middle Service goes", gone("aff1"), true},
				{"a Service comes", services(ports[3]), false},
				{"another comes", services(ports[4]), false},
				{"an endpoint goes", services(&fewer), false},
				{"two-port Service goes", gone("aff0"), true},
				{"aff3 goes", gone("aff3"), true},
				{"aff1 back, aff4 goes", back, false},
			}
			for _, st := range steps {
				if stats, _ := b.step(t, st.name, st.change, affinityBucketChain(b.bucket)); st.direct && !stats.Direct {
					t.Errorf("%s: went through nft; want the netlink writer", st.name)
				}
			}
			b.sameTables(t)
		})
	}
}
