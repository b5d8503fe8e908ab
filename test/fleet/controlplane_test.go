package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/controlplane"
)

// startFleetControlPlane starts a kube-apiserver and etcd that take the bench's
// Services (its Service CIDRs and NodePort range) and returns them with the Env that
// Measure needs: the admin client, each node's configuration, the apiserver's pid and
// its metrics.
func startFleetControlPlane(t *testing.T) (*controlplane.ControlPlane, Env) {
	t.Helper()
	cp := controlplane.StartWith(t, controlplane.Options{ServiceCIDRs: gen.ServiceCIDRs,
		ExtraAPIServerArgs: []string{"--service-node-port-range=" + gen.NodePortRange}})
	admin := cp.Client()
	return cp, Env{Admin: admin, NodeConfig: func() *rest.Config { return cp.RESTConfig() }, APIServerPID: cp.PIDs()[len(cp.PIDs())-1],
		APIServerMetrics: apiserverMetrics(admin)}
}

// apiserverMetrics reads kube-apiserver's /metrics with admin's client.
func apiserverMetrics(admin kubernetes.Interface) func(context.Context) (APIServerCounters, error) {
	return func(ctx context.Context) (APIServerCounters, error) {
		raw, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return APIServerCounters{}, fmt.Errorf("reading /metrics: %w", err)
		}
		return ParseAPIServerMetrics(strings.NewReader(string(raw)))
	}
}

// TestBothProxies is make fleet's slice for make test: three hollow shardproxy nodes,
// three of kubemark's hollow kube-proxies, then those with their own-Node watches, one
// after the other, against one real kube-apiserver and etcd with 50 Services. Each fleet must hold the Services (kubemark's
// by its open watches), cost the apiserver watch events for the driver's heartbeats, and
// stop leaving no watch open; shardproxy's must program a new Service on every node.
func TestBothProxies(t *testing.T) {
	cp, env := startFleetControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := controlplane.KubemarkBinary(ctx, nil)
	if err != nil {
		t.Fatalf("kubemark: %v", err)
	}
	admin := env.Admin
	c := gen.Generate(50, 3)
	const nodes = 3
	if err := Prepare(ctx, admin, nodes, c, 4); err != nil {
		t.Fatal(err)
	}
	metrics := env.APIServerMetrics
	env.Kubemark = &KubemarkOptions{Binary: bin, Kubeconfig: cp.Kubeconfig, LogDir: t.TempDir()}
	var results []*Result
	for _, proxy := range []Proxy{Shardproxy, KubeProxy, KubeProxyNodeWatch} {
		before, err := metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Measure(ctx, env, Options{Proxy: proxy, Nodes: nodes, Settle: time.Second, Steady: 3 * time.Second,
			StatusPeriod: time.Second, Changes: 1, QPS: 5, Burst: 10, ReadyTimeout: time.Minute, Logf: t.Logf}, len(c.Services))
		if err != nil {
			t.Fatalf("%s: %v", proxy, err)
		}
		results = append(results, res)
		if res.StatusWrites == 0 || res.Server.WatchEvents["nodes"] == 0 {
			t.Errorf("%s: %d heartbeats, %v Node watch events", proxy, res.StatusWrites, res.Server.WatchEvents["nodes"])
		}
		if res.ProxyMemory <= 0 || res.APIServerCPUPerMinute <= 0 {
			t.Errorf("%s: proxy memory %d, apiserver CPU %v s/min", proxy, res.ProxyMemory, res.APIServerCPUPerMinute)
		}
		if proxy == Shardproxy && (res.ProgrammingMax <= 0 || res.ProgrammingMax > 30*time.Second) {
			t.Errorf("shardproxy: programming max %v", res.ProgrammingMax)
		}
		// Measure returned once the fleet's watches were gone; check it did.
		if err := WaitWatchesClosed(ctx, metrics, before.Watches, time.Nanosecond); err != nil {
			t.Errorf("%s: %v", proxy, err)
		}
	}
	t.Log("\n" + Table(results))
}
