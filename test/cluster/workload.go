package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Web is a Deployment of agnhost netexec (GET /hostname answers the pod's name) behind a
// NodePort Service named web in its namespace.
type Web struct {
	Namespace string
	// ClusterIP and NodePort of the Service.
	ClusterIP string
	NodePort  int32
}

// DeployWeb creates namespace ns (if needed), the web Deployment with replicas pods and
// its Service, labeled for proxyName when not empty, and waits for the pods.
func (c *Cluster) DeployWeb(ctx context.Context, ns, image, proxyName string, replicas int32) (*Web, error) {
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	d := agnhostDeployment("web", image, replicas, 8080, "--http-port=8080")
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	labels := d.Spec.Selector.MatchLabels
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	if proxyName != "" {
		svc.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": proxyName}
	}
	created, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	if err := c.WaitDeploymentAvailable(ctx, ns, "web", 2*time.Minute); err != nil {
		return nil, err
	}
	return &Web{Namespace: ns, ClusterIP: created.Spec.ClusterIP, NodePort: created.Spec.Ports[0].NodePort}, nil
}

// agnhostDeployment is Deployment name of replicas agnhost netexec pods labelled
// app=name, with netexec's flags, ready once GET /hostname answers on httpPort.
func agnhostDeployment(name, image string, replicas, httpPort int32, flags ...string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: new(int64(1)),
					Containers: []corev1.Container{{
						Name: "agnhost", Image: image, ImagePullPolicy: corev1.PullNever,
						Args:           append([]string{"netexec"}, flags...),
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/hostname", Port: intstr.FromInt32(httpPort)}}, PeriodSeconds: 1},
					}},
				},
			},
		},
	}
}

// Counter counts a client loop's requests.
type Counter struct {
	OK, Failed atomic.Int64
	mu         sync.Mutex
	firstErr   string
	// firstFail and lastFail bound the failures in time, to line them up with logs.
	firstFail, lastFail time.Time
	// failedAt are the times the failed requests were sent (zero: not known), to line
	// them up with what the Service's endpoints were then (ReadyTimeline).
	failedAt []time.Time
	servedBy map[string]int
}

// record counts a request that just ended; recordAt one sent at sent.
func (n *Counter) record(body string, err error) {
	n.recordAt(time.Now(), body, err)
}

func (n *Counter) recordAt(sent time.Time, body string, err error) {
	if err != nil {
		n.Failed.Add(1)
		now := time.Now()
		n.mu.Lock()
		if n.firstErr == "" {
			n.firstErr, n.firstFail = err.Error(), now
		}
		n.lastFail = now
		n.failedAt = append(n.failedAt, sent)
		n.mu.Unlock()
		return
	}
	n.OK.Add(1)
	n.mu.Lock()
	if n.servedBy == nil {
		n.servedBy = map[string]int{}
	}
	n.servedBy[body]++
	n.mu.Unlock()
}

// add counts m's requests in n too.
func (n *Counter) add(m *Counter) {
	m.mu.Lock()
	servedBy, firstErr, failedAt := m.servedBy, m.firstErr, slices.Clone(m.failedAt)
	m.mu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.OK.Add(m.OK.Load())
	n.Failed.Add(m.Failed.Load())
	if n.firstErr == "" {
		n.firstErr = firstErr
	}
	n.failedAt = append(n.failedAt, failedAt...)
	if n.servedBy == nil {
		n.servedBy = map[string]int{}
	}
	for pod, count := range servedBy {
		n.servedBy[pod] += count
	}
}

// String is "OK ok, F failed (first error), served by N pods".
func (n *Counter) String() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := fmt.Sprintf("%d ok, %d failed, served by %d pods", n.OK.Load(), n.Failed.Load(), len(n.servedBy))
	if n.firstErr != "" {
		s += " (first error: " + n.firstErr
		if !n.firstFail.IsZero() {
			s += ", failures from " + n.firstFail.Format("15:04:05.000") + " to " + n.lastFail.Format("15:04:05.000")
		}
		s += ")"
	}
	return s
}

// FailedAt returns the times the failed requests were sent (zero where not known).
func (n *Counter) FailedAt() []time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.failedAt)
}

// ServedBy is the set of pods that answered.
func (n *Counter) ServedBy() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for name := range n.servedBy {
		out = append(out, name)
	}
	return out
}

// Get fetches url from inside namespace ns on a new connection and returns the body.
func (c *Cluster) Get(ctx context.Context, ns, url string) (string, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: c.Dialer(ns), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(body)), nil
}

// Loop sends GET url from inside ns every interval until ctx ends, each on a new
// connection, and counts the answers. Wait for it with the returned function.
func (c *Cluster) Loop(ctx context.Context, ns, url string, interval time.Duration) (*Counter, func()) {
	n := &Counter{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			sent := time.Now()
			body, err := c.Get(context.Background(), ns, url)
			n.recordAt(sent, body, err)
		}
	}()
	return n, func() { <-done }
}

// PodLoop runs a client loop in a pod of its own in ns (not kubectl exec, whose stream a
// containerd restart cuts), wherever the scheduler puts it: count requests of curl to
// url, one every interval. It returns the counter once the pod has finished, from the
// pod's log, each request with the time it was sent (the pod shares the test's clock:
// one kernel).
func (c *Cluster) PodLoop(ctx context.Context, ns, image, url string, count int, interval time.Duration) (*Counter, error) {
	return c.PodLoopOn(ctx, nil, ns, image, url, count, interval)
}

// PodLoopOn is PodLoop with the client pod on node (anywhere if nil).
func (c *Cluster) PodLoopOn(ctx context.Context, node *Node, ns, image, url string, count int, interval time.Duration) (*Counter, error) {
	// -g: an IPv6 address in brackets is an address, not a glob.
	script := fmt.Sprintf(`for i in $(seq 1 %d); do t=$(date +%%s.%%N); if out=$(curl -gsS --max-time 2 %s 2>&1); then echo "ok $t $out"; else echo "fail $t $out"; fi; sleep %.2f; done`, count, url, interval.Seconds())
	var nodeName string
	if node != nil {
		nodeName = node.Name
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "loop-"},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(1)),
			Containers: []corev1.Container{{
				Name: "loop", Image: image, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script},
			}},
		},
	}
	created, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	name := created.Name
	defer func() {
		_ = c.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	}()
	err = poll(ctx, 5*time.Minute, "client loop pod "+name+" done", func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			return true, nil
		case corev1.PodFailed:
			return false, fmt.Errorf("pod %s failed: %s", name, c.PodSummary(ctx, ns))
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	out, err := c.Kubectl(ctx, "", "logs", "-n", ns, name)
	if err != nil {
		return nil, err
	}
	n := &Counter{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		status, rest, _ := strings.Cut(line, " ")
		stamp, rest, _ := strings.Cut(rest, " ")
		sent := parseUnixTime(stamp)
		if status == "ok" {
			n.recordAt(sent, rest, nil)
		} else {
			n.recordAt(sent, "", fmt.Errorf("%s", line))
		}
	}
	if got := n.OK.Load() + n.Failed.Load(); got != int64(count) {
		return nil, fmt.Errorf("pod %s logged %d results, want %d:\n%s", name, got, count, out)
	}
	return n, nil
}

// parseUnixTime reads date +%s.%N; the zero time if it cannot.
func parseUnixTime(s string) time.Time {
	secs, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		return time.Time{}
	}
	var nsec int64
	if frac != "" {
		frac = (frac + "000000000")[:9]
		if nsec, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return time.Time{}
		}
	}
	return time.Unix(sec, nsec)
}

// WaitServedByAll waits until GET url from inside ns has been answered by want distinct
// pods: a Deployment is available before the proxy has programmed all its endpoints (one
// sync period later), and a test that counts must start once it has. It returns how long
// that took.
func (c *Cluster) WaitServedByAll(ctx context.Context, ns, url string, want int) (time.Duration, error) {
	start := time.Now()
	seen := map[string]bool{}
	err := poll(ctx, time.Minute, fmt.Sprintf("%s answered by %d pods", url, want), func() (bool, error) {
		if body, err := c.Get(ctx, ns, url); err == nil {
			seen[body] = true
		}
		return len(seen) >= want, nil
	})
	return time.Since(start), err
}
