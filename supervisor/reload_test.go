package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// liveConfigYAML is a test configuration with the servers on the given loopback ports
// (the file the supervisor watches says what it runs, ports included).
func liveConfigYAML(yaml string, healthz, metrics int) string {
	return strings.Replace(yaml, "nodeName: node-1\n",
		fmt.Sprintf("nodeName: node-1\nhealthzBindAddress: 127.0.0.1:%d\nmetricsBindAddress: 127.0.0.1:%d\n", healthz, metrics), 1)
}

// freePort is a loopback TCP port nothing listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// teamC is an instance the live changes add.
const teamC = `- name: team-c
  proxyNames: [team-c]
  slot: 3
  minSyncPeriod: 0s
  syncPeriod: 30s
  tenant:
    namespaces: [c]
`

// writeConfig replaces the watched file's content, as a ConfigMap volume's update does.
func (f *fixture) writeConfig(yaml string) {
	f.t.Helper()
	tmp := f.configPath + ".new"
	if err := os.WriteFile(tmp, []byte(liveConfigYAML(yaml, f.ports[0], f.ports[1])), 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, f.configPath); err != nil {
		f.t.Fatal(err)
	}
}

// configStatus is /status's configuration.
func (f *fixture) configStatus() healthcheck.ConfigStatus {
	f.t.Helper()
	var st healthcheck.StatusResponse
	if err := json.Unmarshal([]byte(get(f.t, f.sup, "/status")), &st); err != nil {
		f.t.Fatal(err)
	}
	if st.Config == nil {
		f.t.Fatal("/status shows no configuration")
	}
	return *st.Config
}

// syncs counts an instance's IPv4 syncs so far.
func (f *fixture) syncs(inst string) string {
	return metricValue(f.t, f.sup, `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4",proxy_instance="`+inst+`"}`)
}

// TestLiveConfigChanges: a changed configuration file is applied to the running
// instances: an added instance takes its Services, a removed one hands them back and its
// tables go, a changed one is restarted alone; the instances it does not change do not
// sync; /status and the metrics show the file in force.
func TestLiveConfigChanges(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{liveConfig: true})
	f.createService("x", "plain", "", "10.96.0.10")
	f.createService("a", "web", "team-a", "10.96.0.11")
	f.createService("b", "db", "team-b", "10.96.0.12")
	f.createService("c", "cache", "team-c", "10.96.0.13")
	for inst, ip := range map[string]string{"default": "10.96.0.10", "team-a": "10.96.0.11", "team-b": "10.96.0.12"} {
		testutil.Eventually(t, waitTimeout, inst+" programs its Service", func() bool { return has(f.tables.dump("ip shardproxy-"+inst), ip) })
	}
	start := f.configStatus()
	if start.Hash != configHash([]byte(liveConfigYAML(testConfigYAML, f.ports[0], f.ports[1]))) || start.Applied.IsZero() {
		t.Fatalf("the configuration at start: %+v", start)
	}
	defaultSyncs := f.syncs("default")

	// Add team-c: it takes cache (labelled for it, served by nobody until now).
	f.writeConfig(testConfigYAML + teamC)
	testutil.Eventually(t, waitTimeout, "team-c programs cache", func() bool { return has(f.tables.dump("ip shardproxy-team-c"), "10.96.0.13") })
	// The new instance can program its Service before the change's bookkeeping ends.
	testutil.Eventually(t, waitTimeout, "/status shows the new configuration", func() bool { return f.configStatus().Hash != start.Hash })
	added := f.configStatus()
	if added.Hash == start.Hash || !added.Applied.After(start.Applied) || added.Refused != "" {
		t.Errorf("after adding team-c, /status shows %+v (was %+v)", added, start)
	}
	if got := metricValue(t, f.sup, `shardproxy_config_info{hash="`+added.Hash+`"}`); got != "1" {
		t.Errorf("shardproxy_config_info for the new hash: %q", got)
	}
	if got := metricValue(t, f.sup, `shardproxy_config_reloads_total{result="applied"}`); got != "1" {
		t.Errorf("applied reloads: %q", got)
	}

	// Restart team-a alone (another sync period); remove team-b.
	changedA := strings.Replace(testConfigYAML, "  proxyNames: [team-a]\n  slot: 1\n  minSyncPeriod: 0s\n  syncPeriod: 30s\n",
		"  proxyNames: [team-a]\n  slot: 1\n  minSyncPeriod: 0s\n  syncPeriod: 40s\n", 1)
	withoutB, _, _ := strings.Cut(changedA, "- name: team-b\n")
	if withoutB == changedA || changedA == testConfigYAML {
		t.Fatal("the test's configuration edits did not apply")
	}
	teamA := f.sup.Instance("team-a")
	f.writeConfig(withoutB + teamC)
	testutil.Eventually(t, waitTimeout, "team-b's tables deleted", func() bool {
		return !f.tables.exists("ip shardproxy-team-b") && !f.tables.exists("ip6 shardproxy-team-b")
	})
	if p := f.sup.Instance("team-a"); p == nil || p == teamA {
		t.Errorf("team-a was not restarted: %p, was %p", p, teamA)
	}
	testutil.Eventually(t, waitTimeout, "the restarted team-a programs web", func() bool {
		return f.sup.Instance("team-a").AppliedModel(types.NamespacedName{Namespace: "a", Name: "web"}) != nil
	})
	if !has(f.tables.dump("ip shardproxy-team-a"), "10.96.0.11") || !has(f.tables.dump("ip shardproxy-team-c"), "10.96.0.13") {
		t.Errorf("team-a or team-c lost its Service")
	}
	testutil.Eventually(t, waitTimeout, "team-b gone from /status and the metrics", func() bool {
		return !strings.Contains(get(t, f.sup, "/status"), `"team-b"`) &&
			metricValue(t, f.sup, `shardproxy_instance_up{proxy_instance="team-b"}`) == ""
	})
	if got := f.syncs("default"); got != defaultSyncs {
		t.Errorf("the default instance synced %s times, was %s: a change to other instances touched it", got, defaultSyncs)
	}
	if f.sup.Instance("team-b") != nil {
		t.Error("team-b still runs")
	}
}

// TestLiveConfigRefused: a changed file that is invalid, or changes a node-wide field,
// is refused with a log line, an Event on this Node and /status; the running
// configuration stays in force, and a later valid file applies.
func TestLiveConfigRefused(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{liveConfig: true})
	start := f.configStatus()
	for _, tc := range []struct {
		name, yaml, event, result string
	}{
		{"invalid", testConfigYAML + "- name: team-c\n  slot: 1\n", "ConfigInvalid: The changed configuration is invalid", "invalid"},
		{"node-wide", strings.Replace(testConfigYAML, "nodeName: node-1\n", "nodeName: node-1\ntablePrefix: shardproxy2\nmasqueradeBit: 12\n", 1),
			"ConfigRefused: The changed configuration changes masqueradeBit, tablePrefix, which cannot change while shardproxy runs", "refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.writeConfig(tc.yaml)
			testutil.Eventually(t, waitTimeout, "the event "+tc.event, func() bool { return strings.Contains(f.rec.all(), "node Warning "+tc.event) })
			st := f.configStatus()
			if st.Hash != start.Hash || st.Applied != start.Applied || st.Refused == "" {
				t.Errorf("/status after a refused file: %+v, want the start's %+v and a reason", st, start)
			}
			if got := metricValue(t, f.sup, `shardproxy_config_reloads_total{result="`+tc.result+`"}`); got != "1" {
				t.Errorf("%s reloads: %q", tc.result, got)
			}
			if f.sup.Instance("team-c") != nil || f.sup.Instance("team-a") == nil {
				t.Error("the refused file changed the instances")
			}
		})
	}
	f.writeConfig(testConfigYAML + teamC)
	testutil.Eventually(t, waitTimeout, "/status shows the next valid file applied", func() bool {
		st := f.configStatus()
		return st.Refused == "" && st.Hash != start.Hash
	})
	if f.sup.Instance("team-c") == nil {
		t.Error("the valid file applied without adding team-c")
	}
}

// TestPlanReload: which instances a change adds, removes, restarts or only reroutes.
func TestPlanReload(t *testing.T) {
	base := func() []config.Instance {
		cfg, err := config.Parse([]byte(testConfigYAML), "test.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Instances
	}
	for _, tc := range []struct {
		name   string
		change func([]config.Instance) []config.Instance
		want   reloadPlan
	}{
		{"nothing", func(in []config.Instance) []config.Instance { return in },
			reloadPlan{unchanged: []string{"default", "team-a", "team-b"}}},
		{"reordered", func(in []config.Instance) []config.Instance { slices.Reverse(in); return in },
			reloadPlan{unchanged: []string{"team-b", "team-a", "default"}}},
		{"tenant and proxy names reroute", func(in []config.Instance) []config.Instance {
			in[1].ProxyNames = append(in[1].ProxyNames, "team-a2")
			in[2].Tenant.Namespaces = []string{"b", "b2"}
			return in
		}, reloadPlan{unchanged: []string{"default"}, rerouted: []string{"team-a", "team-b"}}},
		{"table settings restart", func(in []config.Instance) []config.Instance {
			in[1].MasqueradeAll = true
			in[2].Slot = new(int)
			*in[2].Slot = 7
			return in
		}, reloadPlan{unchanged: []string{"default"}, replaced: []string{"team-a", "team-b"}}},
		{"add and remove", func(in []config.Instance) []config.Instance {
			c := in[2]
			c.Name = "team-c"
			return []config.Instance{in[0], c}
		}, reloadPlan{unchanged: []string{"default"}, added: []string{"team-c"}, removed: []string{"team-a", "team-b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planReload(base(), tc.change(base()))
			if !slices.Equal(got.added, tc.want.added) || !slices.Equal(got.removed, tc.want.removed) ||
				!slices.Equal(got.replaced, tc.want.replaced) || !slices.Equal(got.rerouted, tc.want.rerouted) ||
				!slices.Equal(got.unchanged, tc.want.unchanged) {
				t.Errorf("plan %+v, want %+v", got, tc.want)
			}
		})
	}
}

// alongsideYAML is a node beside kube-proxy: no default instance, so the watches select
// the instances' proxy names (with the ServiceCIDR API served).
const alongsideYAML = `
apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
nodeName: node-1
instances:
- name: team-a
  proxyNames: [team-a]
  slot: 1
  minSyncPeriod: 0s
  syncPeriod: 30s
  tenant:
    namespaces: [a]
`

// TestLiveConfigRescopes: beside kube-proxy (no default instance) adding a tenant's
// instance widens the watches to its proxy name, and removing it narrows them again.
func TestLiveConfigRescopes(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{liveConfig: true, configYAML: alongsideYAML, serviceCIDRs: []string{"10.96.0.0/16"}})
	f.createService("a", "web", "team-a", "10.96.0.11")
	f.createService("c", "cache", "team-c", "10.96.0.13")
	testutil.Eventually(t, waitTimeout, "team-a programs web", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "10.96.0.11") })
	if scope := f.sup.watches.Scope(); strings.Contains(strings.Join(scope, " "), "team-c") {
		t.Fatalf("team-c watched before it is configured: %q", scope)
	}
	f.writeConfig(alongsideYAML + teamC)
	testutil.Eventually(t, waitTimeout, "team-c programs cache", func() bool { return has(f.tables.dump("ip shardproxy-team-c"), "10.96.0.13") })
	if scope := f.sup.watches.Scope(); !strings.Contains(strings.Join(scope, " "), "team-c") {
		t.Errorf("team-c's proxy name is not watched: %q", scope)
	}
	f.writeConfig(alongsideYAML)
	testutil.Eventually(t, waitTimeout, "team-c's tables deleted", func() bool { return !f.tables.exists("ip shardproxy-team-c") })
	testutil.Eventually(t, waitTimeout, "the watches narrowed again", func() bool {
		return !strings.Contains(strings.Join(f.sup.watches.Scope(), " "), "team-c")
	})
	if !has(f.tables.dump("ip shardproxy-team-a"), "10.96.0.11") {
		t.Error("team-a lost web")
	}
	// No instance serves user addresses: no watch of every Node; a change that makes one
	// serve them needs it, and is refused.
	if f.sup.watches.WatchesOtherNodes() {
		t.Error("the other Nodes are watched though no instance serves external or load-balancer IPs")
	}
	f.writeConfig(alongsideYAML + strings.Replace(teamC, "namespaces: [c]", "namespaces: [c]\n    loadBalancerCIDRs: [192.0.2.0/24]", 1))
	testutil.Eventually(t, waitTimeout, "serving load-balancer IPs refused", func() bool {
		return strings.Contains(f.rec.all(), "ConfigRefused: The changed configuration makes an instance serve externalIPs or load-balancer IPs")
	})
	// The default instance's coming or going changes whether every Service is watched.
	f.writeConfig(alongsideYAML + "- name: default\n  default: true\n  slot: 0\n")
	testutil.Eventually(t, waitTimeout, "the default instance refused", func() bool {
		return strings.Contains(f.rec.all(), "ConfigRefused: The changed configuration")
	})
}

// TestLiveConfigRemovedInstanceFlushesFlows: an instance removed by a live change lets
// go of its Services as if they were deleted before it stops, so the UDP flows to a
// Service nobody on the node serves any more go, as after the Service's deletion; a
// Service another instance takes over keeps its flows.
func TestLiveConfigRemovedInstanceFlushesFlows(t *testing.T) {
	// team-b waits 2 s between syncs: its last one, of the removals, comes well after
	// the change, and the tables must wait for it.
	slowB := strings.Replace(testConfigYAML, "  proxyNames: [team-b]\n  slot: 2\n  minSyncPeriod: 0s\n",
		"  proxyNames: [team-b]\n  slot: 2\n  minSyncPeriod: 2s\n", 1)
	if slowB == testConfigYAML {
		t.Fatal("the test's configuration edit did not apply")
	}
	f := startSupervisorWith(t, fixtureOptions{liveConfig: true, configYAML: slowB})
	const orphanVIP, sharedVIP = "172.30.0.53", "172.30.0.63"
	teamB := map[string]string{"service.kubernetes.io/service-proxy-name": "team-b"}
	f.createDNS("b", "dns", orphanVIP, teamB, nil, dnsEndpoint(podA, false))
	testutil.Eventually(t, waitTimeout, "team-b programs dns", func() bool { return f.programsEndpoint("team-b", podA) })
	orphan := dnsFlow(orphanVIP, podA)
	f.ct.Add(orphan)

	// team-b removed: nothing else serves label team-b, so dns is served by nobody.
	withoutB, _, _ := strings.Cut(slowB, "- name: team-b\n")
	f.writeConfig(withoutB)
	testutil.Eventually(t, waitTimeout, "team-b's tables deleted", func() bool {
		return !f.tables.exists("ip shardproxy-team-b") && !f.tables.exists("ip6 shardproxy-team-b")
	})
	testutil.Eventually(t, waitTimeout, "the flows of the Service nobody serves go", func() bool { return !f.hasFlow(orphan) })

	// team-c added on label team-c, then removed while team-a takes its label over:
	// the Service stays served, its flows stay.
	f.writeConfig(withoutB + teamC)
	f.createDNS("c", "dns", sharedVIP, map[string]string{"service.kubernetes.io/service-proxy-name": "team-c"}, nil, dnsEndpoint(podB, false))
	testutil.Eventually(t, waitTimeout, "team-c programs dns", func() bool { return f.programsEndpoint("team-c", podB) })
	kept := dnsFlow(sharedVIP, podB)
	f.ct.Add(kept)
	takeover := strings.Replace(withoutB, "  proxyNames: [team-a]\n", "  proxyNames: [team-a, team-c]\n", 1)
	takeover = strings.Replace(takeover, "    namespaces: [a, shop]\n", "    namespaces: [a, shop, c]\n", 1)
	if takeover == withoutB {
		t.Fatal("the test's take-over edit did not apply")
	}
	f.writeConfig(takeover)
	testutil.Eventually(t, waitTimeout, "team-a serves team-c's dns", func() bool { return f.programsEndpoint("team-a", podB) })
	testutil.Eventually(t, waitTimeout, "team-c's tables deleted", func() bool { return !f.tables.exists("ip shardproxy-team-c") })
	f.settle("team-a", "a", "team-a", "172.30.0.54")
	if !f.hasFlow(kept) {
		t.Errorf("the flows of a Service team-a took over from the removed team-c were deleted; left: %v", f.ct.FlowStrings())
	}
}

// TestLiveConfigFailedRescopeChangesNothing: a live change whose new watches cannot list
// (here the API server refuses team-c's selector) is refused once RescopeTimeout passes,
// and nothing of it stays: no team-c, team-a not restarted, the watches as they were,
// the Services where they were; the same change applies once the lists work.
func TestLiveConfigFailedRescopeChangesNothing(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	f := startSupervisorWith(t, fixtureOptions{liveConfig: true, configYAML: alongsideYAML, serviceCIDRs: []string{"10.96.0.0/16"},
		reactors: []k8stesting.Reactor{refuseListing("team-c", &refuse)}})
	f.createService("a", "web", "team-a", "10.96.0.11")
	f.createService("c", "cache", "team-c", "10.96.0.13")
	testutil.Eventually(t, waitTimeout, "team-a programs web", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "10.96.0.11") })
	scope, teamA := f.sup.watches.Scope(), f.sup.Instance("team-a")

	// team-c added and team-a restarted (another sync period) in one change.
	changedA := f.writeRefusedConfig("  syncPeriod: 30s\n", "  syncPeriod: 40s\n")
	if f.sup.Instance("team-c") != nil || f.tables.exists("ip shardproxy-team-c") {
		t.Error("team-c runs after its change was refused")
	}
	if f.sup.Instance("team-a") != teamA {
		t.Error("team-a was restarted by a refused change")
	}
	if got := f.sup.watches.Scope(); !slices.Equal(got, scope) {
		t.Errorf("the watches are %q after a refused change, were %q", got, scope)
	}
	if st := f.configStatus(); st.Refused == "" {
		t.Errorf("/status shows no refusal: %+v", st)
	}
	f.createService("a", "late", "team-a", "10.96.0.12")
	testutil.Eventually(t, waitTimeout, "team-a still programs new Services", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "10.96.0.12") })

	// The same content again is not a change; a new one applies once the lists work.
	refuse.Store(false)
	f.writeConfig(changedA + teamC + "  fullSyncPeriod: 1h\n")
	testutil.Eventually(t, waitTimeout, "team-c programs cache", func() bool { return has(f.tables.dump("ip shardproxy-team-c"), "10.96.0.13") })
	if f.sup.Instance("team-a") == teamA {
		t.Error("team-a was not restarted by the applied change")
	}
}

// refuseListing fails every list whose label selector names proxyName while refuse is
// set: the rescope to a new proxy name cannot complete, so the change is refused.
func refuseListing(proxyName string, refuse *atomic.Bool) k8stesting.Reactor {
	return &k8stesting.SimpleReactor{Verb: "list", Resource: "*", Reaction: func(action k8stesting.Action) (bool, runtime.Object, error) {
		if la, ok := action.(k8stesting.ListActionImpl); ok && refuse.Load() && strings.Contains(la.ListRestrictions.Labels.String(), proxyName) {
			return true, nil, fmt.Errorf("the test refuses to list %s", la.ListRestrictions.Labels)
		}
		return false, nil, nil
	}}
}

// TestLiveConfigRefusedChangeMovesNoHealthCheck: a change that restarts team-a on other
// node port addresses and adds team-c is refused (team-c's lists fail): team-a's
// health-check node port stays open on the addresses it had (neither closed nor
// reopened) and moves to the new ones only once a change applies. Building the restarted instance must not move its listeners.
func TestLiveConfigRefusedChangeMovesNoHealthCheck(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	rec := &addrRecorder{}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.168.100.1"}, {Type: corev1.NodeExternalIP, Address: "192.168.200.1"}}}}
	f := startSupervisorWith(t, fixtureOptions{liveConfig: true, configYAML: alongsideYAML, serviceCIDRs: []string{"10.96.0.0/16"},
		node: node, hcListener: rec, interfaceAddrs: []netip.Addr{netip.MustParseAddr("192.168.100.1"), netip.MustParseAddr("192.168.200.1")}, reactors: []k8stesting.Reactor{refuseListing("team-c", &refuse)}})
	if _, err := f.client.CoreV1().Services("a").Create(context.Background(), localLoadBalancer(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const before, after = "192.168.100.1:30777", "192.168.200.1:30777"
	testutil.Eventually(t, waitTimeout, "the health check opens on the InternalIP", func() bool { return slices.Contains(rec.get(), before) })

	moved := f.writeRefusedConfig("  syncPeriod: 30s\n", "  syncPeriod: 30s\n  nodePortAddresses: [192.168.200.0/24]\n")
	if got := rec.get(); slices.Contains(got, after) {
		t.Errorf("a refused change opened team-a's health check on %s (opened %v)", after, got)
	}
	if got := rec.getClosed(); len(got) != 0 {
		t.Errorf("a refused change closed team-a's health check on %v", got)
	}
	if got := rec.get(); len(got) != len(slices.DeleteFunc(slices.Clone(got), func(a string) bool { return a == before }))+1 {
		t.Errorf("a refused change reopened team-a's health check on %s (opened %v)", before, got)
	}

	refuse.Store(false)
	f.writeConfig(moved + teamC + "  fullSyncPeriod: 1h\n")
	testutil.Eventually(t, waitTimeout, "the applied change opens the health check on the new address", func() bool { return slices.Contains(rec.get(), after) })
	testutil.Eventually(t, waitTimeout, "the applied change closes the health check on the old address", func() bool { return slices.Contains(rec.getClosed(), before) })
}

// writeRefusedConfig writes alongsideYAML with old replaced by new in team-a's part and
// team-c added, waits until the supervisor refuses it (team-c's lists fail: see
// refuseListing), and returns the edited team-a configuration.
func (f *fixture) writeRefusedConfig(old, new string) string {
	f.t.Helper()
	edited := strings.Replace(alongsideYAML, old, new, 1)
	if edited == alongsideYAML {
		f.t.Fatal("the test's configuration edit did not apply")
	}
	f.writeConfig(edited + teamC)
	testutil.Eventually(f.t, 2*waitTimeout, "the change refused", func() bool {
		return strings.Contains(f.rec.all(), "ConfigRefused: Applying the changed configuration failed")
	})
	return edited
}
