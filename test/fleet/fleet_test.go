package fleet

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/testutil"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct{ method, url, want string }{
		{"GET", "/api/v1/services?watch=true&resourceVersion=5", "watch services"},
		{"GET", "/apis/discovery.k8s.io/v1/endpointslices?limit=500", "list endpointslices"},
		{"GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-1&watch=1", "watch nodes"},
		{"GET", "/api/v1/namespaces/shardproxy-system/configmaps/shardproxy-node-node-1", "get configmaps"},
		{"PUT", "/api/v1/namespaces/shardproxy-system/configmaps/shardproxy-node-node-1", "update configmaps"},
		{"POST", "/api/v1/namespaces/bench/events", "create events"},
		{"PATCH", "/api/v1/nodes/node-1/status", "patch nodes/status"},
		{"GET", "/apis/networking.k8s.io/v1/servicecidrs", "list servicecidrs"},
	} {
		req, err := http.NewRequest(tc.method, "https://127.0.0.1:6443"+tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		verb, res := Classify(req)
		if got := verb + " " + res; got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.method, tc.url, got, tc.want)
		}
	}
}

func TestParseAPIServerMetrics(t *testing.T) {
	text := `# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="PATCH",version="v1"} 3
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="services",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{group="",resource="nodes",version="v1"} 1000
apiserver_watch_events_total{group="discovery.k8s.io",resource="endpointslices",version="v1"} 20
# TYPE apiserver_watch_events_sizes histogram
apiserver_watch_events_sizes_bucket{group="",resource="configmaps",version="v1",le="1024"} 1
apiserver_watch_events_sizes_bucket{group="",resource="configmaps",version="v1",le="+Inf"} 3
apiserver_watch_events_sizes_sum{group="",resource="configmaps",version="v1"} 30000
apiserver_watch_events_sizes_count{group="",resource="configmaps",version="v1"} 3
apiserver_watch_events_sizes_bucket{group="",resource="nodes",version="v1",le="+Inf"} 1000
apiserver_watch_events_sizes_sum{group="",resource="nodes",version="v1"} 500000
apiserver_watch_events_sizes_count{group="",resource="nodes",version="v1"} 1000
# TYPE apiserver_longrunning_requests gauge
apiserver_longrunning_requests{component="apiserver",group="",resource="services",scope="cluster",subresource="",verb="WATCH",version="v1"} 300
apiserver_longrunning_requests{component="apiserver",group="",resource="services",scope="namespace",subresource="",verb="WATCH",version="v1"} 2
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="log",verb="GET",version="v1"} 9
# TYPE etcd_requests_total counter
etcd_requests_total{operation="update",type="/registry/minions"} 10
etcd_requests_total{operation="get",type="/registry/minions"} 99
etcd_requests_total{operation="create",type="/registry/services/specs"} 4
`
	got, err := ParseAPIServerMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if got.Requests["PATCH nodes"] != 10 || got.Requests["WATCH services"] != 2 {
		t.Errorf("requests: %v", got.Requests)
	}
	if got.WatchEvents["nodes"] != 1000 || got.WatchEvents.Total() != 1020 {
		t.Errorf("watch events: %v", got.WatchEvents)
	}
	if got.WatchBytes["configmaps"] != 30000 || got.WatchBytes.Total() != 530000 {
		t.Errorf("watch bytes: %v, want each resource's sum of event sizes", got.WatchBytes)
	}
	if got.Watches["services"] != 302 || got.Watches.Total() != 302 {
		t.Errorf("open watches: %v, want 302 of Services (a log stream is no watch)", got.Watches)
	}
	if got.EtcdWrites.Total() != 14 {
		t.Errorf("etcd writes: %v, want 14 (gets are not writes)", got.EtcdWrites)
	}
	d := got.Sub(APIServerCounters{WatchEvents: Counts{"nodes": 400}})
	if d.WatchEvents["nodes"] != 600 || d.WatchEvents["endpointslices"] != 20 {
		t.Errorf("difference: %v", d.WatchEvents)
	}
	if top := d.WatchEvents.Top(1, 10*time.Second); top != "nodes 60.0/s" {
		t.Errorf("top: %q", top)
	}
	d = got.Sub(APIServerCounters{WatchBytes: Counts{"nodes": 488000}})
	if top := d.WatchBytes.Scale(1.0/1024).Top(2, time.Second); top != "configmaps 29.3/s, nodes 11.7/s" {
		t.Errorf("top watch KB: %q", top)
	}
}

// TestTinyFleet runs three hollow nodes against a fake clientset, watching every Node
// or reading the published list (a writer in the process): each programs the Services,
// publishes its own status ConfigMap and programs a new Service.
func TestTinyFleet(t *testing.T) {
	for _, source := range []string{config.OtherNodeAddressesWatch, config.OtherNodeAddressesPublished} {
		t.Run(source, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			client := testutil.NewClientset()
			c := gen.Generate(20, 3)
			if err := Prepare(ctx, client, 3, c, 2); err != nil {
				t.Fatal(err)
			}
			// Node churn, one join or leave each 100 ms for 3 s: the writer (its
			// debounce 1 s) publishes at least once in the window.
			res, err := Measure(ctx, Env{Admin: client, NodeClient: client}, Options{
				Nodes: 3, ReserveOtherNodeAddresses: true, OtherNodeAddresses: source, Steady: 3 * time.Second, StatusPeriod: 100 * time.Millisecond,
				Churn: 100 * time.Millisecond, Changes: 2, ReadyTimeout: 30 * time.Second, Logf: t.Logf}, len(c.Services))
			if err != nil {
				t.Fatal(err)
			}
			if res.ProgrammingMax <= 0 || res.ProgrammingP50 > res.ProgrammingMax {
				t.Errorf("programming: p50 %v max %v", res.ProgrammingP50, res.ProgrammingMax)
			}
			if res.StatusWrites == 0 {
				t.Errorf("no Node heartbeats written")
			}
			if res.ChurnChanges < 5 {
				t.Errorf("%d Node joins and leaves in 3 s, want one each 100 ms", res.ChurnChanges)
			}
			if published := source == config.OtherNodeAddressesPublished; published != (res.Publishes > 0 && res.PublishedBytes > 0) {
				t.Errorf("the writer's lists in the window: %d, %d bytes (published %v)", res.Publishes, res.PublishedBytes, published)
			}
			nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil || len(nodes.Items) != 3 {
				t.Errorf("Nodes after the churn: %d %v, want the fleet's 3 (churn's deleted)", len(nodes.Items), err)
			}
			for i := range 3 {
				name := "shardproxy-node-" + NodeName(i)
				if _, err := client.CoreV1().ConfigMaps(StatusNamespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
					t.Errorf("node %d's status: %v", i, err)
				}
				n, err := client.CoreV1().Nodes().Get(ctx, NodeName(i), metav1.GetOptions{})
				if err != nil || n.Status.Conditions[0].Type != corev1.NodeReady {
					t.Errorf("Node %d: %v %v", i, n, err)
				}
			}
			_, err = client.CoreV1().ConfigMaps(StatusNamespace).Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
			if published := source == config.OtherNodeAddressesPublished; published != (err == nil) {
				t.Errorf("the published node address list: %v (published %v)", err, published)
			}
			if want := map[string]string{config.OtherNodeAddressesWatch: "true"}[source]; want != "" && res.Reserve() != want ||
				want == "" && res.Reserve() != config.OtherNodeAddressesPublished {
				t.Errorf("the row's reserve %q", res.Reserve())
			}
			t.Log("\n" + Table([]*Result{res}))
		})
	}
}
