package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// spreadWeb creates namespace ns if needed and deploys replicas agnhost pods spread over every node (crossNodeWeb) behind a
// NodePort Service named web in ns, labelled for proxyName when not empty, waits until
// from every node the cluster IP is answered by every pod, and returns it.
func (c *Cluster) spreadWeb(ctx context.Context, t *testing.T, ns, proxyName string, replicas int32) *Web {
	t.Helper()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	svc := c.crossNodeWeb(ctx, t, ns, "web", nil, replicas, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		if proxyName != "" {
			s.Labels = map[string]string{proxyNameLabel: proxyName}
		}
	})
	web := &Web{Namespace: ns, ClusterIP: svc.Spec.ClusterIP, NodePort: svc.Spec.Ports[0].NodePort}
	for _, n := range c.Nodes {
		if pods := c.podsOn(ctx, t, ns, "web", n); len(pods) == 0 {
			t.Fatalf("no pod of %s/web on %s: the Service must have endpoints on every node", ns, n.Name)
		}
		if _, err := c.WaitServedByAll(ctx, n.NS, "http://"+web.ClusterIP+"/hostname", int(replicas)); err != nil {
			t.Fatalf("from %s: %v", n.Name, err)
		}
	}
	return web
}

// fleetLoops runs step under client loops to web from every node, each going on until
// step is done: node-N to the cluster IP, the outside to node-N's NodePort (a request
// every 20 ms, each on a new connection), and a pod on node-N to the Service's DNS name
// (pods of 50 requests, one every 50 ms, one after the other: cluster DNS goes through
// the proxy too). It returns how long step took and each loop's counter by name.
func (c *Cluster) fleetLoops(ctx context.Context, t *testing.T, web *Web, step func()) (time.Duration, map[string]*Counter) {
	t.Helper()
	loopCtx, stop := context.WithCancel(ctx)
	counters := map[string]*Counter{}
	var waits []func()
	stepDone := make(chan struct{})
	type podResult struct {
		name string
		n    *Counter
	}
	podDone := make(chan podResult, len(c.Nodes))
	for _, n := range c.Nodes {
		cnt, wait := c.Loop(loopCtx, n.NS, "http://"+web.ClusterIP+"/hostname", 20*time.Millisecond)
		counters[n.Name+" -> ClusterIP"], waits = cnt, append(waits, wait)
		cnt, wait = c.Loop(loopCtx, c.ExtNS, fmt.Sprintf("http://%s:%d/hostname", n.IP, web.NodePort), 20*time.Millisecond)
		counters["outside -> "+n.Name+" NodePort"], waits = cnt, append(waits, wait)
		// The goroutine reports through the channel, never through t (a t call after the
		// test ended panics the binary).
		go func() {
			total := &Counter{}
			defer func() { podDone <- podResult{"pod on " + n.Name + " -> DNS name", total} }()
			for {
				cnt, err := c.PodLoopOn(loopCtx, n, web.Namespace, agnhostImage, "http://web."+web.Namespace+".svc.cluster.local/hostname", 50, 50*time.Millisecond)
				if err != nil {
					total.record("", fmt.Errorf("client pod on %s: %w", n.Name, err))
					return
				}
				total.add(cnt)
				select {
				case <-stepDone:
					return
				default:
				}
			}
		}()
	}
	start := time.Now()
	step()
	took := time.Since(start)
	close(stepDone)
	for range c.Nodes {
		r := <-podDone
		counters[r.name] = r.n
	}
	stop()
	for _, wait := range waits {
		wait()
	}
	return took, counters
}

// reportLoops prints each loop's counts as "cluster: WHAT: LOOP COUNTS" in a stable
// order, and fails the test for a loop with a failed request or none answered. It
// returns the loops' total requests and failures.
func reportLoops(t *testing.T, what string, counters map[string]*Counter) (total, failed int64) {
	t.Helper()
	names := make([]string, 0, len(counters))
	for name := range counters {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		n := counters[name]
		fmt.Printf("cluster: %s: %-30s %s\n", what, name, n)
		total += n.OK.Load() + n.Failed.Load()
		failed += n.Failed.Load()
		if n.Failed.Load() > 0 || n.OK.Load() == 0 {
			t.Errorf("%s: %s: %s; want every request answered", what, name, n)
		}
	}
	fmt.Printf("cluster: %s: %d requests in %d loops, %d failed\n", what, total, len(names), failed)
	return total, failed
}

// noShardproxyTables fails the test for every table of shardproxy (named shardproxy-* or
// shardproxy_node, either family) left on any node, as nft lists them in its namespace.
func (c *Cluster) noShardproxyTables(ctx context.Context, t *testing.T, when string) {
	t.Helper()
	for _, n := range c.Nodes {
		tables, err := n.NFTTables(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, table := range tables {
			if _, name, _ := strings.Cut(table, " "); strings.HasPrefix(name, "shardproxy") {
				t.Errorf("%s: %s still has table %s", when, n.Name, table)
			}
		}
	}
}

// serviceProxyLabel is the Node label an operator staging a migration node by node
// gives each node, for the DaemonSets' node selectors: which proxy runs there.
const serviceProxyLabel = "example.com/service-proxy"

// labelNode sets label key to value on n's Node, or removes it when value is empty.
func (c *Cluster) labelNode(ctx context.Context, t *testing.T, n *Node, key, value string) {
	t.Helper()
	var v any
	if value != "" {
		v = value
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("labelling %s %s=%q: %v", n.Name, key, value, err)
	}
}

// waitNodeProxy waits until on node n only owner ("shardproxy": the replace overlay's
// default instance, or "kube-proxy": its iptables rules) has rules for ip.
func (c *Cluster) waitNodeProxy(ctx context.Context, t *testing.T, n *Node, ip, owner string) {
	t.Helper()
	var kubeProxy, shardproxy bool
	err := poll(ctx, time.Minute, ip+" served by "+owner+" only on "+n.Name, func() (bool, error) {
		kp, err := n.Run(ctx, "iptables-save", "-t", "nat")
		if err != nil {
			return false, err
		}
		// No table (shardproxy not there yet, or gone) is no rule.
		sp, _ := n.Run(ctx, "nft", "list", "table", "ip", "shardproxy-default")
		kubeProxy, shardproxy = containsWord(kp, ip), containsWord(sp, ip)
		return kubeProxy == (owner == "kube-proxy") && shardproxy == (owner == "shardproxy"), nil
	})
	if err != nil {
		t.Errorf("%v: kube-proxy has rules for it: %v, shardproxy: %v", err, kubeProxy, shardproxy)
	}
}

// waitShardproxyReadyOn waits until shardproxy's DaemonSet has a Ready pod on node n
// (the DaemonSet's status may not count a node just labelled for it yet).
func (c *Cluster) waitShardproxyReadyOn(ctx context.Context, n *Node, timeout time.Duration) error {
	return poll(ctx, timeout, "shardproxy's pod Ready on "+n.Name, func() (bool, error) {
		if err := c.childrenRunning(); err != nil {
			return false, err
		}
		pod, err := podOn(ctx, c, n, "kube-system", "app.kubernetes.io/name=shardproxy")
		return err == nil && podReady(pod), nil
	})
}
