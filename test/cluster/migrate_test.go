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

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/controlplane"
)

// proxyNameLabel is the label a Service names its proxy with.
const proxyNameLabel = "service.kubernetes.io/service-proxy-name"

// TestMigrateBesideKubeProxyDaemonSet runs upstream kube-proxy v1.36.3 (iptables mode) as
// a DaemonSet of its own on every node, from an image built offline, with the alongside
// overlay beside it on every node, and takes an unlabeled Service with endpoints on every
// node through the per-Service path of docs/migration.md across the fleet, under client
// loops from every node, the outside and pods on every node, none of which may fail:
// first with the last node's shardproxy stopped (its pod removed by the node selector),
// `shardproxy migrate move` must fail, naming that node, and leave the Service where it
// was; then, with it back, the move must wait for every node's confirmation (its output
// names them) and `migrate rollback` hand the Service back to kube-proxy on every node.
// After each step only the proxy that owns the Service has rules for it, on every node.
func TestMigrateBesideKubeProxyDaemonSet(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c.removeShardproxy(ctx, t)
	cli := c.shardproxyCLI(ctx, t)
	c.startKubeProxyDaemonSet(ctx, t, nil)
	t.Cleanup(func() { c.removeShardproxy(context.Background(), t) })
	// shardproxy runs on the nodes labelled for it (every node, to begin with), so that
	// one node's can be stopped alone, without a rolling update of the others.
	for _, n := range c.Nodes {
		c.labelNode(ctx, t, n, serviceProxyLabel, "shardproxy")
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			c.labelNode(context.Background(), t, n, serviceProxyLabel, "")
		}
	})
	applyOverlay(ctx, t, c, Overlay{
		Dir: c.OverlayDir(AlongsideOverlay), Image: "localhost/shardproxy:" + shardproxyTag,
		NodeSelector: map[string]string{serviceProxyLabel: "shardproxy"},
	})
	// The alongside overlay's "migration" instance serves proxy name shardproxy in
	// namespace default.
	t.Cleanup(func() {
		_ = c.Client.AppsV1().Deployments("default").Delete(context.Background(), "web", metav1.DeleteOptions{})
		_ = c.Client.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{})
	})
	web := c.spreadWeb(ctx, t, "default", "", 2)
	migrate := func(args ...string) (string, error) {
		full := append([]string{"--net=/run/netns/" + c.Node(1).NS, cli, "migrate"}, args[0], "--kubeconfig", c.Kubeconfig)
		full = append(append(full, args[1:]...), "default/web")
		out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput()
		t.Logf("shardproxy migrate %s:\n%s", strings.Join(args, " "), out)
		return string(out), err
	}
	var nodeNames []string
	for _, n := range c.Nodes {
		nodeNames = append(nodeNames, n.Name)
	}
	// "on 2 node(s) (node-1, node-2)": the move and the rollback waited for every node.
	everyNode := fmt.Sprintf("on %d node(s) (%s)", len(c.Nodes), strings.Join(nodeNames, ", "))

	if len(c.Nodes) >= 2 {
		stopped := c.Nodes[len(c.Nodes)-1]
		c.labelNode(ctx, t, stopped, serviceProxyLabel, "")
		err := poll(ctx, 2*time.Minute, "shardproxy's pod gone from "+stopped.Name, func() (bool, error) {
			pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=shardproxy", FieldSelector: "spec.nodeName=" + stopped.Name})
			return err == nil && len(pods.Items) == 0, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		took, counters := c.fleetLoops(ctx, t, web, func() {
			out, err := migrate("move", "--to", "shardproxy", "--timeout", "10s")
			if err == nil {
				t.Errorf("migrate move succeeded with %s's shardproxy stopped", stopped.Name)
			}
			if !strings.Contains(out, stopped.Name+": ") {
				t.Errorf("migrate move with %s's shardproxy stopped does not name it:\n%s", stopped.Name, out)
			}
		})
		svc, err := c.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{proxyNameLabel, selector.LabelShadow} {
			if v, ok := svc.Labels[key]; ok {
				t.Errorf("after the blocked move the Service has label %s=%q, want none", key, v)
			}
		}
		if v, ok := svc.Annotations[selector.AnnotationShadow]; ok {
			t.Errorf("after the blocked move the Service has annotation %s=%q, want none", selector.AnnotationShadow, v)
		}
		c.waitOwner(ctx, t, web.ClusterIP, "kube-proxy")
		reportLoops(t, fmt.Sprintf("migrate move with %s's shardproxy stopped (blocked, %v)", stopped.Name, took.Round(time.Millisecond)), counters)
		c.labelNode(ctx, t, stopped, serviceProxyLabel, "shardproxy")
		if err := c.waitShardproxyReadyOn(ctx, stopped, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	for _, step := range []struct {
		args  []string
		label string
		owner string
	}{
		{[]string{"move", "--to", "shardproxy"}, "shardproxy", "shardproxy"},
		{[]string{"rollback", "--from", "shardproxy", "--legacy-timeout", "2m"}, "", "kube-proxy"},
	} {
		took, counters := c.fleetLoops(ctx, t, web, func() {
			out, err := migrate(step.args...)
			if err != nil {
				t.Fatalf("shardproxy migrate %s: %v\n%s", strings.Join(step.args, " "), err, out)
			}
			if !strings.Contains(out, everyNode) {
				t.Errorf("shardproxy migrate %s did not wait for every node (%q):\n%s", step.args[0], everyNode, out)
			}
		})
		svc, err := c.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := svc.Labels[proxyNameLabel]; got != step.label {
			t.Errorf("after migrate %s the Service's proxy name is %q, want %q", step.args[0], got, step.label)
		}
		c.waitOwner(ctx, t, web.ClusterIP, step.owner)
		if _, failed := reportLoops(t, fmt.Sprintf("migrate %s beside a kube-proxy DaemonSet, %d nodes (%v)", step.args[0], len(c.Nodes), took.Round(time.Millisecond)), counters); failed > 0 {
			c.dumpProxies(ctx, t, web)
		}
	}
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
// address as kubeadm's kubeconfig has it) on the nodes nodeSelector selects (nil: every
// node) and waits for it; at the end of the test it is deleted and its rules cleaned up
// on every node (kube-proxy --cleanup).
func (c *Cluster) startKubeProxyDaemonSet(ctx context.Context, t *testing.T, nodeSelector map[string]string) {
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
	ds := kubeProxyDaemonSet(image)
	ds.Spec.Template.Spec.NodeSelector = nodeSelector
	if _, err := c.Client.AppsV1().DaemonSets("kube-system").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
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
		pods, err := c.kubeProxyPods(ctx, nil)
		return err == nil && len(pods) == 0, nil
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

// kubeProxyPods lists the pods of startKubeProxyDaemonSet's DaemonSet, on node n (nil:
// anywhere). The label k8s-app=kube-proxy alone is not enough: the replace overlay gives
// shardproxy's pods that label too (deploy/overlays/replace-kube-proxy).
func (c *Cluster) kubeProxyPods(ctx context.Context, n *Node) ([]corev1.Pod, error) {
	opts := metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy"}
	if n != nil {
		opts.FieldSelector = "spec.nodeName=" + n.Name
	}
	pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, opts)
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "DaemonSet" && ref.Name == "kube-proxy" {
			out = append(out, p)
		}
	}
	return out, nil
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
