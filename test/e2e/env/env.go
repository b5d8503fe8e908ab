// Package env builds the end-to-end environment: a control plane (etcd + kube-apiserver)
// in a namespace of its own, a node namespace running the real `shardproxy run` binary
// with a ServiceAccount bound to deploy/'s ClusterRole, and the test topology of
// test/netns (client, pods on this node, a second node with a remote pod). The e2e suite
// and `make demo` both use it.
package env

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/netns"
)

// Addresses of the control-plane link (inside namespaces the environment creates).
const (
	ControlPlaneIP = "172.29.0.1"
	// NodeControlPlaneIP is the node's address on the control-plane link: the source of
	// the supervisor's API connections.
	NodeControlPlaneIP = "172.29.0.2"
	// NodeName and Node2Name are the Node objects of the two nodes.
	NodeName  = "node-1"
	Node2Name = "node-2"
	// Zone of node-1.
	Zone = "zone-a"
	// HealthzPort and MetricsPort are the supervisor's ports inside the node namespace.
	HealthzPort = 10256
	MetricsPort = 10249
)

// Options configure an environment.
type Options struct {
	// RepoRoot is the repository (for deploy/ and building the binary).
	RepoRoot string
	// Binary is a prebuilt shardproxy; empty builds one into WorkDir.
	Binary string
	// WorkDir holds the config, kubeconfig, binary and logs.
	WorkDir string
	// Instances is the instances section of the supervisor config (YAML); default:
	// default (slot 0), team-a (slot 1), team-b (slot 2).
	Instances string
	// Logf reports progress.
	Logf func(format string, args ...any)
	// NoSupervisor writes the supervisor's configuration but does not start it (the
	// caller calls StartSupervisor).
	NoSupervisor bool
	// ExtraAPIServerArgs are appended to kube-apiserver's flags.
	ExtraAPIServerArgs []string
	// ExtraConfig are node-wide fields (YAML lines) added to the supervisor's config.
	ExtraConfig string
	// SupervisorEnv are variables (KEY=value) added to the supervisor's environment, e.g.
	// a PATH whose nft is a fault-injecting wrapper (the soak).
	SupervisorEnv []string
	// NoLabelMirror turns off the stand-in for the EndpointSlice controller's copy of a
	// Service's labels to its slices (slicelabels.go), for benchmarks that write their
	// slices whole.
	NoLabelMirror bool
	// SupervisorArgs are added to `shardproxy run`'s flags (e.g. a --vmodule).
	SupervisorArgs []string
	// ServiceCIDRs are the apiserver's service CIDRs, IPv4 first (default
	// controlplane.DefaultServiceCIDRs; benchmarks with more Services than a /16 widen
	// them).
	ServiceCIDRs []string
}

// DefaultInstances are three instances: the default one and two teams. The teams serve
// the namespaces the e2e tests and the demo create their labeled Services in; external
// IPs come from 192.168.201.0/24 and load-balancer IPs from 192.168.200.0/24, the
// ranges the tests hand out. For the attack suite (attack_test.go), team-a also serves
// namespaces tenant, the attacker's, and victim, and admits every external IP, as a
// careless operator would: the node-wide address precedence is then all that keeps its tenants off other
// Services' addresses, and its slot runs before team-b's, so without that precedence
// its rules would win. team-b also serves namespace victim and load-balancer IPs of
// 192.168.202.0/24, a range team-a does not have. team-a's Services may ask for
// consistentHash (balance_test.go).
const DefaultInstances = `
- name: default
  default: true
  slot: 0
  minSyncPeriod: 100ms
  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/48"]}
  tenant: {externalIPCIDRs: [192.168.201.0/24], loadBalancerCIDRs: [192.168.200.0/24]}
- name: team-a
  proxyNames: [team-a]
  slot: 1
  minSyncPeriod: 100ms
  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/48"]}
  loadBalancing: {allowedModes: [consistentHash]}
  tenant:
    namespaces: [team-a, balance, cleanup, conntrack, endpoints, features, handover, health, instances, ipv6, restart, tabledel, tenant, victim]
    externalIPCIDRs: [0.0.0.0/0, "::/0"]
    loadBalancerCIDRs: [192.168.200.0/24]
- name: team-b
  proxyNames: [team-b]
  slot: 2
  minSyncPeriod: 100ms
  detectLocal: {mode: InterfaceNamePrefix, interfaceNamePrefix: vpod}
  tenant:
    namespaces: [team-b, cleanup, conntrack, endpoints, features, handover, health, instances, ipv6, restart, tabledel, victim]
    externalIPCIDRs: [192.168.201.0/24]
    loadBalancerCIDRs: [192.168.200.0/24, 192.168.202.0/24]
`

// Env is a running environment.
type Env struct {
	TP     *netns.Topology
	CP     *controlplane.ControlPlane
	Client kubernetes.Interface
	// ConfigPath is the supervisor's configuration file.
	ConfigPath string
	Binary     string
	opts       Options
	cpNS       string
	stopCP     func() error
	stopFns    []func()

	sup *loggedProcess
}

// Start builds the environment and starts the supervisor. Close removes everything.
// On error, Close must still be called on a non-nil Env.
func Start(ctx context.Context, opts Options) (*Env, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.Instances == "" {
		opts.Instances = DefaultInstances
	}
	e := &Env{opts: opts, sup: &loggedProcess{what: "the supervisor", env: opts.SupervisorEnv,
		logPath: filepath.Join(opts.WorkDir, "shardproxy.log")}}
	tp, err := netns.Build()
	e.TP = tp
	if err != nil {
		return e, err
	}
	e.sup.ns = tp.Node
	if err := e.wireControlPlane(); err != nil {
		return e, err
	}
	opts.Logf("starting etcd and kube-apiserver in %s", e.cpNS)
	cp, stop, err := controlplane.StartProcess(ctx, controlplane.Options{
		Netns: e.cpNS, Dial: tp.Dialer(e.cpNS),
		BindAddress: "0.0.0.0", AdvertiseAddress: ControlPlaneIP,
		ServiceCIDRs:       opts.ServiceCIDRs,
		ExtraAPIServerArgs: opts.ExtraAPIServerArgs,
		Progress:           opts.Logf,
	})
	e.CP, e.stopCP = cp, stop
	if err != nil {
		return e, err
	}
	e.Client = cp.Client()
	if err := e.applyRBAC(ctx); err != nil {
		return e, err
	}
	if err := e.createNodes(ctx); err != nil {
		return e, err
	}
	if err := e.mirrorServiceLabels(); err != nil {
		return e, err
	}
	if e.Binary = opts.Binary; e.Binary == "" {
		e.Binary = filepath.Join(opts.WorkDir, "shardproxy")
		opts.Logf("building shardproxy")
		cmd := exec.Command("go", "build", "-o", e.Binary, "./cmd/shardproxy")
		cmd.Dir = opts.RepoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			return e, fmt.Errorf("building shardproxy: %w: %s", err, out)
		}
	}
	kubeconfig, err := cp.ServiceAccountKubeconfig(ctx, "kube-system", "shardproxy")
	if err != nil {
		return e, err
	}
	e.ConfigPath = filepath.Join(opts.WorkDir, "shardproxy.yaml")
	cfg := fmt.Sprintf(`apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
nodeName: %s
kubeconfig: %s
healthzBindAddress: 0.0.0.0:%d
metricsBindAddress: 0.0.0.0:%d
# The teams share namespaces and address ranges on purpose: the tests move Services
# between them and attack across them, so the node-wide rules decide, not validation.
sharedTenants: true
%s
instances:%s`, NodeName, kubeconfig, HealthzPort, MetricsPort, opts.ExtraConfig, indent(opts.Instances))
	if err := os.WriteFile(e.ConfigPath, []byte(cfg), 0o644); err != nil {
		return e, err
	}
	if opts.NoSupervisor {
		return e, nil
	}
	if err := e.StartSupervisor(); err != nil {
		return e, err
	}
	return e, e.WaitHealthy(ctx, time.Minute)
}

func indent(s string) string {
	return "\n" + strings.TrimLeft(s, "\n")
}

// wireControlPlane adds the control plane's namespace, linked to the node.
func (e *Env) wireControlPlane() error {
	ns, err := e.TP.AddNamespace("cp")
	if err != nil {
		return err
	}
	e.cpNS = ns
	cmds := [][]string{
		{"ip", "link", "add", "cp0", "netns", ns, "type", "veth", "peer", "name", "cp0", "netns", e.TP.Node},
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %w: %s", c, err, out)
		}
	}
	for _, step := range []struct {
		ns   string
		args []string
	}{
		{ns, []string{"ip", "link", "set", "lo", "up"}},
		{ns, []string{"ip", "addr", "add", ControlPlaneIP + "/24", "dev", "cp0"}},
		{ns, []string{"ip", "link", "set", "cp0", "up"}},
		{e.TP.Node, []string{"ip", "addr", "add", NodeControlPlaneIP + "/24", "dev", "cp0"}},
		{e.TP.Node, []string{"ip", "link", "set", "cp0", "up"}},
	} {
		if out, err := e.TP.Exec(step.ns, step.args...); err != nil {
			return fmt.Errorf("wiring the control plane: %w: %s", err, out)
		}
	}
	return nil
}

// applyRBAC creates deploy/base/rbac.yaml's objects (ServiceAccount, ClusterRole and
// binding, the node-status namespace and Role), so
// the supervisor runs with exactly the permissions a deployment grants.
func (e *Env) applyRBAC(ctx context.Context) error {
	data, err := os.ReadFile(filepath.Join(e.opts.RepoRoot, "deploy", "base", "rbac.yaml"))
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj struct {
			Kind string `json:"kind"`
		}
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if raw == nil {
			continue
		}
		obj.Kind, _ = raw["kind"].(string)
		js, err := jsonOf(raw)
		if err != nil {
			return err
		}
		switch obj.Kind {
		case "ServiceAccount":
			var sa corev1.ServiceAccount
			if err := fromJSON(js, &sa); err != nil {
				return err
			}
			_, err = e.Client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &sa, metav1.CreateOptions{})
		case "ClusterRole":
			var cr rbacv1.ClusterRole
			if err := fromJSON(js, &cr); err != nil {
				return err
			}
			_, err = e.Client.RbacV1().ClusterRoles().Create(ctx, &cr, metav1.CreateOptions{})
		case "ClusterRoleBinding":
			var crb rbacv1.ClusterRoleBinding
			if err := fromJSON(js, &crb); err != nil {
				return err
			}
			_, err = e.Client.RbacV1().ClusterRoleBindings().Create(ctx, &crb, metav1.CreateOptions{})
		case "Namespace":
			var ns corev1.Namespace
			if err := fromJSON(js, &ns); err != nil {
				return err
			}
			_, err = e.Client.CoreV1().Namespaces().Create(ctx, &ns, metav1.CreateOptions{})
		case "Role":
			var r rbacv1.Role
			if err := fromJSON(js, &r); err != nil {
				return err
			}
			_, err = e.Client.RbacV1().Roles(r.Namespace).Create(ctx, &r, metav1.CreateOptions{})
		case "RoleBinding":
			var rb rbacv1.RoleBinding
			if err := fromJSON(js, &rb); err != nil {
				return err
			}
			_, err = e.Client.RbacV1().RoleBindings(rb.Namespace).Create(ctx, &rb, metav1.CreateOptions{})
		default:
			return fmt.Errorf("deploy/base/rbac.yaml: unexpected kind %q", obj.Kind)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("applying %s: %w", obj.Kind, err)
		}
	}
}

func (e *Env) createNodes(ctx context.Context) error {
	nodes := []*corev1.Node{
		{
			ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{corev1.LabelTopologyZone: Zone}},
			Spec:       corev1.NodeSpec{PodCIDR: netns.NodePodCIDRv4, PodCIDRs: []string{netns.NodePodCIDRv4, netns.NodePodCIDRv6}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: netns.NodeIPv4}, {Type: corev1.NodeInternalIP, Address: netns.NodeIPv6}}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: Node2Name, Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}},
			Spec:       corev1.NodeSpec{PodCIDR: netns.Node2PodCIDRv4, PodCIDRs: []string{netns.Node2PodCIDRv4, netns.Node2PodCIDRv6}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: netns.Node2IPv4}, {Type: corev1.NodeInternalIP, Address: netns.Node2IPv6}}},
		},
	}
	for _, n := range nodes {
		created, err := e.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", n.Name, err)
		}
		// Addresses live in the status subresource.
		created.Status = n.Status
		if _, err := e.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting node %s addresses: %w", n.Name, err)
		}
	}
	return nil
}

// StartSupervisor starts `shardproxy run` in the node namespace.
func (e *Env) StartSupervisor() error {
	return e.sup.start(append([]string{e.Binary, "run", "--config", e.ConfigPath, "--v", "2"}, e.opts.SupervisorArgs...)...)
}

// ControlPlaneNamespace is the network namespace etcd and kube-apiserver run in.
func (e *Env) ControlPlaneNamespace() string { return e.cpNS }

// SupervisorPid is the process id of the running supervisor (ip netns exec execs it in
// place), or 0.
func (e *Env) SupervisorPid() int { return e.sup.pid() }

// StopSupervisor stops the supervisor with sig (SIGTERM, or SIGKILL for a crash) and
// waits for it to exit.
func (e *Env) StopSupervisor(sig syscall.Signal) error { return e.sup.stop(sig) }

// SupervisorLog returns the supervisor's log so far.
func (e *Env) SupervisorLog() string { return e.sup.log() }

// HTTPGet fetches a URL from inside the node namespace (the supervisor's servers).
func (e *Env) HTTPGet(ctx context.Context, url string) (int, string, error) {
	return e.HTTPGetFrom(ctx, e.TP.Node, url)
}

// HTTPGetFrom fetches a URL from inside namespace ns.
func (e *Env) HTTPGetFrom(ctx context.Context, ns, url string) (int, string, error) {
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DialContext: e.TP.Dialer(ns), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// WaitHealthy waits until the supervisor's /healthz answers 200.
func (e *Env) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	return e.sup.waitHealthy(ctx, timeout, fmt.Sprintf("http://127.0.0.1:%d/healthz", HealthzPort), e.HTTPGet)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Close stops the supervisor and the control plane and deletes every namespace. The
// supervisor's tables go with the node namespace.
func (e *Env) Close() error {
	var errs []error
	errs = append(errs, e.StopSupervisor(syscall.SIGTERM))
	for i := len(e.stopFns) - 1; i >= 0; i-- {
		e.stopFns[i]()
	}
	if e.stopCP != nil {
		errs = append(errs, e.stopCP())
	}
	if e.TP != nil {
		errs = append(errs, e.TP.Close())
	}
	return errors.Join(errs...)
}

// OnClose registers a function Close runs (servers of the demo).
func (e *Env) OnClose(f func()) { e.stopFns = append(e.stopFns, f) }

// ServicePort describes one port of a test Service.
type ServicePort struct {
	Name       string
	Protocol   corev1.Protocol
	Port       int32
	TargetPort int32
	NodePort   int32
}

// Backend is one endpoint of a test Service: a pod's address on a node.
type Backend struct {
	IP       string
	NodeName string
	// NotReady marks the endpoint not ready.
	NotReady bool
}

// The pods of the topology, as backends.
var (
	Pod1v4   = Backend{IP: netns.Pod1IPv4, NodeName: NodeName}
	Pod2v4   = Backend{IP: netns.Pod2IPv4, NodeName: NodeName}
	Remotev4 = Backend{IP: netns.RemoteIPv4, NodeName: Node2Name}
	Pod1v6   = Backend{IP: netns.Pod1IPv6, NodeName: NodeName}
	Remotev6 = Backend{IP: netns.RemoteIPv6, NodeName: Node2Name}
)

// ServiceSpec edits a Service before it is created.
type ServiceSpec func(*corev1.Service)

// WithProxyName labels the Service for an instance.
func WithProxyName(name string) ServiceSpec {
	return func(s *corev1.Service) {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[selector.LabelServiceProxyName] = name
	}
}

// CreateService creates a Service with the given ports and its EndpointSlices (one per
// family present among the backends).
func (e *Env) CreateService(ctx context.Context, ns, name string, ports []ServicePort, backends []Backend, edits ...ServiceSpec) (*corev1.Service, error) {
	if err := e.ensureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	return e.CreateServiceAs(ctx, e.Client, ns, name, ports, backends, edits...)
}

// CreateServiceAs is CreateService with another identity's client (a tenant's), in a
// namespace that exists.
func (e *Env) CreateServiceAs(ctx context.Context, client kubernetes.Interface, ns, name string, ports []ServicePort, backends []Backend, edits ...ServiceSpec) (*corev1.Service, error) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort,
			TargetPort: intstr.FromInt32(p.TargetPort),
		})
	}
	for _, ed := range edits {
		ed(svc)
	}
	created, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating Service %s/%s: %w", ns, name, err)
	}
	return created, e.SetEndpointsAs(ctx, client, ns, name, ports, backends)
}

// SetEndpoints replaces the EndpointSlices of a Service (one per family).
func (e *Env) SetEndpoints(ctx context.Context, ns, name string, ports []ServicePort, backends []Backend) error {
	return e.SetEndpointsAs(ctx, e.Client, ns, name, ports, backends)
}

// SetEndpointsAs is SetEndpoints with another identity's client.
func (e *Env) SetEndpointsAs(ctx context.Context, client kubernetes.Interface, ns, name string, ports []ServicePort, backends []Backend) error {
	labels := map[string]string{discoveryv1.LabelServiceName: name}
	if svc, err := e.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		labels = sliceLabels(svc, name, nil) // as the EndpointSlice controller writes them
	}
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%s", name, strings.ToLower(string(fam))),
				Labels: labels},
			AddressType: fam,
		}
		for _, p := range ports {
			sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr(p.Name), Protocol: ptr(p.Protocol), Port: ptr(p.TargetPort)})
		}
		for _, b := range backends {
			ip := net.ParseIP(b.IP)
			if (ip.To4() != nil) != (fam == discoveryv1.AddressTypeIPv4) {
				continue
			}
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{b.IP},
				NodeName:   ptr(b.NodeName),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(!b.NotReady)},
			})
		}
		// The label mirror may update the slice in between (a conflict).
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := client.DiscoveryV1().EndpointSlices(ns).Get(ctx, sl.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, err = client.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{})
			case err == nil:
				sl.ResourceVersion = cur.ResourceVersion
				_, err = client.DiscoveryV1().EndpointSlices(ns).Update(ctx, sl, metav1.UpdateOptions{})
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("writing EndpointSlice %s/%s: %w", ns, sl.Name, err)
		}
	}
	return nil
}

// Relabel sets (or, with "", removes) a Service's proxy-name label.
func (e *Env) Relabel(ctx context.Context, ns, name, proxyName string) error {
	svc, err := e.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if svc.Labels == nil {
		svc.Labels = map[string]string{}
	}
	if proxyName == "" {
		delete(svc.Labels, selector.LabelServiceProxyName)
	} else {
		svc.Labels[selector.LabelServiceProxyName] = proxyName
	}
	_, err = e.Client.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
	return err
}

func (e *Env) ensureNamespace(ctx context.Context, ns string) error {
	_, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
