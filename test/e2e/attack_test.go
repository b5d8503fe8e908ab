package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// The attack suite's namespaces and addresses (env.DefaultInstances): team-a serves the
// attacker's namespace and admits every external IP; team-b, whose slot runs after
// team-a's, serves the victim's namespace and load-balancer IPs of 192.168.202.0/24.
const (
	tenantNS = "tenant"
	victimNS = "victim"
	// victimPort and attackerPort are the ports of the victim's and the attacker's pods.
	victimPort   = 8120
	attackerPort = 8121
	// victimLBIP is the victim's load-balancer IP in team-b's range only, and
	// victimSharedLBIP its load-balancer IP in the range team-a and team-b share.
	victimLBIP       = "192.168.202.10"
	victimSharedLBIP = "192.168.200.61"
	// shadowLBIP is in team-b's range only, written on the attacker's Service.
	shadowLBIP = "192.168.202.11"
	// squatLBIP is in team-b's range only; the tenant claims it first.
	squatLBIP = "192.168.202.20"
	// attackerLBIP is in team-a's own range: the attacker's Service may have it.
	attackerLBIP = "192.168.200.60"
	// nodeSSHPort and nodeSSHPortNoEndpoints are ports the node itself serves on its
	// address (standing in for SSH and the kubelet).
	nodeSSHPort            = 2222
	nodeSSHPortNoEndpoints = 2223
	// kubeletPort is the port node-2 serves on its address (its kubelet).
	kubeletPort = 10250
	// tries is how many connections each victim check opens; unprogrammed addresses
	// (which time out) get fewer.
	tries             = 20
	unprogrammedTries = 4
)

// TestAttack acts as a tenant with edit rights on Services and EndpointSlices in its
// own namespace only (a ServiceAccount with a Role, its token from the TokenRequest API)
// and tries every hijack of issue 18; each attempt must be refused, with real traffic
// showing the victim still reaches its own endpoints and the attacker gets nothing.
func TestAttack(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	tenant := tenantClient(t, e, tenantNS)

	for _, s := range []struct {
		ns, name, proto, addr string
		port                  int
	}{
		{e.TP.Pod1, "victim", "tcp", "", victimPort},
		{e.TP.Remote, "victim", "tcp", "", victimPort},
		{e.TP.Pod2, "attacker", "tcp", "", attackerPort},
		{e.TP.Node, "node", "tcp", netns.NodeIPv4, nodeSSHPort},
		{e.TP.Node, "node", "tcp", netns.NodeIPv4, nodeSSHPortNoEndpoints},
	} {
		stop, err := e.TP.Serve(s.ns, s.name, s.proto, s.addr, s.port, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	victimPorts := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: victimPort}}
	attackerPorts := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: attackerPort}}
	victims := []env.Backend{env.Pod1v4, env.Remotev4}
	attackers := []env.Backend{env.Pod2v4}

	// The tenant's veteran Service, older than every victim: it asks for nothing now, and
	// is later edited to take an address a victim serves.
	veteran, err := e.CreateServiceAs(ctx, tenant, tenantNS, "veteran", attackerPorts, attackers, env.WithProxyName("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	secondPassed(t, veteran)

	// The victims, another tenant's Services (created by the admin): one in team-b, whose
	// rules run after the attacker's instance, one in the attacker's own instance (whose
	// name sorts after the attacker's), and a LoadBalancer in team-b.
	webB := createAsAdmin(t, e, victimNS, "web-b", victimPorts, victims, env.WithProxyName("team-b"))
	webA := createAsAdmin(t, e, victimNS, "web-a", victimPorts, victims, env.WithProxyName("team-a"))
	lbB := createAsAdmin(t, e, victimNS, "lb-b", victimPorts, victims, env.WithProxyName("team-b"), env.WithType(corev1.ServiceTypeLoadBalancer))
	if _, err := e.SetLoadBalancerIngress(ctx, victimNS, "lb-b", victimLBIP, victimSharedLBIP); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{webB.Spec.ClusterIP, webA.Spec.ClusterIP} {
		reach(t, e, e.TP.Pod2, "tcp", ip, 80, "victim")
	}
	reach(t, e, e.TP.Client, "tcp", victimLBIP, 80, "victim")
	reach(t, e, e.TP.Client, "tcp", victimSharedLBIP, 80, "victim")

	// create makes a Service with the tenant's identity; the apiserver checks its rights.
	create := func(t *testing.T, name string, ports []env.ServicePort, backends []env.Backend, edits ...env.ServiceSpec) *corev1.Service {
		t.Helper()
		svc, err := e.CreateServiceAs(ctx, tenant, tenantNS, name, ports, backends, edits...)
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}

	// teamBBarrier returns once team-b has programmed a Service created after the
	// attacker's: had team-b taken the attacker's, it would have programmed it too.
	teamBBarrier := func(t *testing.T, name string) {
		t.Helper()
		svc := createAsAdmin(t, e, victimNS, name, victimPorts, victims, env.WithProxyName("team-b"))
		reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "victim")
	}

	t.Run("externalIP is another tenant's cluster IP", func(t *testing.T) {
		evil := create(t, "evil-cip", attackerPorts, attackers, env.WithProxyName("team-a"),
			env.WithExternalIPs(webB.Spec.ClusterIP, webA.Spec.ClusterIP))
		// The attacker's Service is programmed (then so is what it may have of it).
		reach(t, e, e.TP.Pod2, "tcp", evil.Spec.ClusterIP, 80, "attacker")
		got := tally(t, e, e.TP.Pod2, webB.Spec.ClusterIP, 80, tries)
		got.add(tally(t, e, e.TP.Pod2, webA.Spec.ClusterIP, 80, tries))
		got.expectVictim(t, "externalIP = another tenant's cluster IP", 2*tries)
		waitEvent(t, e, evil, "AddressRefused",
			"externalIP "+webB.Spec.ClusterIP+" refused: it is the cluster IP of victim/web-b",
			"externalIP "+webA.Spec.ClusterIP+" refused: it is the cluster IP of victim/web-a")
		if tableHas(e, "team-a", webB.Spec.ClusterIP) {
			t.Errorf("team-a's table holds victim/web-b's cluster IP %s", webB.Spec.ClusterIP)
		}
	})

	t.Run("externalIP is the node IP on a port the node serves", func(t *testing.T) {
		ssh := []env.ServicePort{{Name: "ssh", Protocol: corev1.ProtocolTCP, Port: nodeSSHPort, TargetPort: attackerPort}}
		sshEmpty := []env.ServicePort{{Name: "ssh", Protocol: corev1.ProtocolTCP, Port: nodeSSHPortNoEndpoints, TargetPort: attackerPort}}
		redirect := create(t, "evil-node", ssh, attackers, env.WithProxyName("team-a"), env.WithExternalIPs(netns.NodeIPv4))
		// Without endpoints, the port would be rejected in the input hook: SSH cut.
		cut := create(t, "evil-node-empty", sshEmpty, nil, env.WithProxyName("team-a"), env.WithExternalIPs(netns.NodeIPv4))
		reach(t, e, e.TP.Pod2, "tcp", redirect.Spec.ClusterIP, nodeSSHPort, "attacker")
		fails(t, e, e.TP.Pod2, "tcp", cut.Spec.ClusterIP, nodeSSHPortNoEndpoints, "no endpoints: refused", refused)
		got := tally(t, e, e.TP.Client, netns.NodeIPv4, nodeSSHPort, tries)
		got.add(tally(t, e, e.TP.Client, netns.NodeIPv4, nodeSSHPortNoEndpoints, tries))
		if got.servers["node"] != 2*tries || got.total() != 2*tries {
			t.Errorf("client -> %s:%d and :%d: %v, want every connection answered by the node's own listener",
				netns.NodeIPv4, nodeSSHPort, nodeSSHPortNoEndpoints, got)
		}
		fmt.Printf("e2e: attack externalIP = node IP (ports %d with endpoints, %d without): %s; node's own listener %d/%d connections, attacker %d\n",
			nodeSSHPort, nodeSSHPortNoEndpoints, verdict(t), got.servers["node"], 2*tries, got.servers["attacker"])
		for _, svc := range []*corev1.Service{redirect, cut} {
			waitEvent(t, e, svc, "AddressRefused", "externalIP "+netns.NodeIPv4+" refused: it is an address of this node")
		}
	})

	t.Run("externalIP is another node's IP", func(t *testing.T) {
		// node-2's Node object lists Node2IPv4; node-2 serves its kubelet port there.
		stop, err := e.TP.Serve(e.TP.Node2, "node-2", "tcp", netns.Node2IPv4, kubeletPort, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		kubelet := []env.ServicePort{{Name: "kubelet", Protocol: corev1.ProtocolTCP, Port: kubeletPort, TargetPort: attackerPort}}
		evil := create(t, "evil-other-node", kubelet, attackers, env.WithProxyName("team-a"), env.WithExternalIPs(netns.Node2IPv4))
		reach(t, e, e.TP.Pod2, "tcp", evil.Spec.ClusterIP, kubeletPort, "attacker")
		// From a pod of this node and from the node itself (its kubelet, its SSH).
		got := tally(t, e, e.TP.Pod1, netns.Node2IPv4, kubeletPort, tries)
		got.add(tally(t, e, e.TP.Node, netns.Node2IPv4, kubeletPort, tries))
		if got.servers["node-2"] != 2*tries || got.total() != 2*tries {
			t.Errorf("pod1 and node -> %s:%d: %v, want every connection answered by node-2's own listener",
				netns.Node2IPv4, kubeletPort, got)
		}
		fmt.Printf("e2e: attack externalIP = another node's IP (port %d): %s; node-2's own listener %d/%d connections, attacker %d\n",
			kubeletPort, verdict(t), got.servers["node-2"], 2*tries, got.servers["attacker"])
		waitEvent(t, e, evil, "AddressRefused", "externalIP "+netns.Node2IPv4+" refused: it is an address of node "+env.Node2Name)
		if tableHas(e, "team-a", netns.Node2IPv4) {
			t.Errorf("team-a's table holds node-2's address %s", netns.Node2IPv4)
		}
	})

	t.Run("load-balancer IP of another tenant or a cluster IP", func(t *testing.T) {
		secondPassed(t, lbB)
		evil := create(t, "evil-lb", attackerPorts, attackers, env.WithProxyName("team-a"), env.WithType(corev1.ServiceTypeLoadBalancer))
		// The tenant cannot write the status itself.
		forged := evil.DeepCopy()
		forged.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: victimLBIP}}
		if _, err := tenant.CoreV1().Services(tenantNS).UpdateStatus(ctx, forged, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("the tenant writing services/status: %v, want Forbidden", err)
		}
		// A compromised or careless load-balancer controller writes it.
		if _, err := e.SetLoadBalancerIngress(ctx, tenantNS, "evil-lb", victimLBIP, victimSharedLBIP, webB.Spec.ClusterIP, attackerLBIP); err != nil {
			t.Fatal(err)
		}
		// The one IP of the attacker's own range is served: the status was read.
		reach(t, e, e.TP.Client, "tcp", attackerLBIP, 80, "attacker")
		got := tally(t, e, e.TP.Client, victimLBIP, 80, tries)
		got.add(tally(t, e, e.TP.Client, victimSharedLBIP, 80, tries))
		got.add(tally(t, e, e.TP.Pod2, webB.Spec.ClusterIP, 80, tries))
		got.expectVictim(t, "load-balancer IP = another tenant's LB IPs and cluster IP", 3*tries)
		waitEvent(t, e, evil, "AddressRefused",
			`load-balancer IP "`+victimLBIP+`" is outside the ranges instance "team-a" allows (tenant.loadBalancerCIDRs)`,
			"load-balancer IP "+victimSharedLBIP+" refused: victim/lb-b claimed it first",
			"load-balancer IP "+webB.Spec.ClusterIP+" refused: it is the cluster IP of victim/web-b")
	})

	t.Run("load-balancer IP outside the instance's range", func(t *testing.T) {
		// Nobody else claims shadowLBIP: only team-a's loadBalancerCIDRs refuse it.
		evil := create(t, "evil-lb-range", attackerPorts, attackers, env.WithProxyName("team-a"), env.WithType(corev1.ServiceTypeLoadBalancer))
		if _, err := e.SetLoadBalancerIngress(ctx, tenantNS, evil.Name, shadowLBIP); err != nil {
			t.Fatal(err)
		}
		reach(t, e, e.TP.Pod2, "tcp", evil.Spec.ClusterIP, 80, "attacker")
		got := tally(t, e, e.TP.Client, shadowLBIP, 80, unprogrammedTries)
		got.expectNothing(t, "load-balancer IP outside tenant.loadBalancerCIDRs")
		waitEvent(t, e, evil, "AddressRefused", `load-balancer IP "`+shadowLBIP+`" is outside the ranges instance "team-a" allows (tenant.loadBalancerCIDRs)`)
	})

	t.Run("squatting another tenant's future address", func(t *testing.T) {
		// Older claims keep an address, so a tenant would claim addresses ahead of their
		// owners: from a Service no instance here serves, and from one whose instance's
		// ranges do not admit the address. Neither claim may count.
		create(t, "squat-elsewhere", attackerPorts, attackers, env.WithProxyName("elsewhere"), env.WithExternalIPs(squatLBIP))
		squat := create(t, "squat-default", attackerPorts, attackers, env.WithExternalIPs(squatLBIP))
		secondPassed(t, squat)
		later := createAsAdmin(t, e, victimNS, "lb-later", victimPorts, victims, env.WithProxyName("team-b"), env.WithType(corev1.ServiceTypeLoadBalancer))
		if _, err := e.SetLoadBalancerIngress(ctx, victimNS, later.Name, squatLBIP); err != nil {
			t.Fatal(err)
		}
		reach(t, e, e.TP.Client, "tcp", squatLBIP, 80, "victim")
		got := tally(t, e, e.TP.Client, squatLBIP, 80, tries)
		got.expectVictim(t, "squatting another tenant's future LB IP", tries)
		waitEvent(t, e, squat, "AddressRefused", `externalIP "`+squatLBIP+`" is outside the ranges instance "default" allows (tenant.externalIPCIDRs)`)
	})

	t.Run("an older Service edited to take an address in use", func(t *testing.T) {
		// victim/lb-b serves victimSharedLBIP (in team-a's range too); the tenant's
		// veteran, created before it, adds it as an externalIP. Ranked by age, the
		// veteran would take it and its traffic; the holder keeps it.
		cur, err := tenant.CoreV1().Services(tenantNS).Get(ctx, veteran.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.ExternalIPs = []string{victimSharedLBIP}
		edited, err := tenant.CoreV1().Services(tenantNS).Update(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cur, err := tenant.CoreV1().Services(tenantNS).Get(ctx, veteran.Name, metav1.GetOptions{})
			if err == nil {
				cur.Spec.ExternalIPs = nil
				_, err = tenant.CoreV1().Services(tenantNS).Update(ctx, cur, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Errorf("giving up the veteran's externalIP: %v", err)
			}
		})
		waitEvent(t, e, edited, "AddressRefused", "externalIP "+victimSharedLBIP+" refused: victim/lb-b claimed it first")
		got := tally(t, e, e.TP.Client, victimSharedLBIP, 80, tries)
		got.expectVictim(t, "an older Service edited to take an address in use", tries)
		// A supervisor starting now sees both claims at once; the holdings its own status
		// recorded before the restart rank them as the running one did.
		if err := e.StopSupervisor(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := e.StartSupervisor(); err != nil {
			t.Fatal(err)
		}
		if err := e.WaitHealthy(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		after := tally(t, e, e.TP.Client, victimSharedLBIP, 80, tries)
		after.expectVictim(t, "an older Service edited to take an address in use, after a restart", tries)
		if !strings.Contains(e.SupervisorLog(), "Seeded address holders from node statuses") {
			t.Errorf("the restarted supervisor did not seed the address holders from the node statuses")
		}
		fmt.Printf("e2e: attack an older Service edited to take an address in use (%s): %s; victim %d/%d connections before a restart, %d/%d after it, attacker %d\n",
			victimSharedLBIP, verdict(t), got.servers["victim"], tries, after.servers["victim"], tries, got.servers["attacker"]+after.servers["attacker"])
	})

	t.Run("externalIP is the API server's endpoint", func(t *testing.T) {
		evil := create(t, "evil-apiserver", attackerPorts, attackers, env.WithProxyName("team-a"), env.WithExternalIPs(env.ControlPlaneIP))
		reach(t, e, e.TP.Pod2, "tcp", evil.Spec.ClusterIP, 80, "attacker")
		waitEvent(t, e, evil, "AddressRefused", "externalIP "+env.ControlPlaneIP+" refused: it is an endpoint of the API server (default/kubernetes)")
		if tableHas(e, "team-a", env.ControlPlaneIP) {
			t.Errorf("team-a's table holds the API server's address %s", env.ControlPlaneIP)
		}
		fmt.Printf("e2e: attack externalIP = the API server's endpoint (%s): %s\n", env.ControlPlaneIP, verdict(t))
	})

	t.Run("Service in a foreign namespace labelled for a guarded instance", func(t *testing.T) {
		evil := create(t, "evil-guarded", attackerPorts, attackers, env.WithProxyName("team-b"))
		teamBBarrier(t, "after-guarded")
		for _, inst := range []string{"default", "team-a", "team-b"} {
			if tableHas(e, inst, evil.Spec.ClusterIP) {
				t.Errorf("%s programs %s/%s", inst, tenantNS, evil.Name)
			}
		}
		got := tally(t, e, e.TP.Pod2, evil.Spec.ClusterIP, 80, unprogrammedTries)
		got.expectNothing(t, "Service in a foreign namespace")
		victim := tally(t, e, e.TP.Pod2, webB.Spec.ClusterIP, 80, tries)
		victim.expectVictim(t, "Service in a foreign namespace labelled for team-b", tries)
		waitEvent(t, e, evil, "ServiceRejected", `instance "team-b" does not accept Services from namespace "tenant"`)
	})

	t.Run("shadow annotation naming another tenant's instance", func(t *testing.T) {
		shadow := func(s *corev1.Service) {
			s.Annotations = map[string]string{selector.AnnotationShadow: "team-b"}
		}
		// Owned by no local instance: the shadow would be its only programmer.
		orphan := create(t, "evil-shadow", attackerPorts, attackers, env.WithProxyName("elsewhere"), shadow)
		// Owned by the tenant's instance, with an LB IP only team-b's range admits: a
		// shadow on team-b would serve it there.
		owned := create(t, "evil-shadow-owned", attackerPorts, attackers, env.WithProxyName("team-a"), shadow,
			env.WithType(corev1.ServiceTypeLoadBalancer))
		if _, err := e.SetLoadBalancerIngress(ctx, tenantNS, owned.Name, shadowLBIP); err != nil {
			t.Fatal(err)
		}
		reach(t, e, e.TP.Pod2, "tcp", owned.Spec.ClusterIP, 80, "attacker")
		teamBBarrier(t, "after-shadow")
		for _, svc := range []*corev1.Service{orphan, owned} {
			if tableHas(e, "team-b", svc.Spec.ClusterIP) {
				t.Errorf("team-b programs %s/%s in shadow", tenantNS, svc.Name)
			}
		}
		if tableHas(e, "team-b", shadowLBIP) || tableHas(e, "team-a", shadowLBIP) {
			t.Errorf("%s is programmed", shadowLBIP)
		}
		got := tally(t, e, e.TP.Pod2, orphan.Spec.ClusterIP, 80, unprogrammedTries)
		got.add(tally(t, e, e.TP.Client, shadowLBIP, 80, unprogrammedTries))
		got.expectNothing(t, "shadow annotation")
		for _, svc := range []*corev1.Service{orphan, owned} {
			waitEvent(t, e, svc, "ServiceRejected", `instance "team-b" does not accept Services from namespace "tenant"`)
		}
	})

	t.Run("writing another node's status", func(t *testing.T) {
		const ns = "shardproxy-system"
		own := migrate.ConfigMapName(env.NodeName)
		var before *corev1.ConfigMap
		testutil.Eventually(t, 20*time.Second, "node-1's status ConfigMap", func() bool {
			var err error
			before, err = e.Client.CoreV1().ConfigMaps(ns).Get(ctx, own, metav1.GetOptions{})
			return err == nil
		})
		forged := func(name string) *corev1.ConfigMap {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Data: map[string]string{"status.json": `{"node":"forged"}`}}
		}
		other := migrate.ConfigMapName(env.Node2Name)
		attempts := map[string]error{}
		_, attempts["create "+other] = tenant.CoreV1().ConfigMaps(ns).Create(ctx, forged(other), metav1.CreateOptions{})
		_, attempts["get "+own] = tenant.CoreV1().ConfigMaps(ns).Get(ctx, own, metav1.GetOptions{})
		update := forged(own)
		update.ResourceVersion = before.ResourceVersion
		_, attempts["update "+own] = tenant.CoreV1().ConfigMaps(ns).Update(ctx, update, metav1.UpdateOptions{})
		_, attempts["patch "+own] = tenant.CoreV1().ConfigMaps(ns).Patch(ctx, own, types.MergePatchType,
			[]byte(`{"data":{"status.json":"{\"node\":\"forged\"}"}}`), metav1.PatchOptions{})
		attempts["delete "+own] = tenant.CoreV1().ConfigMaps(ns).Delete(ctx, own, metav1.DeleteOptions{})
		var names []string
		for what, err := range attempts {
			if !apierrors.IsForbidden(err) {
				t.Errorf("the tenant's %s: %v, want Forbidden", what, err)
			}
			names = append(names, what)
		}
		sort.Strings(names)
		if _, err := e.Client.CoreV1().ConfigMaps(ns).Get(ctx, other, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("node-2's status after the attempts: %v, want NotFound", err)
		}
		after, err := e.Client.CoreV1().ConfigMaps(ns).Get(ctx, own, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(after.Data["status.json"], "forged") {
			t.Errorf("node-1's status was forged: %s", after.Data["status.json"])
		}
		for _, f := range after.ManagedFields {
			if f.Manager != "" && strings.Contains(f.Manager, "tenant") {
				t.Errorf("node-1's status has a field manager %q", f.Manager)
			}
		}
		fmt.Printf("e2e: attack another node's status: %s (%s: want Forbidden); %s absent, %s not written by the tenant\n",
			verdict(t), strings.Join(names, ", "), other, own)
	})

	t.Run("huge Service", func(t *testing.T) {
		hugeServiceAttack(t, e, tenant)
	})

	t.Run("tables named like another component's", func(t *testing.T) {
		foreignTablesSurviveRestart(t, e, webA, webB)
	})
}

// hugeServiceAttack: the tenant creates a Service of 1,000 ports and ten EndpointSlices
// of 100 ports × 1,000 endpoints, far over the per-Service element limit; it is
// refused with a ServiceTooLarge event, and another tenant's new endpoint is programmed
// as fast as without it.
func hugeServiceAttack(t *testing.T, e *env.Env, tenant kubernetes.Interface) {
	ctx := context.Background()
	const (
		hugePorts     = 1000
		slicePorts    = 100
		sliceEndpoint = 1000
		rounds        = 3
		bound         = 5 * time.Second
	)
	stopNew, err := e.TP.Serve(e.TP.Remote, "new-endpoint", "tcp", "", victimPort+5, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopNew)
	stopOld, err := e.TP.Serve(e.TP.Pod1, "victim", "tcp", "", victimPort+5, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopOld)
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: victimPort + 5}}
	// latency creates a Service of the victim's in team-b with one endpoint, then adds
	// one and returns how long until a connection reaches it.
	latency := func(name string) time.Duration {
		t.Helper()
		svc := createAsAdmin(t, e, victimNS, name, ports, []env.Backend{env.Pod1v4}, env.WithProxyName("team-b"))
		reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "victim")
		start := time.Now()
		if err := e.SetEndpoints(ctx, victimNS, name, ports, []env.Backend{env.Pod1v4, env.Remotev4}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "the new endpoint of "+name, func() bool {
			for i := 0; i < 4; i++ {
				if r, err := e.TP.Dial(e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80); err == nil && r.Server == "new-endpoint" {
					return true
				}
			}
			return false
		})
		return time.Since(start)
	}
	var base, during []time.Duration
	for i := range rounds {
		base = append(base, latency(fmt.Sprintf("grow-base-%d", i)))
	}

	// Slices first, then the Service: its owner gets them all at once with it.
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: "huge",
		Labels: map[string]string{selector.LabelServiceProxyName: "team-a"}}}
	for i := range hugePorts {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Protocol: corev1.ProtocolTCP,
			Port: int32(10000 + i), TargetPort: intstr.FromInt32(int32(10000 + i))})
	}
	t.Cleanup(func() {
		_ = e.DeleteService(ctx, tenantNS, "huge")
	})
	created := time.Now()
	for s := range hugePorts / slicePorts {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: fmt.Sprintf("huge-%d", s),
				Labels: map[string]string{discoveryv1.LabelServiceName: "huge"}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		for p := s * slicePorts; p < (s+1)*slicePorts; p++ {
			sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptrTo(fmt.Sprintf("p%d", p)),
				Protocol: ptrTo(corev1.ProtocolTCP), Port: ptrTo(int32(10000 + p))})
		}
		for n := range sliceEndpoint {
			ip := net.IPv4(10, 250, byte(n/250), byte(n%250+1)).String()
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip},
				NodeName: ptrTo(env.Node2Name), Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}})
		}
		if _, err := tenant.DiscoveryV1().EndpointSlices(tenantNS).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	huge, err := tenant.CoreV1().Services(tenantNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uploaded := time.Since(created)
	for i := range rounds {
		during = append(during, latency(fmt.Sprintf("grow-huge-%d", i)))
	}
	fmt.Printf("e2e: attack huge Service: another tenant's new endpoint programmed in %v without it, %v while it arrived (max %v vs %v)\n",
		roundAll(base), roundAll(during), slices.Max(base).Round(time.Millisecond), slices.Max(during).Round(time.Millisecond))
	if m := slices.Max(during); m > bound {
		t.Errorf("another tenant's change took %v with the huge Service, want < %v (without: %v)", m, bound, roundAll(base))
	}
	// Its own instance keeps syncing the tenant's other Services, at once.
	start := time.Now()
	after := createAsAdmin(t, e, tenantNS, "after-huge", []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: attackerPort}},
		[]env.Backend{env.Pod2v4}, env.WithProxyName("team-a"))
	reach(t, e, e.TP.Pod2, "tcp", after.Spec.ClusterIP, 80, "attacker")
	own := time.Since(start)
	if own > bound {
		t.Errorf("team-a took %v to program another Service after the huge one, want < %v", own, bound)
	}
	msg := waitEvent(t, e, huge, "ServiceTooLarge", "over the limit of 200000 per Service (maxServiceElements); not programmed")
	if tableHas(e, "team-a", huge.Spec.ClusterIP) {
		t.Errorf("team-a programs the huge Service")
	}
	fmt.Printf("e2e: attack huge Service (%d ports × %d endpoints in %d EndpointSlices, uploaded in %v): %s (%s); the tenant's next Service on team-a served %v after its creation\n",
		hugePorts, sliceEndpoint, hugePorts/slicePorts, uploaded.Round(time.Millisecond), verdict(t), msg, own.Round(time.Millisecond))
}

// foreignTablesSurviveRestart: tables named like another component's (kube-proxy's, and
// a <prefix>-<name> one without shardproxy's ownership comment) are left alone by the
// orphan cleanup after a restart, which deletes a marked orphan; the victims stay served
// across the restart and, after its full sync, still refuse the attacker's claims.
func foreignTablesSurviveRestart(t *testing.T, e *env.Env, webA, webB *corev1.Service) {
	ctx := context.Background()
	script := strings.Join([]string{
		`add table ip kube-proxy { comment "rules for kube-proxy" ; }`,
		`add chain ip kube-proxy services`,
		`add table ip shardproxy-ghost`,
		`add chain ip shardproxy-ghost keep`,
		`add table ip shardproxy-orphan { comment "` + tables.OwnerComment("orphan", fmt.Sprintf("%s:%d", env.NodeName, env.HealthzPort)) + `" ; }`,
		// Another supervisor's with the same prefix, and one of an earlier version (its
		// marker names no supervisor): not this supervisor's to delete.
		`add table ip shardproxy-neighbour { comment "` + tables.OwnerComment("neighbour", env.NodeName+":10266") + `" ; }`,
		`add table ip shardproxy-legacy { comment "shardproxy instance legacy" ; }`,
	}, "\n")
	if err := e.TP.NFT(e.TP.Node, script); err != nil {
		t.Fatal(err)
	}
	defer e.TP.Exec(e.TP.Node, "nft", "delete", "table", "ip", "kube-proxy")
	defer e.TP.Exec(e.TP.Node, "nft", "delete", "table", "ip", "shardproxy-ghost")
	defer e.TP.Exec(e.TP.Node, "nft", "delete", "table", "ip", "shardproxy-neighbour")
	defer e.TP.Exec(e.TP.Node, "nft", "delete", "table", "ip", "shardproxy-legacy")
	foreign := map[string]string{}
	for _, name := range []string{"kube-proxy", "shardproxy-ghost", "shardproxy-neighbour", "shardproxy-legacy"} {
		out, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", name)
		if err != nil {
			t.Fatal(err)
		}
		foreign[name] = out
	}
	loop := e.StartLoop(e.TP.Pod2, "tcp", webB.Spec.ClusterIP, 80)
	if err := e.StopSupervisor(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := e.StartSupervisor(); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitHealthy(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the orphan cleanup to delete the marked table shardproxy-orphan", func() bool {
		_, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", "shardproxy-orphan")
		return err != nil
	})
	r := loop.Stop()
	for name, before := range foreign {
		after, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", name)
		if err != nil {
			t.Errorf("table ip %s after the restart: %v", name, err)
		} else if after != before {
			t.Errorf("table ip %s changed across the restart:\n%s\nwas:\n%s", name, after, before)
		}
	}
	if r.Failed != 0 || r.OK == 0 || r.Servers["attacker"] != 0 {
		t.Errorf("victim/web-b across the restart: %v; first failures: %v", r, r.Errors)
	}
	// After the restart's full sync the attacker's claims are still refused.
	got := tally(t, e, e.TP.Pod2, webA.Spec.ClusterIP, 80, tries)
	got.add(tally(t, e, e.TP.Client, netns.NodeIPv4, nodeSSHPort, tries))
	if got.servers["attacker"] != 0 || got.failed != 0 {
		t.Errorf("after the restart: %v, want no connection to the attacker and none failed", got)
	}
	fmt.Printf("e2e: attack tables named like another component's (ip kube-proxy, ip shardproxy-ghost) or another supervisor's (ip shardproxy-neighbour, same prefix; ip shardproxy-legacy, an earlier marker): %s; all untouched by the restart's orphan cleanup (this supervisor's shardproxy-orphan deleted); victim %d/%d connections across the restart, attacker %d; after its full sync victim/web-a and the node's port %d/%d, attacker %d\n",
		verdict(t), r.Servers["victim"], r.OK+r.Failed, r.Servers["attacker"], got.total()-got.servers["attacker"]-got.failed, got.total(), got.servers["attacker"])
}

// secondPassed waits until a Service created now would be younger than svc: creation
// timestamps have whole seconds, and within one second the UIDs order claims.
func secondPassed(t *testing.T, svc *corev1.Service) {
	t.Helper()
	testutil.Eventually(t, 3*time.Second, "a second after "+svc.Name+"'s creation", func() bool {
		return time.Now().After(svc.CreationTimestamp.Add(time.Second))
	})
}

// tenantClient creates a ServiceAccount in ns with a Role that may edit only Services
// and EndpointSlices there (no status subresource), and returns a client with its token
// from the TokenRequest API.
func tenantClient(t *testing.T, e *env.Env, ns string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	token, err := e.CP.ServiceAccountToken(ctx, ns, "tenant")
	if err != nil {
		t.Fatal(err)
	}
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "service-editor"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: verbs},
		{APIGroups: []string{discoveryv1.GroupName}, Resources: []string{"endpointslices"}, Verbs: verbs},
	}}
	if _, err := e.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "service-editor"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "tenant"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "service-editor"},
	}
	if _, err := e.Client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(e.CP.RESTConfig())
	cfg.BearerToken = token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the tenant's Role to take effect", func() bool {
		_, err := client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		return err == nil
	})
	if _, err := client.CoreV1().Services(victimNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the tenant listing Services in %s: %v, want Forbidden", victimNS, err)
	}
	return client
}

func createAsAdmin(t *testing.T, e *env.Env, ns, name string, ports []env.ServicePort, backends []env.Backend, edits ...env.ServiceSpec) *corev1.Service {
	t.Helper()
	svc, err := e.CreateService(context.Background(), ns, name, ports, backends, edits...)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// waitEvent waits until svc has events of reason whose messages contain each of want,
// and returns their messages.
func waitEvent(t *testing.T, e *env.Env, svc *corev1.Service, reason string, want ...string) string {
	t.Helper()
	var msgs []string
	testutil.Eventually(t, 20*time.Second, fmt.Sprintf("%s events on %s/%s containing %q", reason, svc.Namespace, svc.Name, want), func() bool {
		list, err := e.Client.CoreV1().Events(svc.Namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + svc.Name + ",reason=" + reason})
		if err != nil {
			return false
		}
		msgs = msgs[:0]
		for _, ev := range list.Items {
			if ev.InvolvedObject.Kind == "Service" && ev.Type == corev1.EventTypeWarning {
				msgs = append(msgs, ev.Message)
			}
		}
		for _, w := range want {
			if !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, w) }) {
				return false
			}
		}
		return true
	})
	sort.Strings(msgs)
	return strings.Join(slices.Compact(msgs), "; ")
}

// counts are who answered connections, and how many failed.
type counts struct {
	servers map[string]int
	failed  int
	lastErr string
	// slowest is the longest an answered connection took, against tryTimeout.
	slowest time.Duration
}

func (c *counts) add(o counts) {
	for s, n := range o.servers {
		c.servers[s] += n
	}
	c.failed += o.failed
	if o.lastErr != "" {
		c.lastErr = o.lastErr
	}
	c.slowest = max(c.slowest, o.slowest)
}

func (c counts) total() int {
	n := c.failed
	for _, v := range c.servers {
		n += v
	}
	return n
}

func (c counts) String() string {
	var parts []string
	for s, n := range c.servers {
		parts = append(parts, fmt.Sprintf("%s=%d", s, n))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d connections: %s, failed %d (last error %s)", c.total(), strings.Join(parts, " "), c.failed, c.lastErr)
}

// expectVictim fails unless all n connections reached the victim, and prints the
// attempt's summary line.
func (c counts) expectVictim(t *testing.T, attack string, n int) {
	t.Helper()
	if c.servers["victim"] != n || c.total() != n {
		t.Errorf("%s: %v, want all %d connections answered by the victim", attack, c, n)
	}
	fmt.Printf("e2e: attack %s: %s; victim %d/%d connections (slowest %v), attacker %d\n", attack, verdict(t), c.servers["victim"], n, c.slowest.Round(10*time.Microsecond), c.servers["attacker"])
}

// expectNothing fails if any connection was answered, and prints the attempt's summary
// line.
func (c counts) expectNothing(t *testing.T, attack string) {
	t.Helper()
	if c.failed != c.total() {
		t.Errorf("%s: %v, want every connection unanswered (nothing programmed)", attack, c)
	}
	fmt.Printf("e2e: attack %s: %s; nothing programmed (%d/%d connections unanswered), attacker %d\n", attack, verdict(t), c.failed, c.total(), c.servers["attacker"])
}

// tryTimeout bounds each of tally's connections. Addresses that are not programmed
// time out, so every unanswered try waits it out; an answered one took up to 270 ms
// in 5 runs of TestAttack beside a conformance run (load average 29-37 on 2 cores;
// the summary lines print each attempt's slowest), so it stays well above that.
const tryTimeout = 700 * time.Millisecond

// tally opens n connections from ns to addr:port and counts who answered.
func tally(t *testing.T, e *env.Env, from, addr string, port, n int) counts {
	t.Helper()
	c := counts{servers: map[string]int{}}
	for range n {
		start := time.Now()
		r, err := e.TP.DialWith(from, "tcp", addr, port, netns.DialOptions{Timeout: tryTimeout})
		if err != nil {
			c.failed++
			c.lastErr = err.Error()
			continue
		}
		c.slowest = max(c.slowest, time.Since(start))
		c.servers[r.Server]++
	}
	return c
}

// verdict is the summary lines' word for how an attempt went so far.
func verdict(t *testing.T) string {
	if t.Failed() {
		return "NOT REFUSED"
	}
	return "refused"
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }
