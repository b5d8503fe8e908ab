package instance

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/tables"
)

// gate holds whoever passes it until it is released, and says when the first arrived.
type gate struct {
	arrived, open      chan struct{}
	arrive, openedOnce sync.Once
}

// newGate returns a closed gate, released when the test ends.
func newGate(t *testing.T) *gate {
	g := &gate{arrived: make(chan struct{}), open: make(chan struct{})}
	t.Cleanup(g.release)
	return g
}

func (g *gate) pass() {
	g.arrive.Do(func() { close(g.arrived) })
	<-g.open
}

func (g *gate) release() { g.openedOnce.Do(func() { close(g.open) }) }

// promptly runs fn and fails the test unless it returns within the bound: fn must not
// wait for anything that takes longer (a sync in progress). The bound leaves room for a
// loaded machine and the race detector; the calls themselves take microseconds.
func promptly(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); fn() }()
	select {
	case <-done:
		t.Logf("%s returned in %v", what, time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatalf("%s waited for the sync in progress", what)
	}
}

// namedAt returns the default Service renamed to ns/name with cluster IP ip.
func namedAt(name, ip string) *corev1.Service {
	return service(func(s *corev1.Service) {
		s.Name = name
		s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
	})
}

// programs reports whether dump holds the cluster IP ip.
func programs(dump, ip string) bool { return strings.Contains(dump, "cluster-ips { "+ip+" }") }

// TestEventsDoNotWaitForSync checks the node's event handler never waits for an
// instance's sync: while one instance's sync is stuck (building a model, or in nft),
// every event delivered to it and to another instance returns at once, the other
// instance syncs, and once the stuck sync ends the next one programs those events.
func TestEventsDoNotWaitForSync(t *testing.T) {
	for _, tc := range []struct {
		name string
		// hold makes p's next sync stop at g.
		hold func(p *Proxy, nft *flakyNFT, g *gate)
	}{
		{
			name: "stuck building a model",
			hold: func(p *Proxy, _ *flakyNFT, g *gate) {
				p.tracker.build = func(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo) *ServiceModel {
					if svc.Name == webName.Name {
						g.pass()
					}
					return Build(svc, slices, node)
				}
			},
		},
		{
			name: "stuck in nft",
			hold: func(_ *Proxy, nft *flakyNFT, g *gate) { nft.held.Store(g) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			stuck, stuckNFT := newTestProxy(t, nil)
			other, otherNFT := newTestProxy(t, nil)
			stuck.UpdateService(service())
			stuck.UpdateService(namedAt("old", "172.30.0.30"))
			stuck.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1.5", thisNodeName)))
			g := newGate(t)
			tc.hold(stuck, stuckNFT, g)
			synced := make(chan error, 1)
			go func() {
				_, err := stuck.Sync(ctx, false)
				synced <- err
			}()
			select {
			case <-g.arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the sync never reached the gate")
			}

			var late <-chan struct{}
			zoneB := NodeInfo{Name: thisNodeName, Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}}
			for _, ev := range []struct {
				name string
				do   func()
			}{
				{"UpdateService", func() { late = stuck.UpdateService(namedAt("late", "172.30.0.20")) }},
				{"UpdateEndpointSlice", func() { stuck.UpdateEndpointSlice(v4Slice("web-2", ep("10.244.2.5", "node-b"))) }},
				{"DeleteEndpointSlice", func() { stuck.DeleteEndpointSlice(v4Slice("web-1")) }},
				{"DeleteService", func() { stuck.DeleteService(types.NamespacedName{Namespace: "ns", Name: "old"}) }},
				{"SetNode", func() { stuck.SetNode(zoneB) }},
				{"Reconfigure", func() {
					if err := stuck.Reconfigure(func(c *tables.Config) { c.NodePortIPs = ips("192.168.0.1") }); err != nil {
						t.Error(err)
					}
				}},
				{"Applied", func() { stuck.Applied() }},
				{"UpdateService on another instance", func() { other.UpdateService(service()) }},
			} {
				promptly(t, ev.name, ev.do)
			}
			promptly(t, "another instance's sync", func() {
				if _, err := other.Sync(ctx, false); err != nil {
					t.Error(err)
				}
			})
			if !programs(otherNFT.dump(), clusterIP4) {
				t.Errorf("the other instance did not program its Service:\n%s", otherNFT.dump())
			}

			g.release()
			if err := <-synced; err != nil {
				t.Fatalf("the stuck sync: %v", err)
			}
			res, err := stuck.Sync(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Full {
				t.Error("the sync after Reconfigure must be full")
			}
			select {
			case <-late:
			default:
				t.Error("the Service added during the stuck sync was not reported programmed")
			}
			dump := stuckNFT.dump()
			for _, want := range []string{"172.30.0.20", "10.244.2.5 . 8080"} {
				if !strings.Contains(dump, want) {
					t.Errorf("%s, from an event during the stuck sync, is not programmed:\n%s", want, dump)
				}
			}
			for _, gone := range []string{"172.30.0.30", "10.244.1.5"} {
				if strings.Contains(dump, gone) {
					t.Errorf("%s, removed during the stuck sync, is still programmed:\n%s", gone, dump)
				}
			}
		})
	}
}
