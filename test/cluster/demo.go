package cluster

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shardproxy/shardproxy/test/e2e/demo"
)

// ThreeInstances is the replace overlay's configuration with two tenant instances added,
// as `make demo` runs them: the default instance serves unlabeled Services, team-a and
// team-b their own labeled ones in their namespaces; team-a also serves load-balancer
// IPs of the demo's range.
const ThreeInstances = `apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
masqueradeBit: 14
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
instances:
- name: default
  default: true
  slot: 0
  detectLocal: {mode: NodeCIDR}
- name: team-a
  proxyNames: [team-a]
  slot: 1
  tenant: {namespaces: [team-a], loadBalancerCIDRs: [192.168.200.0/24]}
  detectLocal: {mode: NodeCIDR}
- name: team-b
  proxyNames: [team-b]
  slot: 2
  tenant: {namespaces: [team-b]}
  detectLocal: {mode: NodeCIDR}
`

// Demo is `make demo`'s Services (test/e2e/demo.Samples) on the cluster's node, served by
// shardproxy's DaemonSet, with agnhost pods behind them and a client pod.
type Demo struct {
	c *Cluster
	// clientPod is the address of the client pod, whose agnhost dials for the report.
	clientPod string
	// namespaces are the demo's, deleted by Close.
	namespaces []string
}

// demoClientNS holds the client pod.
const demoClientNS = "demo-client"

// StartDemo applies the replace overlay with the image, the API server endpoint and
// ThreeInstances set through kustomize, creates the demo's Services with Deployments of
// agnhost behind them (image agnhost) and a client pod, writes the load-balancer
// ingress a cloud would, routes it from the outside namespace to the node, and waits
// until the pods are available. Close removes what it created, except the DaemonSet.
func (c *Cluster) StartDemo(ctx context.Context, image, agnhost string) (*Demo, error) {
	d := &Demo{c: c}
	o := Overlay{Dir: c.OverlayDir(ReplaceOverlay), Image: image, APIServer: true, Config: ThreeInstances}
	if _, err := c.ApplyOverlay(ctx, o, "shardproxy", 3*time.Minute); err != nil {
		return d, err
	}
	if _, err := c.InExt(ctx, "ip", "route", "replace", demo.LBIP, "via", c.Nodes[0].IP); err != nil {
		return d, err
	}
	for _, s := range demo.Samples() {
		if err := d.createSample(ctx, s, agnhost); err != nil {
			return d, fmt.Errorf("demo Service %s/%s: %w", s.NS, s.Name, err)
		}
	}
	if err := d.createNamespace(ctx, demoClientNS); err != nil {
		return d, err
	}
	if err := c.createDeployment(ctx, demoClientNS, "client", agnhost, 1); err != nil {
		return d, err
	}
	for _, s := range demo.Samples() {
		if len(s.Backends) == 0 {
			continue
		}
		if err := c.WaitDeploymentAvailable(ctx, s.NS, s.Name, 2*time.Minute); err != nil {
			return d, err
		}
	}
	if err := c.WaitDeploymentAvailable(ctx, demoClientNS, "client", 2*time.Minute); err != nil {
		return d, err
	}
	pods, err := c.Client.CoreV1().Pods(demoClientNS).List(ctx, metav1.ListOptions{LabelSelector: "app=client"})
	if err != nil || len(pods.Items) != 1 {
		return d, fmt.Errorf("the demo's client pod: %v, %v", pods, err)
	}
	d.clientPod = pods.Items[0].Status.PodIP
	return d, nil
}

// createSample creates s's namespace, a Deployment of up to two agnhost pods (none for a
// Service without endpoints) and the Service, its ports the demo's, selecting the pods.
func (d *Demo) createSample(ctx context.Context, s demo.Sample, agnhost string) error {
	if err := d.createNamespace(ctx, s.NS); err != nil {
		return err
	}
	if len(s.Backends) > 0 {
		if err := d.c.createDeployment(ctx, s.NS, s.Name, agnhost, int32(min(len(s.Backends), 2))); err != nil {
			return err
		}
	}
	svc := s.Spec()
	svc.Name = s.Name
	svc.Spec.Selector = map[string]string{"app": s.Name}
	for _, p := range demo.Ports() {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, TargetPort: intstr.FromInt32(p.TargetPort)})
	}
	if s.Label != "" {
		svc.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": s.Label}
	}
	created, err := d.c.Client.CoreV1().Services(s.NS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if s.LBIP == "" {
		return nil
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: s.LBIP}}
	_, err = d.c.Client.CoreV1().Services(s.NS).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

func (d *Demo) createNamespace(ctx context.Context, ns string) error {
	_, err := d.c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	d.namespaces = append(d.namespaces, ns)
	return nil
}

// createDeployment creates Deployment name of replicas agnhost netexec pods labelled
// app=name, answering HTTP and UDP on the demo's target port, on node-1: the outside's
// routes to the load-balancer IP lead there, and `make demo`'s table is one node's
// (externalTrafficPolicy Local keeps the client's address on the node of the endpoint).
func (c *Cluster) createDeployment(ctx context.Context, ns, name, image string, replicas int32) error {
	port := strconv.Itoa(demo.TargetPort)
	dep := agnhostDeployment(name, image, replicas, demo.TargetPort, "--http-port="+port, "--udp-port="+port)
	dep.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: c.Nodes[0].Name}
	_, err := c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{})
	return err
}

// Close deletes the demo's namespaces (and waits for them to go) and the route to the
// load-balancer address.
func (d *Demo) Close(ctx context.Context) error {
	for _, ns := range d.namespaces {
		if err := d.c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	_, _ = d.c.InExt(ctx, "ip", "route", "del", demo.LBIP)
	return poll(ctx, 2*time.Minute, "the demo's namespaces gone", func() (bool, error) {
		for _, ns := range d.namespaces {
			if _, err := d.c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
}
