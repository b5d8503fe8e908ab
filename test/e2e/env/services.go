package env

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WithType sets the Service type (NodePort, LoadBalancer).
func WithType(t corev1.ServiceType) ServiceSpec {
	return func(s *corev1.Service) { s.Spec.Type = t }
}

// WithExternalLocal sets externalTrafficPolicy Local.
func WithExternalLocal() ServiceSpec {
	return func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
}

// WithExternalIPs sets spec.externalIPs.
func WithExternalIPs(ips ...string) ServiceSpec {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

// WithSourceRanges sets spec.loadBalancerSourceRanges.
func WithSourceRanges(cidrs ...string) ServiceSpec {
	return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = cidrs }
}

// WithClientIPAffinity sets sessionAffinity ClientIP with the default timeout.
func WithClientIPAffinity() ServiceSpec {
	return func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }
}

// WithDualStack asks for a cluster IP in both families.
func WithDualStack() ServiceSpec {
	return func(s *corev1.Service) {
		p := corev1.IPFamilyPolicyRequireDualStack
		s.Spec.IPFamilyPolicy = &p
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}
}

// SetLoadBalancerIngress writes status.loadBalancer.ingress, as a cloud controller would.
func (e *Env) SetLoadBalancerIngress(ctx context.Context, ns, name string, ips ...string) (*corev1.Service, error) {
	svc, err := e.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	svc.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	updated, err := e.Client.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("setting the load-balancer status of %s/%s: %w", ns, name, err)
	}
	return updated, nil
}

// UpdateService applies edits to the current Service.
func (e *Env) UpdateService(ctx context.Context, ns, name string, edits ...ServiceSpec) (*corev1.Service, error) {
	svc, err := e.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for _, ed := range edits {
		ed(svc)
	}
	return e.Client.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
}

// DeleteService deletes a Service and its EndpointSlices.
func (e *Env) DeleteService(ctx context.Context, ns, name string) error {
	if err := e.Client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	return e.Client.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + name})
}
