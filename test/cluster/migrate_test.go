package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shardproxy/shardproxy/test/controlplane"
)

// proxyNameLabel is the label a Service names its proxy with.
const proxyNameLabel = "service.kubernetes.io/service-proxy-name"

// TestMigrateBesideKubeProxyDaemonSet runs upstream kube-proxy v1.36.3 (iptables mode) as
// a DaemonSet of its own, from an image built offline, with the alongside overlay beside
// it, and moves an unlabeled Service from kube-proxy to shardproxy's instance with
// `shardproxy migrate move`, then back with `migrate rollback`, under client loops from
// the node, the outside and a pod: no request may fail, and after each step only the
// proxy that owns the Service has rules for it.
func TestMigrateBesideKubeProxyDaemonSet(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c.removeShardproxy(ctx, t)
	cli := c.shardproxyCLI(ctx, t)
	c.startKubeProxyDaemonSet(ctx, t)
	t.Cleanup(func() { c.removeShardproxy(context.Background(), t) })
	applyOverlay(ctx, t, c, Overlay{Dir: c.OverlayDir(AlongsideOverlay), Image: "localhost/shardproxy:" + shardproxyTag})
	// The alongside overlay's "migration" instance serves proxy name shardproxy in
	// namespace default.
	web, err := c.DeployWeb(ctx, "default", agnhostImage, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.AppsV1().Deployments("default").Delete(context.Background(), "web", metav1.DeleteOptions{})
		_ = c.Client.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{})
	})
	if _, err := c.WaitServedByAll(ctx, c.Node(1).NS, "http://"+web.ClusterIP+"/hostname", 2); err != nil {
		t.Fatal(err)
	}

	for _, step := range []struct {
		args  []string
		label string
		owner string
	}{
		{[]string{"move", "--to", "shardproxy"}, "shardproxy", "shardproxy"},
		{[]string{"rollback", "--from", "shardproxy", "--legacy-timeout", "2m"}, "", "kube-proxy"},
	} {
		took, counters := c.underLoops(ctx, t, web, func() {
			args := append([]string{"--net=/run/netns/" + c.Node(1).NS, cli, "migrate"}, step.args[0], "--kubeconfig", c.Kubeconfig)
			args = append(append(args, step.args[1:]...), "default/web")
			out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
			if err != nil {
				t.Fatalf("shardproxy migrate %s: %v\n%s", strings.Join(step.args, " "), err, out)
			}
			t.Logf("shardproxy migrate %s:\n%s", strings.Join(step.args, " "), out)
		})
		svc, err := c.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := svc.Labels[proxyNameLabel]; got != step.label {
			t.Errorf("after migrate %s the Service's proxy name is %q, want %q", step.args[0], got, step.label)
		}
		c.waitOwner(ctx, t, web.ClusterIP, step.owner)
		failed := false
		for name, n := range counters {
			failed = failed || n.Failed.Load() > 0
			fmt.Printf("cluster: migrate %-8s beside a kube-proxy DaemonSet (%v): %-22s %s\n", step.args[0], took.Round(time.Millisecond), name, n)
			if n.Failed.Load() > 0 || n.OK.Load() == 0 {
				t.Errorf("migrate %s: %s: %s; want every request answered", step.args[0], name, n)
			}
		}
		if failed {
			c.dumpProxies(ctx, t, web)
		}
	}
}

// underLoops runs step under client loops to web from node-1 (ClusterIP), the outside
// (node-1's NodePort) and a pod (DNS name), which go on until the step is done, and
// returns how long the step took and each loop's counter.
func (c *Cluster) underLoops(ctx context.Context, t *testing.T, web *Web, step func()) (time.Duration, map[string]*Counter) {
	t.Helper()
	loopCtx, stop := context.WithCancel(ctx)
	n1 := c.Node(1)
	node, waitNode := c.Loop(loopCtx, n1.NS, "http://"+web.ClusterIP+"/hostname", 20*time.Millisecond)
	outside, waitOutside := c.Loop(loopCtx, c.ExtNS, fmt.Sprintf("http://%s:%d/hostname", n1.IP, web.NodePort), 20*time.Millisecond)
	podDone := make(chan *Counter, 1)
	stepDone := make(chan struct{})
	go func() {
		// Pod loops of 100 requests one after the other until the step is done.
		total := &Counter{}
		defer func() { podDone <- total }()
		for {
			n, err := c.PodLoop(loopCtx, web.Namespace, agnhostImage, "http://web."+web.Namespace+".svc.cluster.local/hostname", 100, 50*time.Millisecond)
			if err != nil {
				total.record("", err)
				return
			}
			total.add(n)
			select {
			case <-stepDone:
				return
			default:
			}
		}
	}()
	start := time.Now()
	step()
	took := time.Since(start)
	close(stepDone)
	pod := <-podDone
	stop()
	waitNode()
	waitOutside()
	return took, map[string]*Counter{"node -> ClusterIP": node, "outside -> NodePort": outside, "pod -> DNS name": pod}
}

// waitOwner waits until on every node only owner ("shardproxy" or "kube-proxy") has
// rules for ip.
func (c *Cluster) waitOwner(ctx context.Context, t *testing.T, ip, owner string) {
	t.Helper()
	for _, n := range c.Nodes {
		var kubeProxy, shardproxy bool
		err := poll(ctx, time.Minute, ip+" served by "+owner+" only on "+n.Name, func() (bool, error) {
			kp, err := n.Run(ctx, "iptables-save", "-t", "nat")
			if err != nil {
				return false, err
			}
			sp, err := n.Run(ctx, "nft", "list", "table", "ip", "shardproxy-migration")
			if err != nil {
				return false, err
			}
			kubeProxy, shardproxy = containsWord(kp, ip), containsWord(sp, ip)
			return kubeProxy == (owner == "kube-proxy") && shardproxy == (owner == "shardproxy"), nil
		})
		if err != nil {
			t.Errorf("%v: kube-proxy has rules for it: %v, shardproxy: %v", err, kubeProxy, shardproxy)
		}
	}
}

// shardproxyCLI builds the shardproxy binary for commands an operator runs (migrate).
func (c *Cluster) shardproxyCLI(ctx context.Context, t *testing.T) string {
	t.Helper()
	bin := filepath.Join(c.Dir, "shardproxy")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/shardproxy")
	cmd.Dir = c.opts.RepoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/shardproxy: %v: %s", err, out)
	}
	return bin
}

// startKubeProxyDaemonSet runs upstream kube-proxy in iptables mode as a DaemonSet (its
// image built offline, its ServiceAccount bound to system:node-proxier, the apiserver by
// address as kubeadm's kubeconfig has it) and waits for it; at the end of the test it is
// deleted and its rules cleaned up (kube-proxy --cleanup).
func (c *Cluster) startKubeProxyDaemonSet(ctx context.Context, t *testing.T) {
	t.Helper()
	images, err := BuildImages(ctx, c.opts.RepoRoot, nil, "kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ImportImage(ctx, "kube-proxy", images["kube-proxy"]); err != nil {
		t.Fatal(err)
	}
	image := "localhost/kube-proxy:" + controlplane.KubernetesVersion
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Namespace: "kube-system"}}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-kube-proxy"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "kube-proxy", Namespace: "kube-system"}},
	}
	if _, err := c.Client.CoreV1().ServiceAccounts("kube-system").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Client.AppsV1().DaemonSets("kube-system").Create(ctx, kubeProxyDaemonSet(image), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.removeKubeProxyDaemonSet(t) })
	if _, err := c.WaitDaemonSetRolledOut(ctx, "kube-system", "kube-proxy", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) removeKubeProxyDaemonSet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = c.Client.AppsV1().DaemonSets("kube-system").Delete(ctx, "kube-proxy", metav1.DeleteOptions{})
	_ = c.Client.RbacV1().ClusterRoleBindings().Delete(ctx, "test-kube-proxy", metav1.DeleteOptions{})
	_ = c.Client.CoreV1().ServiceAccounts("kube-system").Delete(ctx, "kube-proxy", metav1.DeleteOptions{})
	err := poll(ctx, time.Minute, "kube-proxy's pod gone", func() (bool, error) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy"})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Error(err)
	}
	bin, err := controlplane.KubeProxyBinary(ctx, nil)
	if err != nil {
		t.Error(err)
		return
	}
	for _, n := range c.Nodes {
		if out, err := n.Run(ctx, bin, "--cleanup"); err != nil {
			t.Errorf("%s: kube-proxy --cleanup: %v: %s", n.Name, err, out)
		}
	}
}

// kubeProxyDaemonSet is kubeadm's kube-proxy DaemonSet in short: host network,
// privileged, the node's xtables lock, flags instead of a configuration file.
func kubeProxyDaemonSet(image string) *appsv1.DaemonSet {
	labels := map[string]string{"k8s-app": "kube-proxy"}
	hostPathType := corev1.HostPathFileOrCreate
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Namespace: "kube-system", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork:        true,
					ServiceAccountName: "kube-proxy",
					PriorityClassName:  "system-node-critical",
					Tolerations:        []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "kube-proxy", Image: image, ImagePullPolicy: corev1.PullNever,
						Args: []string{
							"--proxy-mode=iptables", "--hostname-override=$(NODE_NAME)", "--cluster-cidr=" + strings.Join(ClusterCIDRs, ","),
							// The node's conntrack table is the host's: leave its sysctls alone.
							"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
							"--v=2",
						},
						Env: []corev1.EnvVar{
							{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
							{Name: "KUBERNETES_SERVICE_HOST", Value: APIServerIP},
							{Name: "KUBERNETES_SERVICE_PORT", Value: fmt.Sprint(APIPort)},
						},
						SecurityContext: &corev1.SecurityContext{Privileged: new(true)},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(10256)}},
							PeriodSeconds: 2,
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "xtables-lock", MountPath: "/run/xtables.lock"}},
					}},
					Volumes: []corev1.Volume{{Name: "xtables-lock", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/xtables.lock", Type: &hostPathType}}}},
				},
			},
		},
	}
}

// dumpProxies logs both proxies' recent logs on node-1 and its rules for web, for a
// failure.
func (c *Cluster) dumpProxies(ctx context.Context, t *testing.T, web *Web) {
	t.Helper()
	n1 := c.Node(1)
	for _, name := range []string{"app.kubernetes.io/name=shardproxy", "k8s-app=kube-proxy"} {
		pod, err := podOn(ctx, c, n1, "kube-system", name)
		if err != nil {
			t.Logf("%s: %v", name, err)
			continue
		}
		logs, _ := c.Kubectl(ctx, "", "logs", "-n", "kube-system", pod.Name, "--since=3m", "--timestamps")
		t.Logf("%s's log:\n%s", pod.Name, logs)
	}
	c.dumpServing(ctx, t, web)
	rules, _ := n1.Run(ctx, "iptables-save")
	for _, line := range strings.Split(rules, "\n") {
		if strings.Contains(line, web.ClusterIP) || strings.Contains(line, "REJECT") {
			t.Logf("iptables: %s", line)
		}
	}
}
