package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
	"sigs.k8s.io/yaml"

	"github.com/shardproxy/shardproxy/tables/tracer"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// sharedTenantsYAML is oneInstanceYAML with sharedTenants on: the corpus's instances
// overlap on purpose, for the node-wide rules to decide.
var sharedTenantsYAML = strings.Replace(oneInstanceYAML, "instances:\n", "sharedTenants: true\ninstances:\n", 1)

// hostileConfigYAML opens the tenant ranges wide (the default instance serves any
// external and load-balancer IP, as kube-proxy does), so that the corpus reaches the
// node-wide rules and the model, not just the ranges.
var hostileConfigYAML = sharedTenantsYAML + `  detectLocal:
    mode: ClusterCIDR
    clusterCIDRs: [10.244.0.0/16, fd00:10:244::/56]
  tenant:
    externalIPCIDRs: ["0.0.0.0/0", "::/0"]
    loadBalancerCIDRs: ["0.0.0.0/0", "::/0"]
- name: team-a
  proxyNames: [team-a]
  slot: 1
  minSyncPeriod: 0s
  syncPeriod: 30s
  tenant:
    namespaces: [a]
    externalIPCIDRs: [192.0.2.0/24]
- name: team-b
  proxyNames: [team-b]
  slot: 2
  minSyncPeriod: 0s
  syncPeriod: 30s
  tenant:
    namespaces: [b]
`

// hostileCase is the first document of a corpus file (kind: Case); the others are the
// Services and EndpointSlices it creates, in order.
type hostileCase struct {
	Kind        string `json:"kind"`
	Description string `json:"description"`
	// Expand generates what is too large to write out, on the file's first Service and
	// first EndpointSlice.
	Expand struct {
		// Ports gives the Service (and the slice) that many TCP ports, p1..pN on 1..N.
		Ports int `json:"ports"`
		// Slices makes that many copies of the slice (name-1 ...), each with Endpoints
		// endpoints (default 1), all with distinct addresses in 10.250.0.0/16.
		Slices    int `json:"slices"`
		Endpoints int `json:"endpoints"`
		// SourceRanges gives the Service that many loadBalancerSourceRanges, distinct
		// /30s in 20.0.0.0/8.
		SourceRanges int `json:"sourceRanges"`
		// Copies makes the first Service that many Services (name-1 ...), copy i with
		// each port number and the cluster IP moved up by i-1, and the first slice one
		// per copy: many Services of one tenant sharing what they list (an external IP).
		Copies int `json:"copies"`
	} `json:"expand"`
	// Events are the Warning events the case's objects must get, as "Reason: text"
	// (text a substring of the message); they must get no other.
	Events []string `json:"events"`
	// LogLines is how many log lines at the default verbosity name one of the case's
	// Services.
	LogLines int `json:"logLines"`
	// Probes are packets traced through every instance's tables afterwards.
	Probes []hostileProbe `json:"probes"`
	// DumpContains are texts the instances' tables must contain.
	DumpContains []string `json:"dumpContains"`
}

// hostileProbe is one packet and what must become of it.
type hostileProbe struct {
	// From is pod (default; from 10.244.1.50 or fd00:10:244:1::50), outside or host.
	From string `json:"from"`
	// Src replaces the origin's source address.
	Src   string `json:"src"`
	Proto string `json:"proto"` // default tcp
	Dst   string `json:"dst"`
	Port  uint16 `json:"port"`
	// Want are the tracer's outcomes, sorted ("accept dnat 10.244.2.2:8080").
	Want []string `json:"want"`
	// DNATs, when set instead of Want, is how many distinct DNAT targets there are.
	DNATs int `json:"dnats"`
}

// TestHostileCorpus feeds the real supervisor (watches, dispatcher, address
// precedence, tenant guards, instances) each file of testdata/hostile: objects a careless
// or malicious user can create. For each, the objects are served as upstream would or
// refused with an event and one log line; three bystander Services, one per instance,
// created after them, get programmed (so no instance's sync failed as a whole and every
// instance took the case's objects); no sync fails.
func TestHostileCorpus(t *testing.T) {
	files, err := filepath.Glob("testdata/hostile/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			hc, objs := loadHostileCase(t, file)
			runHostileCase(t, hc, objs)
		})
	}
}

func loadHostileCase(t *testing.T, file string) (hostileCase, []runtime.Object) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var hc hostileCase
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if i == 0 {
			if err := yaml.UnmarshalStrict(doc, &hc); err != nil || hc.Kind != "Case" {
				t.Fatalf("the first document must be the Case (kind: Case): %v", err)
			}
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		objs = append(objs, obj)
	}
	return hc, copyHostile(t, hc, expandHostile(t, hc, objs))
}

// copyHostile applies the case's Expand.Copies to its first Service and first slice.
func copyHostile(t *testing.T, hc hostileCase, objs []runtime.Object) []runtime.Object {
	t.Helper()
	if hc.Expand.Copies == 0 {
		return objs
	}
	var svc *corev1.Service
	var slice *discoveryv1.EndpointSlice
	var rest []runtime.Object
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.Service:
			if svc == nil {
				svc = o
				continue
			}
		case *discoveryv1.EndpointSlice:
			if slice == nil && svc != nil && o.Labels[discoveryv1.LabelServiceName] == svc.Name {
				slice = o
				continue
			}
		}
		rest = append(rest, obj)
	}
	if svc == nil || slice == nil {
		t.Fatal("expand.copies needs a Service and its EndpointSlice")
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("expand.copies: cluster IP: %v", err)
	}
	var out []runtime.Object
	for i := range hc.Expand.Copies {
		c, cs := svc.DeepCopy(), slice.DeepCopy()
		c.Name = fmt.Sprintf("%s-%d", svc.Name, i+1)
		c.Spec.ClusterIP, c.Spec.ClusterIPs = ip.String(), []string{ip.String()}
		ip = ip.Next()
		for p := range c.Spec.Ports {
			c.Spec.Ports[p].Port += int32(i)
		}
		cs.Name, cs.Labels[discoveryv1.LabelServiceName] = c.Name+"-1", c.Name
		out = append(out, c, cs)
	}
	return append(out, rest...)
}

// expandHostile applies the case's Expand to its first Service and first slice.
func expandHostile(t *testing.T, hc hostileCase, objs []runtime.Object) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	expandedSvc, expandedSlice := false, false
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.Service:
			if !expandedSvc && hc.Expand.Ports > 0 {
				o.Spec.Ports = nil
				for i := 1; i <= hc.Expand.Ports; i++ {
					o.Spec.Ports = append(o.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(i),
						Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(int32(i))})
				}
			}
			if !expandedSvc {
				for i := range hc.Expand.SourceRanges {
					o.Spec.LoadBalancerSourceRanges = append(o.Spec.LoadBalancerSourceRanges,
						fmt.Sprintf("20.%d.%d.%d/30", i>>14, (i>>6)&255, (i&63)*4))
				}
			}
			expandedSvc = true
			out = append(out, o)
		case *discoveryv1.EndpointSlice:
			if expandedSlice || (hc.Expand.Ports == 0 && hc.Expand.Slices == 0 && hc.Expand.Endpoints == 0) {
				out = append(out, o)
				continue
			}
			expandedSlice = true
			out = append(out, expandSlice(hc, o)...)
		default:
			t.Fatalf("the corpus holds Services and EndpointSlices, not %T", obj)
		}
	}
	return out
}

func expandSlice(hc hostileCase, tmpl *discoveryv1.EndpointSlice) []runtime.Object {
	if hc.Expand.Ports > 0 {
		tmpl.Ports = nil
		for i := 1; i <= hc.Expand.Ports; i++ {
			tmpl.Ports = append(tmpl.Ports, discoveryv1.EndpointPort{Name: ptr.To(fmt.Sprintf("p%d", i)), Port: ptr.To(int32(i)),
				Protocol: ptr.To(corev1.ProtocolTCP)})
		}
	}
	n, per := max(hc.Expand.Slices, 1), max(hc.Expand.Endpoints, 1)
	if hc.Expand.Slices == 0 && hc.Expand.Endpoints == 0 {
		return []runtime.Object{tmpl}
	}
	var out []runtime.Object
	next := netip.MustParseAddr("10.250.0.0")
	for i := range n {
		sl := tmpl.DeepCopy()
		if n > 1 {
			sl.Name = fmt.Sprintf("%s-%d", tmpl.Name, i+1)
		}
		sl.Endpoints = nil
		for range per {
			next = next.Next()
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{next.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node-2")})
		}
		out = append(out, sl)
	}
	return out
}

// bystanders are Services of each instance, created after a case's objects.
var bystanders = []struct {
	ns, proxyName, clusterIP, endpoint string
}{
	{"x", "", "172.30.9.1", "10.244.9.1"},
	{"a", "team-a", "172.30.9.2", "10.244.9.2"},
	{"b", "team-b", "172.30.9.3", "10.244.9.3"},
}

func runHostileCase(t *testing.T, hc hostileCase, objs []runtime.Object) {
	logs := &logCapture{}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec:   corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.100.1"}}}}
	f := startSupervisorWith(t, fixtureOptions{configYAML: hostileConfigYAML, node: node, logger: logs.logger()})
	ctx := context.Background()
	var names []types.NamespacedName
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.Service:
			names = append(names, types.NamespacedName{Namespace: o.Namespace, Name: o.Name})
			if _, err := f.client.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		case *discoveryv1.EndpointSlice:
			if _, err := f.client.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var probes []hostileProbe
	for _, b := range bystanders {
		createServiceWithEndpoint(t, f, b.ns, "bystander", b.proxyName, b.clusterIP, b.endpoint)
		probes = append(probes, hostileProbe{Dst: b.clusterIP, Port: 80, Want: []string{"accept dnat " + b.endpoint + ":8080"}})
	}
	testutil.Eventually(t, waitTimeout, "every bystander programmed", func() bool {
		for _, p := range probes {
			if got, err := f.trace(p); err != nil || !slices.Equal(got, p.Want) {
				return false
			}
		}
		return true
	})
	for _, p := range hc.Probes {
		got, err := f.trace(p)
		switch {
		case err != nil:
			t.Errorf("probe %+v: %v", p, err)
		case p.DNATs > 0 && countDNATs(got) != p.DNATs:
			t.Errorf("probe %+v: %d DNAT targets, want %d (%q...)", p, countDNATs(got), p.DNATs, got[:min(len(got), 3)])
		case p.DNATs == 0 && !slices.Equal(got, p.Want):
			t.Errorf("probe %+v:\n got %q\nwant %q", p, got, p.Want)
		}
	}
	dump := f.tables.dumpAll()
	for _, want := range hc.DumpContains {
		if !strings.Contains(dump, want) {
			t.Errorf("the tables lack %q", want)
		}
	}
	// The events are recorded after the sync that refused the Service has written its
	// tables, so a probe can see those tables first: wait for every wanted event.
	var missing, unexpected []string
	testutil.Eventually(t, waitTimeout, fmt.Sprintf("the events %q", hc.Events), func() bool {
		missing, unexpected = hostileEvents(f.rec.all(), names, hc.Events)
		return len(missing) == 0
	})
	for _, u := range unexpected {
		t.Errorf("unexpected event: %s", u)
	}
	if got := logs.naming(names); len(got) != hc.LogLines {
		t.Errorf("%d log lines name the case's Services, want %d:\n%s", len(got), hc.LogLines, strings.Join(got, "\n"))
	}
	if failures := syncFailures(t, f.sup); failures != 0 {
		t.Errorf("%d failed syncs", failures)
	}
}

// createServiceWithEndpoint creates a ClusterIP Service (port http 80) with one ready
// endpoint on 8080 in another node.
func createServiceWithEndpoint(t *testing.T, f *fixture, ns, name, proxyName, clusterIP, endpoint string) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, ClusterIPs: []string{clusterIP}, Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}}}
	if proxyName != "" {
		svc.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": proxyName}
	}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{endpoint}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To("node-2")}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	ctx := context.Background()
	if _, err := f.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// trace runs a probe through every table the instances wrote, with no sync running.
func (f *fixture) trace(p hostileProbe) ([]string, error) {
	dst, err := netip.ParseAddr(p.Dst)
	if err != nil {
		return nil, err
	}
	pkt := tracer.Packet{Origin: tracer.FromPod, Src: netip.MustParseAddr("10.244.1.50"), Proto: "tcp", Dst: dst, Port: p.Port}
	if dst.Is6() {
		pkt.Src = netip.MustParseAddr("fd00:10:244:1::50")
	}
	switch p.From {
	case "", "pod":
	case "outside":
		pkt.Origin, pkt.Src = tracer.FromOutside, netip.MustParseAddr("203.0.113.99")
		if dst.Is6() {
			pkt.Src = netip.MustParseAddr("2001:db8:ffff::99")
		}
	case "host":
		pkt.Origin, pkt.Src = tracer.FromHost, netip.MustParseAddr("192.168.100.1")
	default:
		return nil, fmt.Errorf("unknown origin %q", p.From)
	}
	if p.Proto != "" {
		pkt.Proto = p.Proto
	}
	if p.Src != "" {
		if pkt.Src, err = netip.ParseAddr(p.Src); err != nil {
			return nil, err
		}
	}
	fakes := f.tables.all()
	for _, fk := range fakes {
		fk.RLock()
		defer fk.RUnlock()
	}
	tr, err := tracer.New(tracer.Env{LocalIPs: []netip.Addr{netip.MustParseAddr("192.168.100.1")}}, fakes...)
	if err != nil {
		return nil, err
	}
	outs, err := tr.Trace(pkt)
	if err != nil {
		return nil, err
	}
	got := make([]string, 0, len(outs))
	for _, o := range outs {
		got = append(got, o.String())
	}
	slices.Sort(got)
	return got, nil
}

func countDNATs(outcomes []string) int {
	n := 0
	for _, o := range outcomes {
		if strings.Contains(o, " dnat ") {
			n++
		}
	}
	return n
}

// all returns every table's fake, sorted by key.
func (f *fakeTables) all() []*knftables.Fake {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*knftables.Fake
	for _, key := range slices.Sorted(maps.Keys(f.fakes)) {
		out = append(out, f.fakes[key])
	}
	return out
}

// dumpAll dumps every table.
func (f *fakeTables) dumpAll() string {
	var b strings.Builder
	for _, fk := range f.all() {
		fk.RLock()
		if fk.Table != nil {
			b.WriteString(fk.Dump())
		}
		fk.RUnlock()
	}
	return b.String()
}

// hostileEvents compares the events on the case's Services with the wanted ones.
func hostileEvents(all string, names []types.NamespacedName, want []string) (missing, unexpected []string) {
	var got []string
	for _, line := range strings.Split(all, "\n") {
		for _, n := range names {
			if strings.HasPrefix(line, n.String()+" ") {
				got = append(got, line)
			}
		}
	}
	matched := make([]bool, len(got))
	for _, w := range want {
		reason, text, _ := strings.Cut(w, ": ")
		found := false
		for i, g := range got {
			if !matched[i] && strings.Contains(g, " "+reason+": ") && strings.Contains(g, text) {
				matched[i], found = true, true
				break
			}
		}
		if !found {
			missing = append(missing, w)
		}
	}
	for i, g := range got {
		if !matched[i] {
			unexpected = append(unexpected, g)
		}
	}
	return missing, unexpected
}

// syncFailures sums the instances' failed nftables syncs.
func syncFailures(t *testing.T, s *Supervisor) int {
	t.Helper()
	total := 0
	for _, inst := range []string{"default", "team-a", "team-b"} {
		for _, fam := range []string{"IPv4", "IPv6"} {
			v := metricValue(t, s, fmt.Sprintf(`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=%q,proxy_instance=%q}`, fam, inst))
			if v != "" && v != "0" {
				total++
			}
		}
	}
	return total
}

// logCapture collects the log lines written at the default verbosity.
type logCapture struct {
	mu    sync.Mutex
	lines []string
}

// logger returns a logger that writes into the capture, at the default verbosity.
func (c *logCapture) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lines = append(c.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 0})
}

// naming returns the lines that name one of the Services.
func (c *logCapture) naming(names []types.NamespacedName) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		for _, n := range names {
			// Either form: a string, or types.NamespacedName's MarshalLog.
			if strings.Contains(l, `"`+n.String()+`"`) || strings.Contains(l, fmt.Sprintf(`{"name"=%q "namespace"=%q}`, n.Name, n.Namespace)) {
				out = append(out, l)
				break
			}
		}
	}
	return out
}
