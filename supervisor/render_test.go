package supervisor

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/tablestest"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// renderConfigYAML opens team-a's external-IP ranges over every address the cases
// use, so that what refuses them is the node-wide rules, not the tenant guard.
const renderConfigYAML = `apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
nodeName: node-1
reservedCIDRs: [198.51.100.128/25]
sharedTenants: true
instances:
- name: team-a
  proxyNames: [team-a]
  slot: 1
  maxServiceElements: 100
  tenant:
    namespaces: [a]
    externalIPCIDRs: [192.168.0.0/16, 198.51.100.0/24, 172.30.0.0/16, 10.96.0.0/16, 100.64.0.0/10]
- name: team-b
  proxyNames: [team-b]
  slot: 2
  tenant:
    namespaces: [b]
    externalIPCIDRs: [198.51.100.0/24]
`

// renderService is a Service of proxy name (its namespace's instance) with one TCP port
// 80, created at created (also when its external IPs were written).
func renderService(ns, name, clusterIP string, created time.Time, externalIPs ...string) *corev1.Service {
	at := metav1.NewTime(created)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), CreationTimestamp: at,
			Labels: map[string]string{"service.kubernetes.io/service-proxy-name": "team-" + ns},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, Time: &at,
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:externalIPs":{}}}`)}}}},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, ClusterIPs: []string{clusterIP}, ExternalIPs: externalIPs,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
}

// renderSlice is an EndpointSlice of Service ns/name with endpoints endpoints on port 8080.
func renderSlice(ns, name string, endpoints int) *discoveryv1.EndpointSlice {
	port, pname := int32(8080), "http"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port}},
	}
	for i := range endpoints {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", i/250, 2+i%250)}})
	}
	return sl
}

// apiServerSlice is the EndpointSlice of default/kubernetes, the API server at addr.
func apiServerSlice(addr string) *discoveryv1.EndpointSlice {
	port, pname := int32(6443), "https"
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "kubernetes", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}}},
	}
}

func renderNodeObject(name, addr string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}}}
}

// TestRenderAppliesNodeWideRules: render refuses what a running supervisor refuses,
// not only what the tenant ranges refuse: user addresses that are reserved (this node's
// and the other Nodes' addresses, this host's, a ServiceCIDR, reservedCIDRs, another
// Service's cluster IP) or claimed first by a Service of another instance, and Services
// over the instance's maxServiceElements. Render used to apply the router's guards only
// and printed rules the node does not have, so an audit or a soak checkpoint against it
// was wrong.
func TestRenderAppliesNodeWideRules(t *testing.T) {
	old, young := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	nodes := []*corev1.Node{renderNodeObject("node-1", "192.168.100.1"), renderNodeObject("node-2", "192.168.100.2")}
	cidrs := []*networkingv1.ServiceCIDR{{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}}
	tests := []struct {
		name string
		// config is appended to renderConfigYAML's top level.
		config   string
		host     []netip.Addr
		services []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		// served and refused are dispatch entries of team-a's script ("198.51.100.9 . tcp
		// . 80": an element of service-ips, or of no-endpoint-services without endpoints);
		// problems are substrings of a problem each.
		served, refused, problems []string
	}{{
		name:     "a free external IP in the tenant's range is served",
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "198.51.100.9")},
		served:   []string{"172.30.0.10 . tcp . 80", "198.51.100.9 . tcp . 80"},
	}, {
		name:     "this node's address is refused",
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "192.168.100.1")},
		served:   []string{"172.30.0.10 . tcp . 80"},
		refused:  []string{"192.168.100.1 . tcp . 80"},
		problems: []string{"a/svc: ", "192.168.100.1"},
	}, {
		name:     "this host's interface address is refused",
		host:     []netip.Addr{netip.MustParseAddr("192.168.200.5")},
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "192.168.200.5")},
		refused:  []string{"192.168.200.5 . tcp . 80"},
		problems: []string{"192.168.200.5"},
	}, {
		name:     "another Node's address is refused",
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "192.168.100.2")},
		refused:  []string{"192.168.100.2 . tcp . 80"},
		problems: []string{"192.168.100.2"},
	}, {
		name:     "another Node's address is served when reserveOtherNodeAddresses is off",
		config:   "reserveOtherNodeAddresses: false\n",
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "192.168.100.2")},
		served:   []string{"192.168.100.2 . tcp . 80"},
	}, {
		name:     "an address inside a ServiceCIDR is refused",
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "10.96.5.5")},
		refused:  []string{"10.96.5.5 . tcp . 80"},
		problems: []string{"10.96.5.5"},
	}, {
		name:     "an address inside reservedCIDRs is refused",
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "198.51.100.200")},
		refused:  []string{"198.51.100.200 . tcp . 80"},
		problems: []string{"198.51.100.200"},
	}, {
		name:     "the API server's endpoint is refused",
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "192.168.50.10")},
		slices:   []*discoveryv1.EndpointSlice{apiServerSlice("192.168.50.10")},
		refused:  []string{"192.168.50.10 . tcp . 80"},
		problems: []string{"192.168.50.10"},
	}, {
		name:     "a cloud metadata address is refused",
		services: []*corev1.Service{renderService("a", "svc", "172.30.0.10", young, "100.100.100.200")},
		refused:  []string{"100.100.100.200 . tcp . 80"},
		problems: []string{"100.100.100.200"},
	}, {
		name: "another instance's Service's cluster IP is refused",
		services: []*corev1.Service{
			renderService("a", "svc", "172.30.0.10", young, "172.30.0.99"),
			renderService("b", "other", "172.30.0.99", old),
		},
		served:   []string{"172.30.0.10 . tcp . 80"},
		refused:  []string{"172.30.0.99 . tcp . 80"},
		problems: []string{"172.30.0.99"},
	}, {
		name: "an address another instance's older Service claims is refused, the older given last",
		services: []*corev1.Service{
			renderService("a", "svc", "172.30.0.10", young, "198.51.100.7"),
			renderService("b", "holder", "172.30.0.11", old, "198.51.100.7"),
		},
		served:   []string{"172.30.0.10 . tcp . 80"},
		refused:  []string{"198.51.100.7 . tcp . 80"},
		problems: []string{"a/svc: ", "198.51.100.7"},
	}, {
		name: "an address another instance's older Service claims is refused, the older given first",
		services: []*corev1.Service{
			renderService("b", "holder", "172.30.0.11", old, "198.51.100.7"),
			renderService("a", "svc", "172.30.0.10", young, "198.51.100.7"),
		},
		served:   []string{"172.30.0.10 . tcp . 80"},
		refused:  []string{"198.51.100.7 . tcp . 80"},
		problems: []string{"a/svc: ", "198.51.100.7"},
	}, {
		name: "a Service over maxServiceElements is not programmed, the others are",
		services: []*corev1.Service{
			renderService("a", "big", "172.30.0.20", young),
			renderService("a", "svc", "172.30.0.10", young),
		},
		slices:   []*discoveryv1.EndpointSlice{renderSlice("a", "big", 200), renderSlice("a", "svc", 1)},
		served:   []string{"172.30.0.10 . tcp . 80"},
		refused:  []string{"172.30.0.20 . tcp . 80"},
		problems: []string{"a/big: ", "over the limit of 100"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Decode([]byte(renderConfigYAML+tc.config), "test.yaml")
			if err != nil {
				t.Fatal(err)
			}
			cfg.DefaultWith(func(string) string { return "" }, func() (string, error) { return "node-1", nil })
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			script, problems, err := Render(cfg, "team-a", RenderInput{Services: tc.services, Slices: tc.slices,
				Nodes: nodes, ServiceCIDRs: cidrs, InterfaceAddrs: func() ([]netip.Addr, error) { return tc.host, nil }})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range tc.served {
				if !strings.Contains(script, "{ "+e+" : ") {
					t.Errorf("%s is not served; script:\n%s", e, script)
				}
			}
			for _, e := range tc.refused {
				if strings.Contains(script, "{ "+e+" : ") {
					t.Errorf("%s is served, the node refuses it", e)
				}
			}
			all := strings.Join(problems, "\n")
			for _, p := range tc.problems {
				if !strings.Contains(all, p) {
					t.Errorf("no problem mentions %q; problems:\n%s", p, all)
				}
			}
			if len(tc.problems) == 0 && len(problems) > 0 {
				t.Errorf("problems %q; want none", problems)
			}
		})
	}
}

// TestRenderMatchesRun: for every case of the hostile corpus, what render makes of the
// API's objects is, table for table, what the running supervisor programmed from them:
// routing, tenant guards, address precedence, reserved addresses and size limits alike.
func TestRenderMatchesRun(t *testing.T) {
	files, err := filepath.Glob("testdata/hostile/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			_, objs := loadHostileCase(t, file)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
				Spec:   corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
				Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.100.1"}}}}
			f := startSupervisorWith(t, fixtureOptions{configYAML: hostileConfigYAML, node: node, objects: objs, logger: funcr.New(func(string, string) {}, funcr.Options{})})
			in := renderInputFromAPI(t, f)
			for _, inst := range f.sup.router.Instances() {
				want, _, err := Render(f.sup.cfg, inst, in)
				if err != nil {
					t.Fatal(err)
				}
				table := tables.TableName(f.sup.cfg.TablePrefix, inst)
				got := func() string {
					return f.tables.dump(tablestest.Key(tables.IPv4, table)) + f.tables.dump(tablestest.Key(tables.IPv6, table))
				}
				var diff string
				defer func() {
					if diff != "" {
						t.Logf("instance %s: render differs from the programmed tables (- render only, + run only):\n%s", inst, diff)
					}
				}()
				testutil.Eventually(t, waitTimeout, "instance "+inst+"'s tables equal to its render", func() bool {
					diff = lineDiff(want, got())
					return diff == ""
				})
			}
		})
	}
}

// renderInputFromAPI reads what render reads from the fixture's API, as the soak's
// checkpoint dumps it.
func renderInputFromAPI(t *testing.T, f *fixture) RenderInput {
	t.Helper()
	ctx := context.Background()
	var in RenderInput
	svcs, err := f.client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range svcs.Items {
		in.Services = append(in.Services, &svcs.Items[i])
	}
	sls, err := f.client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range sls.Items {
		in.Slices = append(in.Slices, &sls.Items[i])
	}
	nodes, err := f.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range nodes.Items {
		in.Nodes = append(in.Nodes, &nodes.Items[i])
	}
	return in
}

// lineDiff lists the lines only in a ("-") and only in b ("+"), in order.
func lineDiff(a, b string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	ca, cb := count(a), count(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if cb[l] > 0 {
			cb[l]--
			continue
		}
		out = append(out, "- "+l)
	}
	cb = count(b)
	for _, l := range strings.Split(b, "\n") {
		if ca[l] > 0 {
			ca[l]--
			continue
		}
		out = append(out, "+ "+l)
	}
	return strings.Join(out, "\n")
}
