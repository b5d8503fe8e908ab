package instance

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestUnsyncableInstanceStaysBounded: an instance whose syncs fail for a long time
// while its Services and EndpointSlices churn keeps what it holds bounded by what exists,
// not by how many changes or failed attempts there were: one waiter per Service (every
// update of it shares one channel), one pending endpoint-change trigger per family, the
// slices that exist now. When nft works again, one sync answers every waiter.
func TestUnsyncableInstanceStaysBounded(t *testing.T) {
	const services, rounds = 10, 300
	clock := testutil.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	p, nft := newTestProxy(t, nil, func(o *Options) { o.Clock = clock })
	ctx := context.Background()
	svc := func(i, rv int) *corev1.Service {
		return service(func(s *corev1.Service) {
			s.Name = fmt.Sprintf("web-%d", i)
			s.ResourceVersion = fmt.Sprint(rv)
			s.Spec.ClusterIP = fmt.Sprintf("172.30.0.%d", 10+i)
			s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
		})
	}
	for i := range services {
		p.UpdateService(svc(i, 1))
	}
	if _, err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}

	nft.fail.Store(true)
	channels := map[<-chan struct{}]bool{}
	start := clock.Now()
	for r := range rounds {
		clock.Step(time.Second)
		for i := range services {
			channels[p.UpdateService(svc(i, r+2))] = true
			// A slice that comes and goes, and one that changes, each with a trigger.
			gone := labelled(triggered(v4Slice(fmt.Sprintf("web-%d-%d", i, r), ep("10.244.1.5", thisNodeName)), fmt.Sprint(r+2), clock.Now()), fmt.Sprintf("web-%d", i))
			p.UpdateEndpointSlice(gone)
			p.DeleteEndpointSlice(gone)
			p.UpdateEndpointSlice(labelled(triggered(v4Slice(fmt.Sprintf("web-%d-stay", i), ep("10.244.1.6", thisNodeName)), fmt.Sprint(r+2), clock.Now()), fmt.Sprintf("web-%d", i)))
		}
		if _, err := p.Sync(ctx, false); err == nil {
			t.Fatal("want a failure")
		}
	}
	p.mu.Lock()
	waiting, slices := len(p.waiting), 0
	for _, bySlice := range p.tracker.slices {
		slices += len(bySlice)
	}
	p.mu.Unlock()
	if len(channels) != services || waiting != services {
		t.Errorf("after %d failed syncs: %d distinct channels handed out, %d waiters; want %d (one per Service)", rounds, len(channels), waiting, services)
	}
	if len(p.triggers) > 1 {
		t.Errorf("%d endpoint-change triggers kept across the failed syncs, want at most 1 (the oldest)", len(p.triggers))
	}
	if slices != services {
		t.Errorf("the tracker holds %d slices, want the %d that exist", slices, services)
	}

	nft.fail.Store(false)
	clock.Step(time.Second)
	res, err := p.Sync(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for ch := range channels {
		select {
		case <-ch:
		default:
			t.Fatal("a waiter was not answered by the first successful sync")
		}
	}
	// The oldest change was the first round's, a second after the failures began.
	if lat := res.ProgrammingLatencies[tables.IPv4]; len(lat) == 0 || lat[0] != clock.Now().Sub(start.Add(time.Second)) {
		t.Errorf("latencies %v, want the oldest pending change's first", lat)
	}
}

// TestWaiterOfServiceUpdatedDuringSync: a Service updated while a sync that took its
// earlier version runs keeps its channel open through that sync (the new version is not
// programmed yet) and is answered by the next.
func TestWaiterOfServiceUpdatedDuringSync(t *testing.T) {
	p, nft := newTestProxy(t, nil)
	ctx := context.Background()
	first := p.UpdateService(service())
	g := newGate(t)
	nft.held.Store(g)
	done := make(chan error, 1)
	go func() { _, err := p.Sync(ctx, false); done <- err }()
	<-g.arrived
	second := p.UpdateService(service(func(s *corev1.Service) { s.ResourceVersion = "2" }))
	nft.held.Store(nil)
	g.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatal("two updates of one Service got two channels")
	}
	select {
	case <-second:
		t.Fatal("the sync that took the first version answered for the second")
	default:
	}
	if _, err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-second:
	default:
		t.Fatal("the next sync did not answer")
	}
}
