package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// corefile serves cluster.local from the API and nothing else (nothing outside is
// reachable to forward to).
const corefile = `.:53 {
    errors
    health {
        lameduck 2s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
    loadbalance
}
`

// startDNS runs CoreDNS as kubeadm does (a Deployment in kube-system behind the kube-dns
// Service at DNSIP), except that it reaches kube-apiserver directly rather than through
// the kubernetes Service: it must work before any Service proxy runs on the node.
func (c *Cluster) startDNS(ctx context.Context) error {
	tag := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(c.dnsArchive), "coredns-"), ".tar")
	image := "localhost/coredns:" + tag
	const ns, name = "kube-system", "coredns"
	labels := map[string]string{"k8s-app": "kube-dns"}
	client := c.Client
	objs := []func() error{
		func() error {
			_, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
					{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
				},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
				Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Data:       map[string]string{"Corefile": corefile},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.AppsV1().Deployments(ns).Create(ctx, dnsDeployment(image, labels), metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Labels: labels},
				Spec: corev1.ServiceSpec{
					Selector:  labels,
					ClusterIP: DNSIP,
					Ports: []corev1.ServicePort{
						{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
						{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
					},
				},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objs {
		if err := create(); err != nil {
			return err
		}
	}
	return c.WaitDeploymentAvailable(ctx, ns, name, 2*time.Minute)
}

func dnsDeployment(image string, labels map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: "coredns",
					DNSPolicy:          corev1.DNSDefault,
					PriorityClassName:  "system-cluster-critical",
					Containers: []corev1.Container{{
						Name:            "coredns",
						Image:           image,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"-conf", "/etc/coredns/Corefile"},
						Env: []corev1.EnvVar{
							{Name: "KUBERNETES_SERVICE_HOST", Value: APIServerIP},
							{Name: "KUBERNETES_SERVICE_PORT", Value: strconv.Itoa(APIPort)},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns"}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
							PeriodSeconds: 1,
						},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"}},
					}}},
				},
			},
		},
	}
}

// WaitDeploymentAvailable waits until every replica of the Deployment is available.
func (c *Cluster) WaitDeploymentAvailable(ctx context.Context, ns, name string, timeout time.Duration) error {
	var last string
	err := poll(ctx, timeout, fmt.Sprintf("Deployment %s/%s available", ns, name), func() (bool, error) {
		if err := c.childrenRunning(); err != nil {
			return false, err
		}
		d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		last = fmt.Sprintf("%d/%d available", d.Status.AvailableReplicas, want)
		return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want && d.Status.AvailableReplicas == want, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s); %s", err, last, c.PodSummary(ctx, ns))
	}
	return nil
}

// PodSummary describes the pods of ns and their waiting reasons, for error messages.
func (c *Cluster) PodSummary(ctx context.Context, ns string) string {
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s", p.Name, p.Status.Phase)
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			switch {
			case cs.State.Waiting != nil:
				fmt.Fprintf(&b, " [%s waiting: %s %s]", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			case cs.State.Terminated != nil:
				fmt.Fprintf(&b, " [%s terminated: %s %d]", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
			default:
				fmt.Fprintf(&b, " [%s ready=%v restarts=%d]", cs.Name, cs.Ready, cs.RestartCount)
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Status != corev1.ConditionTrue && cond.Message != "" {
				fmt.Fprintf(&b, " (%s: %s)", cond.Type, cond.Message)
			}
		}
		b.WriteString("; ")
	}
	return b.String()
}
