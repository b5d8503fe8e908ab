package cluster

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// instanceWebs are the three instances' namespaces and the proxy name their Service has.
var instanceWebs = []struct{ ns, proxyName string }{
	{"default", ""},
	{"team-a", "team-a"},
	{"team-b", "team-b"},
}

// TestInstances runs the replace overlay with three instances (the configuration replaced
// through kustomize) and, for each instance, a 2-replica Deployment behind a NodePort
// Service: every way into node-1 reaches both pods of each (from the node, from the
// outside namespace, from a pod by DNS name), wherever the scheduler put them, and every
// node has each instance's table. Then, under client loops from all three places, the
// scenarios a node lives through: a DaemonSet rolling update to a new image tag (every
// node), node-1's shardproxy pod deleted and recreated, and node-1's containerd
// restarted, each with no failed connection.
func TestInstances(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	apply := func(tag string) {
		t.Helper()
		took := applyOverlay(ctx, t, c, Overlay{Dir: c.OverlayDir(ReplaceOverlay), Image: "localhost/shardproxy:" + tag, APIServer: true, Config: ThreeInstances})
		t.Logf("three instances, image %s: rolled out in %v", tag, took.Round(time.Millisecond))
	}
	apply(shardproxyTag)

	webs := map[string]*Web{}
	for _, w := range instanceWebs {
		web, err := c.DeployWeb(ctx, w.ns, agnhostImage, w.proxyName, 2)
		if err != nil {
			t.Fatal(err)
		}
		webs[w.ns] = web
	}
	for _, n := range c.Nodes {
		var tables []string
		err := poll(ctx, time.Minute, "every instance's table on "+n.Name, func() (bool, error) {
			var err error
			tables, err = n.NFTTables(ctx)
			return containsPrefix(tables, "ip shardproxy-default") && containsPrefix(tables, "ip shardproxy-team-a") &&
				containsPrefix(tables, "ip shardproxy-team-b"), err
		})
		if err != nil {
			t.Fatalf("%v: %s has %q", err, n.Name, tables)
		}
	}
	n1 := c.Node(1)

	t.Run("every way in", func(t *testing.T) {
		for _, w := range instanceWebs {
			web := webs[w.ns]
			took, err := c.WaitServedByAll(ctx, n1.NS, "http://"+web.ClusterIP+"/hostname", 2)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Printf("cluster: every way in: %-8s both pods answer through the ClusterIP %v after the Deployment is available\n", w.ns, took.Round(time.Millisecond))
			for _, path := range trafficPaths(c, n1, web) {
				n := path.run(ctx, t, 20)
				fmt.Printf("cluster: every way in: %-8s %-28s %s\n", w.ns, path.name, n)
				if n.Failed.Load() > 0 || len(n.ServedBy()) != 2 {
					t.Errorf("%s, %s: %s; want every request answered, by both pods", w.ns, path.name, n)
				}
			}
		}
	})

	underLoad := func(name string, disrupt func()) {
		t.Run(name, func(t *testing.T) {
			// What each Service's endpoints were through the disruption, from before the
			// first request: a failure is excused only while its Service had none ready.
			timelines := map[string]*ReadyTimeline{}
			for _, w := range instanceWebs {
				tl, err := c.WatchReady(ctx, w.ns, "web")
				if err != nil {
					t.Fatal(err)
				}
				defer tl.Stop()
				timelines[w.ns] = tl
			}
			loopCtx, stop := context.WithCancel(ctx)
			var counters []*Counter
			var waits []func()
			var labels, namespaces []string
			for _, w := range instanceWebs {
				web := webs[w.ns]
				n, wait := c.Loop(loopCtx, n1.NS, "http://"+web.ClusterIP+"/hostname", 20*time.Millisecond)
				counters, waits, labels = append(counters, n), append(waits, wait), append(labels, w.ns+" node->ClusterIP")
				n, wait = c.Loop(loopCtx, c.ExtNS, fmt.Sprintf("http://%s:%d/hostname", n1.IP, web.NodePort), 20*time.Millisecond)
				counters, waits, labels = append(counters, n), append(waits, wait), append(labels, w.ns+" outside->NodePort")
				namespaces = append(namespaces, w.ns, w.ns)
			}
			// The goroutine reports through the channel, never through t: a disruption
			// that fails the subtest (t.Fatal) ends it while the loop goes on, and a t
			// call after that panics the binary, which then skips the cluster's teardown
			// (seen when containerd outlived SIGKILL on a loaded machine).
			type podResult struct {
				n   *Counter
				err error
			}
			podDone := make(chan podResult, 1)
			go func() {
				n, err := c.PodLoop(ctx, "team-a", agnhostImage, "http://web.team-a.svc.cluster.local/hostname", 200, 100*time.Millisecond)
				podDone <- podResult{n, err}
			}()
			start := time.Now()
			disrupt()
			// The loops go on past the disruption: until the pod's loop has finished.
			pod := <-podDone
			if pod.err != nil {
				t.Errorf("pod loop: %v", pod.err)
			}
			podCounter := pod.n
			stop()
			for _, wait := range waits {
				wait()
			}
			for _, tl := range timelines {
				tl.Stop()
			}
			if podCounter != nil {
				counters, namespaces = append(counters, podCounter), append(namespaces, "team-a")
				labels = append(labels, "team-a pod->DNS name")
			}
			for i, n := range counters {
				fmt.Printf("cluster: %s: %-26s %s\n", name, labels[i], n)
				if n.OK.Load() == 0 {
					t.Errorf("%s: %s: %s; want requests answered", name, labels[i], n)
				}
				if n.Failed.Load() == 0 {
					continue
				}
				tl := timelines[namespaces[i]]
				bad, windows := tl.Unexcused(n.FailedAt())
				if len(bad) > 0 {
					t.Errorf("%s: %s: %s; %d sent while the Service had a ready endpoint (first at %s), want 0 failed outside %v (%v before, %v after); %s",
						name, labels[i], n, len(bad), bad[0].Format("15:04:05.000"), windows, excuseBefore, excuseAfter, tl)
					continue
				}
				// Not the proxy's doing: a Service without a ready endpoint must refuse.
				fmt.Printf("cluster: %s: %s: every failure above was sent while the Service had no ready endpoint (%v); %s\n", name, labels[i], windows, tl)
			}
			t.Logf("%s: disruption and loops took %v", name, time.Since(start).Round(time.Millisecond))
		})
	}

	underLoad("rolling update", func() {
		if err := c.TagImage(ctx, "localhost/shardproxy:"+shardproxyTag, "localhost/shardproxy:"+shardproxyTag+"2"); err != nil {
			t.Fatal(err)
		}
		apply(shardproxyTag + "2")
	})
	underLoad("pod deleted", func() {
		old := shardproxyPod(ctx, t, c, n1).Name
		if err := c.Client.CoreV1().Pods("kube-system").Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err := poll(ctx, 2*time.Minute, "a new shardproxy pod Ready on "+n1.Name, func() (bool, error) {
			pod, err := podOn(ctx, c, n1, "kube-system", "app.kubernetes.io/name=shardproxy")
			if err != nil || pod.Name == old {
				return false, nil
			}
			return podReady(pod), nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	underLoad("containerd restarted", func() {
		if err := n1.RestartContainerd(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitNodesReady(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// trafficPath is one way into a node to a web Service.
type trafficPath struct {
	name string
	run  func(ctx context.Context, t *testing.T, n int) *Counter
}

// trafficPaths are the ways into node to web: from the node, from outside, from pods
// (wherever the scheduler puts them).
func trafficPaths(c *Cluster, node *Node, web *Web) []trafficPath {
	get := func(ns, url string) func(ctx context.Context, t *testing.T, n int) *Counter {
		return func(ctx context.Context, t *testing.T, count int) *Counter {
			n := &Counter{}
			for range count {
				body, err := c.Get(ctx, ns, url)
				n.record(body, err)
			}
			return n
		}
	}
	nodePort := strconv.Itoa(int(web.NodePort))
	return []trafficPath{
		{"node -> ClusterIP", get(node.NS, "http://"+web.ClusterIP+"/hostname")},
		{"node -> NodeIP:NodePort", get(node.NS, "http://"+node.IP+":"+nodePort+"/hostname")},
		{"outside -> NodeIP:NodePort", get(c.ExtNS, "http://"+node.IP+":"+nodePort+"/hostname")},
		{"outside -> ClusterIP", get(c.ExtNS, "http://"+web.ClusterIP+"/hostname")},
		{"pod -> DNS name", func(ctx context.Context, t *testing.T, count int) *Counter {
			n, err := c.PodLoop(ctx, web.Namespace, agnhostImage, "http://web."+web.Namespace+".svc.cluster.local/hostname", count, 0)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}},
		{"pod -> NodeIP:NodePort", func(ctx context.Context, t *testing.T, count int) *Counter {
			n, err := c.PodLoop(ctx, web.Namespace, agnhostImage, "http://"+node.IP+":"+nodePort+"/hostname", count, 0)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}},
	}
}
