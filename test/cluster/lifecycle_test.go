package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/netns"
)

// TestColdStartWithoutDNS starts shardproxy (the replace overlay, the apiserver set by
// address as its knob asks) on a node that has no Service rule at all, as after a reboot,
// while CoreDNS is down: the supervisor must reach kube-apiserver without the kubernetes
// Service and without cluster DNS (dnsPolicy Default), become Ready and program the
// Services; then CoreDNS comes back and cluster DNS works through shardproxy.
func TestColdStartWithoutDNS(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c.removeShardproxy(ctx, t)
	c.scaleDNS(ctx, t, 0)
	t.Cleanup(func() { c.scaleDNS(context.Background(), t, 1) })
	for _, n := range c.Nodes {
		if out, err := n.Run(ctx, "conntrack", "-F"); err != nil {
			t.Fatalf("%s: conntrack -F: %v: %s", n.Name, err, out)
		}
	}
	if kubernetesServiceAnswers(ctx, c) == nil {
		t.Fatal("the kubernetes Service answers before any proxy runs")
	}

	deployReplaceOverlay(ctx, t, c, shardproxyTag)
	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "shardproxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ds.Spec.Template.Spec.DNSPolicy; got != corev1.DNSDefault {
		t.Errorf("the replace overlay's dnsPolicy is %q, want Default", got)
	}
	start := time.Now()
	err = poll(ctx, time.Minute, "the kubernetes Service answers from the node", func() (bool, error) {
		return kubernetesServiceAnswers(ctx, c) == nil, nil
	})
	if err != nil {
		t.Fatalf("%v: %v", err, kubernetesServiceAnswers(ctx, c))
	}
	fmt.Printf("cluster: cold start, CoreDNS down: pod Ready, kubernetes Service served %v later\n", time.Since(start).Round(time.Millisecond))

	c.scaleDNS(ctx, t, 1)
	start = time.Now()
	err = poll(ctx, time.Minute, "kubernetes.default resolved through kube-dns", func() (bool, error) {
		addrs, err := lookupThroughKubeDNS(ctx, c, "kubernetes.default.svc.cluster.local")
		return err == nil && len(addrs) == 1 && addrs[0] == "10.96.0.1", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("cluster: cold start: CoreDNS back, resolving through kube-dns %v after its Deployment is available\n", time.Since(start).Round(time.Millisecond))
}

// kubernetesServiceAnswers is nil when kube-apiserver answers /readyz through the
// kubernetes Service's cluster IP from the last node (on node-1 it is local; elsewhere
// it crosses the nodes' LAN).
func kubernetesServiceAnswers(ctx context.Context, c *Cluster) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext:     c.Dialer(c.Nodes[len(c.Nodes)-1].NS),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://10.96.0.1/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func lookupThroughKubeDNS(ctx context.Context, c *Cluster, name string) ([]string, error) {
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return c.Dialer(c.Nodes[len(c.Nodes)-1].NS)(ctx, network, net.JoinHostPort(DNSIP, "53"))
	}}
	lookupCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return resolver.LookupHost(lookupCtx, name)
}

// scaleDNS scales CoreDNS to replicas and waits until it has that many pods, available.
func (c *Cluster) scaleDNS(ctx context.Context, t *testing.T, replicas int) {
	t.Helper()
	if _, err := c.Kubectl(ctx, "", "scale", "-n", "kube-system", "deployment/coredns", fmt.Sprintf("--replicas=%d", replicas)); err != nil {
		t.Fatal(err)
	}
	if replicas > 0 {
		if err := c.WaitDeploymentAvailable(ctx, "kube-system", "coredns", 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		return
	}
	err := poll(ctx, time.Minute, "CoreDNS's pods gone", func() (bool, error) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sentinelTables are tables of other components: a table shardproxy's uninstall must not
// touch, and one named like shardproxy's but without its ownership marker.
const sentinelTables = `table ip other-component {
	chain forward { type filter hook forward priority 10; policy accept; }
	set keep { type ipv4_addr; elements = { 192.0.2.1 } }
}
table ip shardproxy-not-ours {
	chain c { ip daddr 192.0.2.2 drop; }
}
`

// TestInstallUpgradeUninstall runs the replace overlay's lifecycle as deploy/README.md
// tells an operator to: install, upgrade to a new image tag (a rolling update of the
// DaemonSet), then uninstall (kubectl delete of the overlay, then deploy/cleanup applied,
// rolled out and deleted, with only the image changed through kustomize). Afterwards no
// table of shardproxy is left on the node and every other table is as it was, including
// one named like shardproxy's without its marker.
func TestInstallUpgradeUninstall(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c.removeShardproxy(ctx, t)
	before := map[*Node]map[string]string{}
	for _, n := range c.Nodes {
		if out, err := n.RunStdin(ctx, sentinelTables, "nft", "-f", "-"); err != nil {
			t.Fatalf("%s: nft -f: %v: %s", n.Name, err, out)
		}
		t.Cleanup(func() {
			for _, table := range []string{"other-component", "shardproxy-not-ours"} {
				_, _ = n.Run(context.Background(), "nft", "delete", "table", "ip", table)
			}
		})
		before[n] = n.otherTables(ctx, t)
	}

	deployReplaceOverlay(ctx, t, c, shardproxyTag)
	if err := c.TagImage(ctx, "localhost/shardproxy:"+shardproxyTag, "localhost/shardproxy:"+shardproxyTag+"-upgrade"); err != nil {
		t.Fatal(err)
	}
	deployReplaceOverlay(ctx, t, c, shardproxyTag+"-upgrade")
	for _, n := range c.Nodes {
		if img := shardproxyPod(ctx, t, c, n).Spec.Containers[0].Image; !strings.HasSuffix(img, ":"+shardproxyTag+"-upgrade") {
			t.Fatalf("after the upgrade the pod on %s runs %s", n.Name, img)
		}
		tables, err := n.NFTTables(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !containsPrefix(tables, "ip shardproxy-default") || !containsPrefix(tables, "ip shardproxy_node") {
			t.Fatalf("installed: %s has %q, want shardproxy-default and shardproxy_node", n.Name, tables)
		}
	}

	yaml, err := RenderOverlay(Overlay{Dir: c.OverlayDir(ReplaceOverlay), Image: "localhost/shardproxy:" + shardproxyTag + "-upgrade", APIServer: true})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.uninstall(ctx, t, yaml, shardproxyTag+"-upgrade")
	took := time.Since(start)
	for _, n := range c.Nodes {
		after := n.otherTables(ctx, t)
		tables, err := n.NFTTables(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, table := range tables {
			if _, name, _ := strings.Cut(table, " "); strings.HasPrefix(name, "shardproxy") && name != "shardproxy-not-ours" {
				t.Errorf("after uninstall %s still has table %s", n.Name, table)
			}
		}
		for name, rules := range before[n] {
			if after[name] != rules {
				t.Errorf("%s: table %s changed by the uninstall:\nbefore:\n%s\nafter:\n%s", n.Name, name, rules, after[name])
			}
		}
		for name := range after {
			if _, ok := before[n][name]; !ok {
				t.Errorf("%s: table %s appeared", n.Name, name)
			}
		}
		fmt.Printf("cluster: install -> upgrade (%s-upgrade) -> uninstall: %s: no shardproxy table left, %d other tables unchanged; uninstall took %v\n", shardproxyTag, n.Name, len(before[n]), took.Round(time.Millisecond))
	}
}

// uninstall deletes the installed overlay's objects, then applies deploy/cleanup with the
// image tag, waits for its rollout and deletes it, as deploy/README.md's steps 2 and 3.
func (c *Cluster) uninstall(ctx context.Context, t *testing.T, overlayYAML []byte, tag string) {
	t.Helper()
	if _, err := c.Kubectl(ctx, string(overlayYAML), "delete", "--wait=true", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	err := poll(ctx, 2*time.Minute, "shardproxy's pod gone", func() (bool, error) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=shardproxy"})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cleanup, err := RenderOverlay(Overlay{Dir: c.OverlayDir("cleanup"), Image: "localhost/shardproxy:" + tag})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, cleanup); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitDaemonSetRolledOut(ctx, "kube-system", "shardproxy-cleanup", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		pod, err := podOn(ctx, c, n, "kube-system", "app.kubernetes.io/name=shardproxy-cleanup")
		if err != nil {
			t.Fatal(err)
		}
		log, err := c.Kubectl(ctx, "", "logs", "-n", "kube-system", pod.Name, "-c", "cleanup")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("cleanup's log on %s:\n%s", n.Name, log)
	}
	if _, err := c.Kubectl(ctx, string(cleanup), "delete", "--wait=true", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// otherTables is the node's ruleset without counters, by table, except shardproxy's own
// (named shardproxy-* or shardproxy_node, other than the sentinel).
func (n *Node) otherTables(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	tables, err := n.NFTTables(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, table := range tables {
		family, name, _ := strings.Cut(table, " ")
		if strings.HasPrefix(name, "shardproxy") && name != "shardproxy-not-ours" {
			continue
		}
		rules, err := n.Run(ctx, "nft", "-s", "list", "table", family, name)
		if err != nil {
			t.Fatal(err)
		}
		out[table] = rules
	}
	return out
}

// TestPortHeldAtStart starts shardproxy (the replace overlay) while another process holds
// its health port on node-1, 10256, as kube-proxy does during a switch, answering /healthz 200 as
// kube-proxy would and anything else 404: the pod must not be Ready (its readiness probe,
// /readyz, reaches the holder), the Node gets the supervisor's event, and once the port
// is freed the supervisor binds it and the pod becomes Ready, never restarted. The other
// nodes' pods start as usual.
func TestPortHeldAtStart(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c.removeShardproxy(ctx, t)
	n1 := c.Node(1)
	holder, readyzProbes, err := holdPort(n1, "0.0.0.0:10256")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	since := time.Now()

	yaml, err := RenderOverlay(Overlay{Dir: c.OverlayDir(ReplaceOverlay), Image: "localhost/shardproxy:" + shardproxyTag, APIServer: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, yaml); err != nil {
		t.Fatal(err)
	}
	// Unready while held: the supervisor has said it cannot listen, and the kubelet has
	// probed the running container twice since.
	var probesAtEvent int64 = -1
	err = poll(ctx, 2*time.Minute, "the event and two readiness probes to the holder", func() (bool, error) {
		if probesAtEvent < 0 && c.nodeEventSince(ctx, n1, "FailedToStartProxierHealthcheck", since) {
			probesAtEvent = readyzProbes.Load()
		}
		return probesAtEvent >= 0 && readyzProbes.Load() >= probesAtEvent+2, nil
	})
	if err != nil {
		t.Fatalf("%v (%d probes); %s", err, readyzProbes.Load(), c.PodSummary(ctx, "kube-system"))
	}
	pod := shardproxyPod(ctx, t, c, n1)
	if podReady(pod) || pod.Status.ContainerStatuses[0].State.Running == nil {
		t.Fatalf("while the port is held: ready %v, running %v; want running, not ready", podReady(pod), pod.Status.ContainerStatuses[0].State.Running != nil)
	}
	heldFor := time.Since(since)

	holder.Close()
	freed := time.Now()
	if _, err := c.WaitDaemonSetRolledOut(ctx, "kube-system", "shardproxy", time.Minute); err != nil {
		t.Fatal(err)
	}
	readyAfter := time.Since(freed)
	if got := probe(ctx, c, n1, "/readyz"); got != http.StatusOK {
		t.Errorf("/readyz of the supervisor answers %d once the port is free, want 200", got)
	}
	if restarts := shardproxyPod(ctx, t, c, n1).Status.ContainerStatuses[0].RestartCount; restarts != 0 {
		t.Errorf("the container restarted %d times, want 0", restarts)
	}
	fmt.Printf("cluster: port 10256 held at start: pod unready for %v (event FailedToStartProxierHealthcheck, %d readiness probes answered by the holder); Ready %v after the port was freed, 0 restarts\n",
		heldFor.Round(time.Second), readyzProbes.Load(), readyAfter.Round(time.Millisecond))
}

// holdPort listens on addr in the node's namespace as kube-proxy would: /healthz answers
// 200, anything else 404. It counts the requests for /readyz.
func holdPort(n *Node, addr string) (*http.Server, *atomic.Int64, error) {
	var l net.Listener
	err := (&netns.Topology{}).Do(n.NS, func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("holding %s: %w", addr, err)
	}
	readyz := &atomic.Int64{}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			readyz.Add(1)
		}
		http.NotFound(w, r)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return srv, readyz, nil
}

// nodeEventSince reports whether node n's Node has an event with reason since the time.
func (c *Cluster) nodeEventSince(ctx context.Context, n *Node, reason string, since time.Time) bool {
	events, err := c.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + n.Name + ",reason=" + reason})
	if err != nil {
		return false
	}
	for _, e := range events.Items {
		last := e.LastTimestamp.Time
		if e.EventTime.After(last) {
			last = e.EventTime.Time
		}
		if !last.Before(since.Truncate(time.Second)) {
			return true
		}
	}
	return false
}
