package soak

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// tableListing is `nft -j list table ip shardproxy-team-a` of a team instance with one
// Service (nft 1.0.6), cut to three chains: nat-prerouting and a Service's chain with
// rules, firewall-check emptied (flushed by an earlier fault, say).
const tableListing = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "shardproxy-team-a", "handle": 7, "comment": "shardproxy instance team-a supervisor node-1:10256"}},
{"chain": {"family": "ip", "table": "shardproxy-team-a", "name": "firewall-check", "handle": 5}},
{"chain": {"family": "ip", "table": "shardproxy-team-a", "name": "nat-prerouting", "handle": 9, "type": "nat", "hook": "prerouting", "prio": -66, "policy": "accept"}},
{"chain": {"family": "ip", "table": "shardproxy-team-a", "name": "svc-soak-a-web-http", "handle": 31}},
{"rule": {"family": "ip", "table": "shardproxy-team-a", "chain": "nat-prerouting", "handle": 40, "expr": [{"jump": {"target": "services"}}]}},
{"rule": {"family": "ip", "table": "shardproxy-team-a", "chain": "svc-soak-a-web-http", "handle": 41, "expr": [{"jump": {"target": "mark-for-masquerade"}}]}},
{"rule": {"family": "ip", "table": "shardproxy-team-a", "chain": "svc-soak-a-web-http", "handle": 42, "expr": [{"goto": {"target": "pick-svc-soak-a-web-http"}}]}}]}`

// TestFlushChainPicksAChainWithRules: the chain fault flushes a chain that has rules;
// when every chain is already empty it changed nothing, and says so.
func TestFlushChainPicksAChainWithRules(t *testing.T) {
	chains, err := chainRules([]byte(tableListing))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"firewall-check": 0, "nat-prerouting": 1, "svc-soak-a-web-http": 2}
	if diff := cmp.Diff(want, chains); diff != "" {
		t.Fatalf("rules per chain (-want +got):\n%s", diff)
	}
	for seed := range uint64(50) {
		c, err := pickChain(chains, rand.New(rand.NewPCG(seed, 1)))
		if err != nil || chains[c] == 0 {
			t.Fatalf("seed %d: picked %q (%d rules), %v; want a chain with rules", seed, c, chains[c], err)
		}
	}
	_, err = pickChain(map[string]int{"firewall-check": 0, "reject-chain": 0}, rand.New(rand.NewPCG(1, 1)))
	if !errors.Is(err, errNoEffect) {
		t.Errorf("a table of empty chains: %v, want errNoEffect", err)
	}
}

// TestServiceIPKeys reads the keys of a service-ips map, and none of an empty one (the
// element fault then tries the next table, and changed nothing if none has one).
func TestServiceIPKeys(t *testing.T) {
	listing := func(elems string) []byte {
		return []byte(`{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
{"map": {"family": "ip", "name": "service-ips", "table": "shardproxy-default", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 20, "map": "verdict"` + elems + `}}]}`)
	}
	got, err := serviceIPKeys(listing(`, "elem": [[{"concat": ["10.96.3.7", "udp", 53]}, {"goto": {"target": "pick-x"}}], [{"concat": ["10.96.0.10", "tcp", 80]}, {"goto": {"target": "pick-y"}}]]`))
	if err != nil {
		t.Fatal(err)
	}
	want := [][3]string{{"10.96.0.10", "tcp", "80"}, {"10.96.3.7", "udp", "53"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	if got, err := serviceIPKeys(listing("")); err != nil || len(got) != 0 {
		t.Errorf("an empty map: %v, %v; want no keys", got, err)
	}
}

// TestFaultsThatChangedNothing: a fault that changed nothing is not counted as injected;
// the summary says how many there were, and a kind left short of its count fails.
func TestFaultsThatChangedNothing(t *testing.T) {
	s := &soak{opts: Options{Logf: t.Logf}, faults: map[string]int{}, noEffect: map[string]int{}}
	s.recordFault(faultElement, 1, time.Second, "", fmt.Errorf("%w: no element of a churned Service in the service-ips map of any table", errNoEffect))
	s.recordFault(faultChain, 1, time.Second, "flushed chain services of table ip shardproxy-team-a (3 rules)", nil)
	s.recordFault(faultNFT, 1, time.Second, "", errors.New("writing the control file: no space left"))
	if diff := cmp.Diff(map[string]int{faultChain: 1}, s.faults); diff != "" {
		t.Errorf("injected (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{faultElement: 1}, s.noEffect); diff != "" {
		t.Errorf("changed nothing (-want +got):\n%s", diff)
	}
	sum := &Summary{Faults: s.faults, NoEffect: s.noEffect, FaultErrors: s.faultErrors, FaultsPerKind: 1,
		Kinds: []string{faultChain, faultElement, faultNFT}}
	out := sum.String()
	for _, want := range []string{
		"SOAK faults injected: nft-chain-flush 1, nft-element-remove 0, nft-fail 0 (want ≥ 1 each; 1 failed to inject; 1 changed nothing, not counted: nft-element-remove 1)\n",
		"fault nft-element-remove injected 0 times, want 1 (1 more changed nothing)",
		"fault nft-fail injected 0 times, want 1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "SOAK PASS") {
		t.Errorf("passed:\n%s", out)
	}
}

// TestKillFallbackWaitsPastTheLimit: the kill fault falls back to a restart only when
// every instance is over the full-sync watch's limit, so the fallback cannot cut a stall
// short before it fails the soak.
func TestKillFallbackWaitsPastTheLimit(t *testing.T) {
	if limit := 2 * fullSyncPeriod; periodicWait <= limit {
		t.Errorf("the kill fault falls back after %v, within the full-sync limit %v", periodicWait, limit)
	}
}
