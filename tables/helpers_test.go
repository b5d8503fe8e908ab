package tables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables/tracer"
)

// Addresses used by the unit tests (the same plan as the real-kernel topology).
var (
	nodeIP4   = netip.MustParseAddr("192.168.100.1")
	nodeIP6   = netip.MustParseAddr("fd00:100::1")
	client4   = netip.MustParseAddr("192.168.100.2")
	client6   = netip.MustParseAddr("fd00:100::2")
	pod1IP4   = netip.MustParseAddr("10.244.1.2")
	pod2IP4   = netip.MustParseAddr("10.244.1.3")
	remote4   = netip.MustParseAddr("10.244.2.2")
	pod1IP6   = netip.MustParseAddr("fd00:10:244:1::2")
	remote6   = netip.MustParseAddr("fd00:10:244:2::2")
	podCIDR4  = netip.MustParsePrefix("10.244.0.0/16")
	podCIDR6  = netip.MustParsePrefix("fd00:10:244::/48")
	clusterIP = netip.MustParseAddr("172.30.0.10")
	// node2IP4 and node2IP6 are further addresses of the test node, outside every source
	// range the tests use and not in Config.NodeIPs (the tracer knows them as local).
	node2IP4 = netip.MustParseAddr("192.168.99.1")
	node2IP6 = netip.MustParseAddr("fd00:99::1")
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func ep(ip string, port uint16) Endpoint { return Endpoint{IP: addr(ip), Port: port} }

// testConfig is an instance on the test node with ClusterCIDR local detection.
func testConfig(fam Family) Config {
	cfg := Config{
		Family:        fam,
		TablePrefix:   "shardproxy",
		Instance:      "test",
		MasqueradeBit: 14,
		Local:         LocalTraffic{Mode: LocalClusterCIDR, CIDRs: []netip.Prefix{podCIDR4, podCIDR6}},
		NodePortIPs:   []netip.Addr{nodeIP4, nodeIP6, addr("127.0.0.1"), addr("::1")},
		NodeIPs:       []netip.Addr{nodeIP4, nodeIP6},
		// Every mode's tests share it; TestGoldenSkeleton pins the table without.
		ConsistentHash: true,
	}
	return cfg
}

func newFake(t *testing.T, cfg Config) (*Syncer, *knftables.Fake) {
	t.Helper()
	fam := knftables.IPv4Family
	if cfg.Family == IPv6 {
		fam = knftables.IPv6Family
	}
	fake := knftables.NewFake(fam, cfg.TableName())
	s, err := NewSyncer(cfg, fake)
	if err != nil {
		t.Fatalf("NewSyncer: %v", err)
	}
	return s, fake
}

func fullSync(t *testing.T, s *Syncer, services map[ServiceName][]*ServicePort) Stats {
	t.Helper()
	stats, err := s.Full(context.Background(), services)
	if err != nil {
		t.Fatalf("full sync: %v", err)
	}
	return stats
}

func newTracer(t *testing.T, fakes ...*knftables.Fake) *tracer.Tracer {
	t.Helper()
	return newTracerEnv(t, tracer.Env{LocalIPs: []netip.Addr{nodeIP4, nodeIP6, node2IP4, node2IP6}}, fakes...)
}

func newTracerEnv(t *testing.T, env tracer.Env, fakes ...*knftables.Fake) *tracer.Tracer {
	t.Helper()
	tr, err := tracer.New(env, fakes...)
	if err != nil {
		t.Fatalf("tracer: %v", err)
	}
	return tr
}

// outcomes traces a packet and renders every outcome as "verdict [dnat X] [masq]".
func outcomes(t *testing.T, tr *tracer.Tracer, p tracer.Packet) []string {
	t.Helper()
	res, err := tr.Trace(p)
	if err != nil {
		t.Fatalf("trace %+v: %v", p, err)
	}
	var out []string
	for _, o := range res {
		out = append(out, o.String())
	}
	slices.Sort(out)
	return out
}

// sp builds a TCP ServicePort on the test cluster IP.
func sp(name string, port uint16, mods ...func(*ServicePort)) *ServicePort {
	p := &ServicePort{
		Name:            ServicePortName{Namespace: "ns", Name: name, Port: "p"},
		Protocol:        TCP,
		Port:            port,
		ClusterIP:       clusterIP,
		HasEndpoints:    false,
		AffinityTimeout: 0,
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func withEndpoints(cluster []Endpoint, local []Endpoint) func(*ServicePort) {
	return func(p *ServicePort) {
		p.ClusterEndpoints, p.LocalEndpoints = cluster, local
		p.HasEndpoints = len(cluster) > 0 || len(local) > 0
	}
}

func services(ports ...*ServicePort) map[ServiceName][]*ServicePort {
	out := map[ServiceName][]*ServicePort{}
	for _, p := range ports {
		n := ServiceName{Namespace: p.Name.Namespace, Name: p.Name.Name}
		out[n] = append(out[n], p)
	}
	return out
}

// dumpSet renders the elements of a set or map, sorted, one per line.
func dumpElements(fake *knftables.Fake, name string) string {
	var lines []string
	if st, ok := fake.Table.Sets[name]; ok {
		for _, e := range st.Elements {
			lines = append(lines, strings.Join(e.Key, " . "))
		}
	}
	if m, ok := fake.Table.Maps[name]; ok {
		for _, e := range m.Elements {
			lines = append(lines, strings.Join(e.Key, " . ")+" : "+strings.Join(e.Value, " . "))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

type knftElement = knftables.Element

// parseUpdate splits a tracer update "@m { k . k : v . v } timeout Ns" into key and value.
func parseUpdate(t *testing.T, u string) ([]string, []string) {
	t.Helper()
	i, j := strings.Index(u, "{"), strings.Index(u, "}")
	if i < 0 || j < i {
		t.Fatalf("bad update %q", u)
	}
	k, v, ok := strings.Cut(u[i+1:j], " : ")
	if !ok {
		t.Fatalf("bad update %q", u)
	}
	split := func(s string) []string {
		var out []string
		for _, p := range strings.Split(s, " . ") {
			out = append(out, strings.TrimSpace(p))
		}
		return out
	}
	return split(k), split(v)
}

// allIDs returns the ids of every element of the entry, its table's included (prefix:
// the compiler's slotPrefix). Only tests need them one by one; the ledger reads the
// table's slots.
func (e entryElements) allIDs(prefix []string) []string {
	if e.slots == nil {
		return e.ids
	}
	return e.slots.appendIDs(e.ids[:len(e.ids):len(e.ids)], prefix)
}

// elementsOf returns the ids of entry en's elements in entries (nil: none).
func elementsOf(entries []entryElements, en string) []string {
	for _, e := range entries {
		if e.entry == en {
			return e.ids
		}
	}
	return nil
}
