package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// A proxy must refuse connections to a Service while it has no ready endpoint, so failed
// requests then are not the proxy's. They are excused only in that window, as this
// test's watch of the Service's EndpointSlices saw it, widened by two margins:
const (
	// excuseBefore: the proxy and this test see the same EndpointSlice update through
	// two watches of one API server, each delivered when its process is scheduled; the
	// proxy may see the last ready endpoint go, and refuse, a little before the test
	// records it. One second covers that skew on the loaded 2-core machines the layer
	// runs on; it is not room for a backend dying before its readiness says so (those
	// failures are not excused: a Service with another ready endpoint must not fail).
	excuseBefore = time.Second
	// excuseAfter: once an endpoint is ready again, the proxy programs it at its next
	// sync, which minSyncPeriod (1 s, the default the test configuration keeps) may hold
	// back, plus the sync itself (milliseconds) and the same watch skew.
	excuseAfter = 2 * time.Second
)

// readySample is the number of ready endpoints a Service had from at on.
type readySample struct {
	at    time.Time
	ready int
}

// window is the span [from, to].
type window struct {
	from, to time.Time
}

func (w window) String() string {
	return w.from.Format("15:04:05.000") + "-" + w.to.Format("15:04:05.000")
}

// noReadyWindows returns the spans in which samples (in time order, each holding until
// the next, the last until end) count no ready endpoint, widened by before and after.
func noReadyWindows(samples []readySample, end time.Time, before, after time.Duration) []window {
	var out []window
	for i, s := range samples {
		if s.ready != 0 {
			continue
		}
		to := end
		if i+1 < len(samples) {
			to = samples[i+1].at
		}
		w := window{s.at.Add(-before), to.Add(after)}
		if n := len(out); n > 0 && !w.from.After(out[n-1].to) {
			out[n-1].to = w.to // overlapping once widened: one window
			continue
		}
		out = append(out, w)
	}
	return out
}

// unexcused returns the failures (the times their requests were sent) that fall in none
// of windows. A failure with no time (zero) falls in none.
func unexcused(failures []time.Time, windows []window) []time.Time {
	var out []time.Time
	for _, f := range failures {
		excused := false
		for _, w := range windows {
			if !f.Before(w.from) && !f.After(w.to) {
				excused = true
				break
			}
		}
		if !excused {
			out = append(out, f)
		}
	}
	return out
}

// ReadyTimeline records the number of ready endpoints of one Service over time, from
// its EndpointSlices as a watch delivers them to the test.
type ReadyTimeline struct {
	name     string
	stop     func()
	stopOnce sync.Once

	mu      sync.Mutex
	samples []readySample
	end     time.Time
}

// WatchReady starts recording the ready endpoints of Service svc in ns, and returns once
// the current count is recorded. Stop ends the recording.
func (c *Cluster) WatchReady(ctx context.Context, ns, svc string) (*ReadyTimeline, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + svc
		}))
	inf := factory.Discovery().V1().EndpointSlices().Informer()
	tl := &ReadyTimeline{name: ns + "/" + svc}
	// The informer calls its handlers one at a time, after its store has the change.
	count := func() {
		ready := 0
		for _, obj := range inf.GetStore().List() {
			for _, ep := range obj.(*discoveryv1.EndpointSlice).Endpoints {
				// A nil ready condition is to be read as ready (discovery/v1).
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					ready++
				}
			}
		}
		tl.observe(time.Now(), ready)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { count() },
		UpdateFunc: func(any, any) { count() },
		DeleteFunc: func(any) { count() },
	}); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		cancel()
		factory.Shutdown()
		return nil, fmt.Errorf("watching the EndpointSlices of %s: %w", tl.name, context.Cause(ctx))
	}
	count() // a Service without slices calls no handler
	tl.stop = func() {
		cancel()
		factory.Shutdown()
	}
	return tl, nil
}

func (tl *ReadyTimeline) observe(at time.Time, ready int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if !tl.end.IsZero() {
		return
	}
	if n := len(tl.samples); n > 0 && tl.samples[n-1].ready == ready {
		return
	}
	tl.samples = append(tl.samples, readySample{at, ready})
}

// Stop ends the recording: the last count holds until now. Later calls do nothing.
func (tl *ReadyTimeline) Stop() {
	tl.stopOnce.Do(func() {
		tl.mu.Lock()
		tl.end = time.Now()
		tl.mu.Unlock()
		tl.stop()
	})
}

// Unexcused returns the failures (the times their requests were sent) outside every
// window in which the Service had no ready endpoint (widened by excuseBefore and
// excuseAfter), and those windows. Call it after Stop.
func (tl *ReadyTimeline) Unexcused(failures []time.Time) (bad []time.Time, windows []window) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	windows = noReadyWindows(tl.samples, tl.end, excuseBefore, excuseAfter)
	return unexcused(failures, windows), windows
}

// String is the recording: "ns/svc: 2 ready at 12:00:00.000, 0 at 12:00:03.120, ...".
func (tl *ReadyTimeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	parts := make([]string, len(tl.samples))
	for i, s := range tl.samples {
		parts[i] = fmt.Sprintf("%d ready at %s", s.ready, s.at.Format("15:04:05.000"))
	}
	return tl.name + ": " + strings.Join(parts, ", ") + " (until " + tl.end.Format("15:04:05.000") + ")"
}
