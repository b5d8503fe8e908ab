package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestCrossNode runs what only a fleet shows, on the replace overlay's default instance
// on every node (issue 30, item 4), each scenario under client loops that must not fail
// once: a pod on node-1 reaching, through the IPv4 and the IPv6 cluster IP, endpoints
// that are all on node-2; an outside client reaching node-2's NodePort of a Service
// whose endpoints are all on node-1 (masqueraded to node-2's address, replies back the
// same way); externalTrafficPolicy Local with one endpoint on node-1, whose
// healthCheckNodePort answers 200 on node-1 and 503 on node-2, as a cloud load
// balancer's check sees it, and whose NodePort on node-2 drops (not rejects, not
// forwards); and node-2 drained (kubectl drain: its pods evicted) while clients on
// node-1 keep connecting.
func TestCrossNode(t *testing.T) {
	c := need(t)
	if len(c.Nodes) < 2 {
		// CI runs two nodes ($CLUSTER_NODES unset): this runs there.
		t.Skipf("%d node: the cross-node scenarios need two ($%s)", len(c.Nodes), NodesEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	deployReplaceOverlay(ctx, t, c, shardproxyTag)
	n1, n2 := c.Node(1), c.Node(2)
	const ns = "crossnode"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamespace(t, c, ns) })

	t.Run("pod on node-1 to a ClusterIP with endpoints on node-2", func(t *testing.T) {
		svc := c.crossNodeWeb(ctx, t, ns, "on-node-2", n2, 2, func(s *corev1.Service) {
			s.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicyRequireDualStack)
		})
		want := c.podsOn(ctx, t, ns, "on-node-2", n2)
		for i, ip := range svc.Spec.ClusterIPs {
			url := "http://" + net.JoinHostPort(ip, "80") + "/hostname"
			if _, err := c.WaitServedByAll(ctx, n1.NS, url, len(want)); err != nil {
				t.Fatal(err)
			}
			n, err := c.PodLoopOn(ctx, n1, ns, agnhostImage, url, 150, 20*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			family := []string{"IPv4", "IPv6"}[i]
			fmt.Printf("cluster: cross-node: pod on %s -> %s ClusterIP %s -> endpoints on %s: %s\n", n1.Name, family, ip, n2.Name, n)
			if n.Failed.Load() > 0 || n.OK.Load() != 150 || !sameSet(n.ServedBy(), want) {
				t.Errorf("%s: %s; want 150 answered, 0 failed, by the pods on %s %v", family, n, n2.Name, want)
			}
		}
	})

	t.Run("outside to node-2's NodePort with endpoints on node-1", func(t *testing.T) {
		svc := c.crossNodeWeb(ctx, t, ns, "on-node-1", n1, 2, func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
		})
		want := c.podsOn(ctx, t, ns, "on-node-1", n1)
		base := "http://" + net.JoinHostPort(n2.IP, strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
		if _, err := c.WaitServedByAll(ctx, c.ExtNS, base+"/hostname", len(want)); err != nil {
			t.Fatal(err)
		}
		n := c.loopFor(ctx, c.ExtNS, base+"/hostname", 5*time.Second)
		fmt.Printf("cluster: cross-node: outside -> %s's NodePort -> endpoints on %s: %s\n", n2.Name, n1.Name, n)
		if n.Failed.Load() > 0 || n.OK.Load() == 0 || !sameSet(n.ServedBy(), want) {
			t.Errorf("%s; want every request answered, by the pods on %s %v", n, n1.Name, want)
		}
		// Masqueraded: the endpoint on node-1 sees node-2, so its replies go back through
		// node-2, which undoes the NAT.
		source, err := c.Get(ctx, c.ExtNS, base+"/clientip")
		if host, _, _ := net.SplitHostPort(source); err != nil || host != n2.IP {
			t.Errorf("the endpoint saw %q (%v), want %s's address %s (masqueraded)", source, err, n2.Name, n2.IP)
		}
	})

	t.Run("externalTrafficPolicy Local with its endpoint on node-1", func(t *testing.T) {
		svc := c.crossNodeWeb(ctx, t, ns, "local", n1, 1, func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		})
		hc := int(svc.Spec.HealthCheckNodePort)
		if hc == 0 {
			t.Fatalf("the Service has no healthCheckNodePort")
		}
		// As a cloud load balancer checks every node: 200 where an endpoint is local.
		for _, check := range []struct {
			node   *Node
			status int
			local  int
		}{{n1, http.StatusOK, 1}, {n2, http.StatusServiceUnavailable, 0}} {
			var got healthCheck
			err := poll(ctx, time.Minute, fmt.Sprintf("%s's health check node port answering %d", check.node.Name, check.status), func() (bool, error) {
				got = c.healthCheck(ctx, check.node, hc)
				return got.status == check.status && got.LocalEndpoints == check.local, nil
			})
			if err != nil {
				t.Fatalf("%v: got %d %q", err, got.status, got.body)
			}
			fmt.Printf("cluster: cross-node: externalTrafficPolicy Local: %s's healthCheckNodePort %d answers %d, localEndpoints %d\n", check.node.Name, hc, got.status, got.LocalEndpoints)
		}
		nodePort := strconv.Itoa(int(svc.Spec.Ports[0].NodePort))
		url := "http://" + net.JoinHostPort(n1.IP, nodePort)
		if _, err := c.WaitServedByAll(ctx, c.ExtNS, url+"/hostname", 1); err != nil {
			t.Fatal(err)
		}
		n := c.loopFor(ctx, c.ExtNS, url+"/hostname", 5*time.Second)
		source, err := c.Get(ctx, c.ExtNS, url+"/clientip")
		host, _, _ := net.SplitHostPort(source)
		fmt.Printf("cluster: cross-node: externalTrafficPolicy Local: outside -> %s's NodePort: %s; the endpoint saw %s\n", n1.Name, n, host)
		if n.Failed.Load() > 0 || n.OK.Load() == 0 {
			t.Errorf("outside -> %s's NodePort: %s; want every request answered", n1.Name, n)
		}
		if err != nil || host != ExtIP {
			t.Errorf("the endpoint saw %q (%v), want the client's own address %s", source, err, ExtIP)
		}
		// node-2 has no local endpoint: its NodePort drops, so the client times out
		// (a load balancer would have stopped sending there on the 503).
		addr := net.JoinHostPort(n2.IP, nodePort)
		dropped := 0
		for range 5 {
			dialCtx, cancel := context.WithTimeout(ctx, time.Second)
			conn, err := c.Dialer(c.ExtNS)(dialCtx, "tcp", addr)
			cancel()
			switch {
			case err == nil:
				conn.Close()
				t.Errorf("%s's NodePort %s accepted a connection, want it dropped", n2.Name, addr)
			case errors.Is(err, syscall.ECONNREFUSED):
				t.Errorf("%s's NodePort %s refused, want it dropped (no answer)", n2.Name, addr)
			case isTimeout(err):
				dropped++
			default:
				t.Errorf("%s's NodePort %s: %v, want no answer", n2.Name, addr, err)
			}
		}
		fmt.Printf("cluster: cross-node: externalTrafficPolicy Local: outside -> %s's NodePort: %d of 5 connections dropped (no answer in 1s)\n", n2.Name, dropped)
	})

	t.Run("node-2 drained while node-1's clients connect", func(t *testing.T) {
		svc := c.crossNodeWeb(ctx, t, ns, "spread", nil, 4, nil)
		before := map[string][]string{}
		for _, n := range c.Nodes[:2] {
			before[n.Name] = c.podsOn(ctx, t, ns, "spread", n)
			if len(before[n.Name]) == 0 {
				t.Fatalf("no pod of the spread Deployment on %s: %s", n.Name, c.PodSummary(ctx, ns))
			}
		}
		url := "http://" + svc.Spec.ClusterIP + "/hostname"
		if _, err := c.WaitServedByAll(ctx, n1.NS, url, 4); err != nil {
			t.Fatal(err)
		}
		tl, err := c.WatchReady(ctx, ns, "spread")
		if err != nil {
			t.Fatal(err)
		}
		defer tl.Stop()
		loopCtx, stop := context.WithCancel(ctx)
		node, waitNode := c.Loop(loopCtx, n1.NS, url, 20*time.Millisecond)
		type podResult struct {
			n   *Counter
			err error
		}
		podDone := make(chan podResult, 1)
		go func() {
			n, err := c.PodLoopOn(ctx, n1, ns, agnhostImage, url, 300, 50*time.Millisecond)
			podDone <- podResult{n, err}
		}()
		t.Cleanup(func() { _, _ = c.Kubectl(context.Background(), "", "uncordon", n2.Name) })
		start := time.Now()
		// --force: other tests' client pods (no controller) may still be going away there.
		out, err := c.Kubectl(ctx, "", "drain", n2.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=3m")
		drained := time.Since(start)
		if err != nil {
			t.Errorf("kubectl drain: %v\n%s", err, out)
		}
		if err := c.WaitDeploymentAvailable(ctx, ns, "spread", 2*time.Minute); err != nil {
			t.Error(err)
		}
		pod := <-podDone
		stop()
		waitNode()
		tl.Stop()
		if left := c.podsOn(ctx, t, ns, "spread", n2); len(left) > 0 {
			t.Errorf("after the drain %s still runs %v", n2.Name, left)
		}
		if pod.err != nil {
			t.Fatalf("pod loop: %v", pod.err)
		}
		for _, r := range []struct {
			name string
			n    *Counter
		}{{n1.Name + " -> ClusterIP", node}, {"pod on " + n1.Name + " -> ClusterIP", pod.n}} {
			fmt.Printf("cluster: cross-node: %s drained in %v (pods before: %s %d, %s %d): %-26s %s\n", n2.Name, drained.Round(time.Millisecond),
				n1.Name, len(before[n1.Name]), n2.Name, len(before[n2.Name]), r.name, r.n)
			if r.n.OK.Load() == 0 || r.n.Failed.Load() > 0 {
				t.Errorf("%s: %s; want every request answered (ready endpoints: %s)", r.name, r.n, tl)
			}
		}
	})
}

// crossNodeWeb creates Deployment name of replicas agnhost pods on node n (nil: spread
// over the nodes, at most one pod apart) behind a Service of the same name, changed by
// edit, and waits for the pods; it returns the Service as created. The pods delay their
// exit by 5 s after SIGTERM, as a server that drains does, so that an evicted pod serves
// until every node has dropped its endpoint (upstream's e2e tests do the same).
func (c *Cluster) crossNodeWeb(ctx context.Context, t *testing.T, ns, name string, n *Node, replicas int32, edit func(*corev1.Service)) *corev1.Service {
	t.Helper()
	d := agnhostDeployment(name, agnhostImage, replicas, 8080, "--http-port=8080", "--delay-shutdown=5")
	spec := &d.Spec.Template.Spec
	spec.TerminationGracePeriodSeconds = new(int64(15))
	if n != nil {
		spec.NodeSelector = map[string]string{corev1.LabelHostname: n.Name}
	} else {
		honor := corev1.NodeInclusionPolicyHonor
		spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: d.Spec.Selector, NodeTaintsPolicy: &honor,
		}}
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: d.Spec.Selector.MatchLabels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	if edit != nil {
		edit(svc)
	}
	created, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return created
}

// podsOn lists the names of app's running pods in ns on node n.
func (c *Cluster) podsOn(ctx context.Context, t *testing.T, ns, app string, n *Node) []string {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app, FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			names = append(names, p.Name)
		}
	}
	return names
}

// loopFor runs a client loop (Loop, a request every 20 ms) from ns to url for d.
func (c *Cluster) loopFor(ctx context.Context, ns, url string, d time.Duration) *Counter {
	loopCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	n, wait := c.Loop(loopCtx, ns, url, 20*time.Millisecond)
	wait()
	return n
}

// healthCheck is what a Service's health check node port answered (kube-proxy's body).
type healthCheck struct {
	status         int
	body           string
	LocalEndpoints int `json:"localEndpoints"`
}

// healthCheck asks node n's health check node port port from outside, as a cloud load
// balancer does.
func (c *Cluster) healthCheck(ctx context.Context, n *Node, port int) healthCheck {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: c.Dialer(c.ExtNS), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(n.IP, strconv.Itoa(port))+"/", nil)
	if err != nil {
		return healthCheck{body: err.Error()}
	}
	resp, err := client.Do(req)
	if err != nil {
		return healthCheck{body: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	h := healthCheck{status: resp.StatusCode, body: string(body), LocalEndpoints: -1}
	_ = json.Unmarshal(body, &h)
	return h
}

// deleteNamespace deletes ns and waits for it to go.
func deleteNamespace(t *testing.T, c *Cluster, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
		return
	}
	err := poll(ctx, 2*time.Minute, "namespace "+ns+" gone", func() (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Error(err)
	}
}

// isTimeout reports whether err is a dial that got no answer before its deadline (the
// context's, or the dialer's own i/o timeout).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
