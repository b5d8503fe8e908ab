// Package modelfuzz holds FuzzBuild, the fuzz target of instance.Build, in a package of
// its own: go test -fuzz instruments every package of the test binary for coverage, and
// instance's own test binary links client-go's fake clientset and its typed clients
// (through test/testutil) that Build never runs. Here the binary holds Build's packages
// only, so each execution scans a far smaller coverage map, and a change to the test
// helpers does not make the fuzz layer rebuild hundreds of instrumented packages.
package modelfuzz

import (
	"cmp"
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/tables"
)

// The node the fuzzed models are built for.
const (
	thisNodeName = "node-a"
	thisZone     = "zone-a"
)

func thisNode() instance.NodeInfo {
	return instance.NodeInfo{Name: thisNodeName, Labels: map[string]string{corev1.LabelTopologyZone: thisZone}}
}

// modelOptions compare models: addresses and prefixes by value, nil and empty alike.
func modelOptions() gocmp.Options {
	return gocmp.Options{
		gocmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		gocmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
		cmpopts.EquateEmpty(),
	}
}

// fuzzSeeds are compact Service and EndpointSlice JSON touching every feature, so the
// fuzzer starts deep; compact because every new interesting input gets minimized.
func fuzzSeeds() [][2]string {
	return [][2]string{
		{
			`{"metadata":{"name":"web","annotations":{"service.kubernetes.io/topology-mode":"Auto"}},"spec":{"type":"LoadBalancer",` +
				`"clusterIPs":["172.30.0.10","fd00:30::10"],"externalIPs":["192.0.2.1","2001:db8::1"],"loadBalancerSourceRanges":[" 10.0.0.0/8"],` +
				`"externalTrafficPolicy":"Local","internalTrafficPolicy":"Local","healthCheckNodePort":32000,"sessionAffinity":"ClientIP",` +
				`"ports":[{"name":"http","port":80,"nodePort":30080},{"name":"dns","port":53,"protocol":"UDP"}]},` +
				`"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.100"},{"ip":"2001:db8::100","ipMode":"Proxy"}]}}}`,
			`{"addressType":"IPv4","ports":[{"name":"http","port":8080},{"name":"dns","port":5353,"protocol":"UDP"}],"endpoints":[` +
				`{"addresses":["10.244.1.2"],"nodeName":"node-a","hints":{"forZones":[{"name":"zone-a"}],"forNodes":[{"name":"node-a"}]}},` +
				`{"addresses":["10.244.2.2"],"nodeName":"node-b","conditions":{"ready":false,"terminating":true},"hints":{"forZones":[{"name":"zone-a"}]}},` +
				`{"addresses":["10.244.3.2"],"conditions":{"ready":false,"serving":false}}]}`,
		},
		{
			`{"spec":{"type":"NodePort","clusterIP":"fd00:30::10","trafficDistribution":"PreferSameNode",` +
				`"sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":60}},"ports":[{"port":80,"nodePort":30080}]}}`,
			`{"addressType":"IPv6","ports":[{"port":8080}],"endpoints":[{"addresses":["fd00:10:244:1::2"],"nodeName":"node-a"},{"addresses":["bogus"]}]}`,
		},
		{
			`{"spec":{"clusterIPs":["None"]}}`,
			`{}`,
		},
		{
			`{"spec":{"clusterIP":"010.0.0.1","ports":[{"port":80,"nodePort":-1,"protocol":"SCTP"}]}}`,
			`{"addressType":"IPv4","ports":[{}],"endpoints":[{"addresses":[]}]}`,
		},
	}
}

// TestFuzzSeedsDecode keeps the seeds meaningful: a seed that stopped decoding would
// silently fuzz nothing.
func TestFuzzSeedsDecode(t *testing.T) {
	for i, seed := range fuzzSeeds() {
		var svc corev1.Service
		var slice discoveryv1.EndpointSlice
		if err := json.Unmarshal([]byte(seed[0]), &svc); err != nil {
			t.Errorf("seed %d: service: %v", i, err)
		}
		if err := json.Unmarshal([]byte(seed[1]), &slice); err != nil {
			t.Errorf("seed %d: slice: %v", i, err)
		}
		if i < 2 {
			m := instance.Build(&svc, []*discoveryv1.EndpointSlice{&slice}, thisNode())
			if m == nil || len(m.Ports) == 0 {
				t.Errorf("seed %d: Build = %+v, want ports", i, m)
				continue
			}
			checkModel(t, m)
		}
	}
}

// FuzzBuild feeds Build a Service and an EndpointSlice decoded from JSON (which is also
// YAML) and checks it neither panics nor produces a model the compiler could choke on.
func FuzzBuild(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add([]byte(seed[0]), []byte(seed[1]), thisNodeName, thisZone)
	}

	f.Fuzz(func(t *testing.T, svcJSON, sliceJSON []byte, nodeName, zone string) {
		var svc corev1.Service
		if err := json.Unmarshal(svcJSON, &svc); err != nil {
			return
		}
		var slice discoveryv1.EndpointSlice
		if err := json.Unmarshal(sliceJSON, &slice); err != nil {
			return
		}
		// A renamed copy exercises duplicates across slices.
		dup := slice.DeepCopy()
		dup.Name += "-dup"
		node := instance.NodeInfo{Name: nodeName, Labels: map[string]string{corev1.LabelTopologyZone: zone}}
		list := []*discoveryv1.EndpointSlice{&slice, dup}

		m := instance.Build(&svc, list, node)
		if again := instance.Build(&svc, []*discoveryv1.EndpointSlice{dup, &slice}, node); gocmp.Diff(m, again, modelOptions()) != "" {
			t.Fatalf("Build is not deterministic:\n%s", gocmp.Diff(m, again, modelOptions()))
		}
		if m == nil {
			return
		}
		checkModel(t, m)
	})
}

// checkModel fails on a model that breaks what the compiler relies on.
func checkModel(t *testing.T, m *instance.ServiceModel) {
	t.Helper()
	if m.HealthCheckNodePort < 0 || m.HealthCheckNodePort > 65535 || m.LocalEndpoints.IPv4 < 0 || m.LocalEndpoints.IPv6 < 0 {
		t.Fatalf("HealthCheckNodePort %d, LocalEndpoints %d", m.HealthCheckNodePort, m.LocalEndpoints)
	}
	for f, ports := range m.Ports {
		if f != tables.IPv4 && f != tables.IPv6 {
			t.Fatalf("unknown family %d", f)
		}
		for _, sp := range ports {
			if sp.Port == 0 || (sp.Protocol != tables.TCP && sp.Protocol != tables.UDP && sp.Protocol != tables.SCTP) {
				t.Fatalf("%s: bad port %d/%q", sp.Name, sp.Port, sp.Protocol)
			}
			if sp.Name.Protocol != sp.Protocol {
				t.Fatalf("%s: name protocol %q, port protocol %q", sp.Name, sp.Name.Protocol, sp.Protocol)
			}
			if !f.Contains(sp.ClusterIP) {
				t.Fatalf("%s: cluster IP %s not in %s", sp.Name, sp.ClusterIP, f)
			}
			for _, ip := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
				if !f.Contains(ip) {
					t.Fatalf("%s: %s not in %s", sp.Name, ip, f)
				}
			}
			for _, p := range sp.SourceRanges {
				if !f.Contains(p.Addr()) || p != p.Masked() {
					t.Fatalf("%s: source range %s not a masked %s prefix", sp.Name, p, f)
				}
			}
			for _, list := range [][]tables.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
				for i, e := range list {
					if !f.Contains(e.IP) || e.Port == 0 {
						t.Fatalf("%s: endpoint %s not usable in %s", sp.Name, e, f)
					}
					if i > 0 && cmp.Or(list[i-1].IP.Compare(e.IP), cmp.Compare(list[i-1].Port, e.Port)) >= 0 {
						t.Fatalf("%s: endpoints not sorted and unique: %v", sp.Name, list)
					}
				}
			}
			if !sp.HasEndpoints && (len(sp.ClusterEndpoints) > 0 || len(sp.LocalEndpoints) > 0) {
				t.Fatalf("%s: endpoints without HasEndpoints", sp.Name)
			}
			if sp.HasEndpoints && len(sp.ClusterEndpoints) == 0 {
				t.Fatalf("%s: HasEndpoints without cluster endpoints", sp.Name)
			}
		}
	}
}
