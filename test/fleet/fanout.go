package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/supervisor/config"
)

// FanoutResult is what one object size cost the apiserver: Updates writes of a
// ConfigMap of Size bytes, each received by every one of Watchers watches.
type FanoutResult struct {
	Size, Watchers, Updates int
	// Took is from the first write until every watcher had the last.
	Took time.Duration
	// CPU is kube-apiserver's CPU time over Took (0 without Env.APIServerPID).
	CPU time.Duration
	// Events and Bytes are the apiserver's ConfigMap watch events and bytes written to
	// watchers over Took (apiserver_watch_events_total, apiserver_watch_events_sizes; 0
	// without Env.APIServerMetrics).
	Events, Bytes float64
}

// PerEvent is the apiserver's CPU per watcher event.
func (r FanoutResult) PerEvent() time.Duration {
	if r.Events == 0 {
		return 0
	}
	return time.Duration(float64(r.CPU) / r.Events)
}

// MeasureFanout measures what the apiserver pays to send an object of each size to many
// watchers, the cost of the published node address list under churn: a ConfigMap of
// that size, watchers watches of it by a field selector on its name (each on a client and
// connection of its own, protobuf, as a node's), then updates writes of it, each waited
// for until every watcher has it.
func MeasureFanout(ctx context.Context, env Env, namespace string, watchers, updates int, sizes []int) ([]FanoutResult, error) {
	var out []FanoutResult
	for _, size := range sizes {
		r, err := fanout(ctx, env, namespace, watchers, updates, size)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func fanout(ctx context.Context, env Env, namespace string, watchers, updates, size int) (FanoutResult, error) {
	res := FanoutResult{Size: size, Watchers: watchers, Updates: updates}
	name := fmt.Sprintf("fleet-fanout-%d", size)
	cms := env.Admin.CoreV1().ConfigMaps(namespace)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name},
		Data: map[string]string{"list": strings.Repeat("a", size)}}, metav1.CreateOptions{})
	if err != nil {
		return res, fmt.Errorf("creating ConfigMap %s: %w", name, err)
	}
	defer func() { _ = cms.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) }()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	got := make(chan struct{}, watchers)
	for i := range watchers {
		client := env.NodeClient
		if client == nil {
			rc := rest.CopyConfig(env.NodeConfig())
			rc.ContentType = config.ContentTypeProtobuf
			rc.AcceptContentTypes = config.ContentTypeProtobuf + "," + config.ContentTypeJSON
			rc.UserAgent = fmt.Sprintf("fleet-fanout/%d", i)
			rc.Dial = newDialer()
			if client, err = kubernetes.NewForConfig(rc); err != nil {
				return res, err
			}
		}
		w, err := client.CoreV1().ConfigMaps(namespace).Watch(wctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: cm.ResourceVersion})
		if err != nil {
			return res, fmt.Errorf("watching ConfigMap %s: %w", name, err)
		}
		go func() {
			defer w.Stop()
			for ev := range w.ResultChan() {
				if ev.Type == watch.Modified {
					select {
					case got <- struct{}{}:
					case <-wctx.Done():
						return
					}
				}
			}
		}()
	}
	before, beforeServer, _, err := readCounters(ctx, env, NewRequestCounter())
	if err != nil {
		return res, err
	}
	start := time.Now()
	for u := range updates {
		// A text of the same size that differs from the last: one letter per update.
		cm.Data["list"] = strings.Repeat(string(rune('b'+u%24)), size)
		if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return res, fmt.Errorf("updating ConfigMap %s: %w", name, err)
		}
		for k := range watchers {
			select {
			case <-got:
			case <-ctx.Done():
				return res, fmt.Errorf("update %d of ConfigMap %s: %d of %d watchers had it: %w", u, name, k, watchers, ctx.Err())
			}
		}
	}
	res.Took = time.Since(start)
	after, afterServer, _, err := readCounters(ctx, env, NewRequestCounter())
	if err != nil {
		return res, err
	}
	d := afterServer.Sub(beforeServer)
	res.CPU, res.Events, res.Bytes = after.CPU-before.CPU, d.WatchEvents["configmaps"], d.WatchBytes["configmaps"]
	if env.APIServerMetrics != nil && res.Events < float64(watchers*updates) {
		return res, errors.New("fan-out: the apiserver counted fewer ConfigMap watch events than its watchers received")
	}
	return res, nil
}

// FanoutTable formats MeasureFanout's results, one row per size.
func FanoutTable(rs []FanoutResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-9s %-8s %-7s %-9s %-8s %-8s %-10s %-12s %s\n", "size", "watchers", "updates", "took", "apiCPU", "events", "MB sent", "CPU/event", "CPU/GB sent")
	for _, r := range rs {
		perGB := "n/a"
		if r.Bytes > 0 {
			perGB = fmt.Sprintf("%.2fs", r.CPU.Seconds()/(r.Bytes/1e9))
		}
		fmt.Fprintf(&b, "%-9s %-8d %-7d %-9s %-8s %-8.0f %-10.1f %-12s %s\n", fmt.Sprintf("%d kB", r.Size>>10), r.Watchers, r.Updates,
			r.Took.Round(time.Millisecond), r.CPU.Round(time.Millisecond), r.Events, r.Bytes/1e6, r.PerEvent().Round(time.Microsecond), perGB)
	}
	return b.String()
}
