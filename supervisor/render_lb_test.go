package supervisor

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/supervisor/config"
)

// TestRenderLoadBalancing: render shows each Service's load-balancing rules: the
// instance's mode, a mode the instance allows where a Service asks for it, and the
// instance's mode, with a problem, where it asks for one the instance does not allow.
func TestRenderLoadBalancing(t *testing.T) {
	cfg, err := config.Decode([]byte(`apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
nodeName: node-1
instances:
- name: team-a
  proxyNames: [team-a]
  slot: 1
  tenant: {namespaces: [a]}
  loadBalancing: {mode: consistentHash, allowedModes: [roundRobin]}
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultWith(func(string) string { return "" }, func() (string, error) { return "node-1", nil })
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var services []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	for i, ask := range []string{"", "roundRobin", "sourceHash"} {
		name := []string{"plain", "rr", "sh"}[i]
		ip := []string{"172.30.0.21", "172.30.0.22", "172.30.0.23"}[i]
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name,
				Labels: map[string]string{"service.kubernetes.io/service-proxy-name": "team-a"}},
			Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		}
		if ask != "" {
			svc.Annotations = map[string]string{instance.LoadBalancingAnnotation: ask}
		}
		services = append(services, svc)
		port := int32(8080)
		slices = append(slices, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "a", Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Port: &port}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.2"}}, {Addresses: []string{"10.244.2.2"}}},
		})
	}
	script, problems, err := Render(cfg, "team-a", RenderInput{Services: services, Slices: slices})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"service-ips { 172.30.0.21 . tcp . 80 : goto pick-ch-256 }",
		"service-ips { 172.30.0.22 . tcp . 80 : goto rr-",
		"service-ips { 172.30.0.23 . tcp . 80 : goto pick-ch-256 }",
		"jhash ip saddr & 255.255.255.0 mod 128 seed 0x1f2e3d4c vmap { 0 : goto ch-rotation-0 ,",
		"dnat ip to @nh,120,8 ^ 0xe . ip daddr . meta l4proto . th dport map @ch-slots",
		"numgen inc mod 2 vmap @round-robin-picks",
		"round-robin-picks { 1 : goto pick-at-1 }",
		"numgen random mod 1 offset 1 map @endpoints-tcp",
		"ch-slots { 255 . 172.30.0.21 . tcp . 80 : ",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("render lacks %q", want)
		}
	}
	if len(problems) != 1 || !strings.Contains(problems[0], "a/sh: annotation shardproxy.io/load-balancing: sourceHash is not allowed") {
		t.Errorf("problems %q; want a/sh's refused annotation", problems)
	}
}
