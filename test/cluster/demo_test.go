package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDemo is `make demo-cluster` on the layer's node: the demo's Services behind agnhost
// pods, served by the replace overlay's DaemonSet with the demo's three instances, and
// `make demo`'s table. Every row must be as its Service asks (demo.Sample.Problem: the
// instance whose table holds the cluster IP, served, refused or left alone, one endpoint
// under ClientIP affinity, the client's own address under externalTrafficPolicy Local),
// and every Service must have its rows.
func TestDemo(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	d, err := c.StartDemo(ctx, "localhost/shardproxy:"+shardproxyTag, agnhostImage)
	t.Cleanup(func() {
		if err := d.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	up := time.Since(start)
	var out strings.Builder
	rows, err := d.Report(ctx, &out)
	for _, line := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		fmt.Printf("cluster: demo: %s\n", line)
	}
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("cluster: demo: Services up in %v, report in %v\n", up.Round(time.Second), (time.Since(start) - up).Round(time.Second))
	got := map[string][]string{}
	for _, r := range rows {
		got[r.Service] = append(got[r.Service], r.WayIn)
	}
	want := map[string]string{
		"shop/frontend":     "ClusterIP,ClusterIP (UDP),ClusterIP (IPv6),NodePort",
		"team-a/api":        "ClusterIP,ClusterIP (UDP),NodePort,LoadBalancer IP",
		"team-b/cache":      "ClusterIP,ClusterIP (UDP)",
		"team-b/empty":      "ClusterIP,ClusterIP (UDP)",
		"elsewhere/foreign": "ClusterIP,ClusterIP (UDP)",
	}
	for svc, ways := range want {
		if g := strings.Join(got[svc], ","); g != ways {
			t.Errorf("%s: rows for %q, want %q", svc, g, ways)
		}
	}
	if len(got) != len(want) {
		t.Errorf("rows for %d Services, want %d", len(got), len(want))
	}
}
