package controlplane

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdlatest "k8s.io/client-go/tools/clientcmd/api/latest"
	"k8s.io/utils/ptr"

	"github.com/shardproxy/shardproxy/test/testutil"
)

func TestKubernetesVersionMatchesToolsModule(t *testing.T) {
	script, err := findBuildScript()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(filepath.Dir(script))
	got, err := toolsVersion(root)
	if err != nil {
		t.Fatalf("reading hack/tools/go.mod: %v", err)
	}
	if got != KubernetesVersion {
		t.Errorf("hack/tools/go.mod builds k8s.io/kubernetes %s, KubernetesVersion is %s", got, KubernetesVersion)
	}
}

// TestControlPlane starts a control plane, uses it as the proxy will (Services,
// EndpointSlices, ServiceCIDRs, a ServiceAccount bound by RBAC), and checks that stopping
// it leaves no process, port or file behind.
func TestControlPlane(t *testing.T) {
	// Cleanups run last-registered first: this one runs after Start's has stopped it.
	var cp *ControlPlane
	t.Cleanup(func() {
		if cp != nil {
			checkStopped(t, cp)
		}
	})
	start := time.Now()
	cp = Start(t)
	t.Logf("control plane started in %v", time.Since(start).Round(time.Millisecond))

	ctx := t.Context()
	client := cp.Client()

	t.Run("default ServiceCIDR covers both families", func(t *testing.T) {
		cidr, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("getting the default ServiceCIDR: %v", err)
		}
		if !slices.Equal(cidr.Spec.CIDRs, DefaultServiceCIDRs) {
			t.Errorf("default ServiceCIDR has %v, want %v", cidr.Spec.CIDRs, DefaultServiceCIDRs)
		}
	})

	t.Run("kubernetes Service exists", func(t *testing.T) {
		if _, err := client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
			t.Errorf("getting default/kubernetes: %v", err)
		}
	})

	t.Run("dual-stack Service and its EndpointSlice", func(t *testing.T) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: metav1.NamespaceDefault},
			Spec: corev1.ServiceSpec{
				IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
				Ports:          []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			},
		}
		svc, err := client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating Service: %v", err)
		}
		if len(svc.Spec.ClusterIPs) != 2 {
			t.Fatalf("Service got ClusterIPs %v, want one per family", svc.Spec.ClusterIPs)
		}
		for i, ip := range svc.Spec.ClusterIPs {
			_, cidr, _ := net.ParseCIDR(DefaultServiceCIDRs[i])
			if !cidr.Contains(net.ParseIP(ip)) {
				t.Errorf("ClusterIPs[%d] = %s, not in %s", i, ip, cidr)
			}
		}

		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name:      "web-ipv4",
				Namespace: svc.Namespace,
				Labels:    map[string]string{discoveryv1.LabelServiceName: svc.Name},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{"10.244.0.5"},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				NodeName:   ptr.To("node-a"),
			}},
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		}
		if _, err := client.DiscoveryV1().EndpointSlices(svc.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating EndpointSlice: %v", err)
		}
		got, err := client.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name,
		})
		if err != nil {
			t.Fatalf("listing EndpointSlices: %v", err)
		}
		if len(got.Items) != 1 || got.Items[0].Endpoints[0].Addresses[0] != "10.244.0.5" {
			t.Errorf("EndpointSlices of %s: %+v, want the one created", svc.Name, got.Items)
		}
	})

	t.Run("ServiceAccount has only what RBAC grants", func(t *testing.T) {
		kubeconfig, err := cp.ServiceAccountKubeconfig(ctx, "shardproxy-system", "shardproxy")
		if err != nil {
			t.Fatal(err)
		}
		saClient := clientFromKubeconfig(t, kubeconfig)
		if _, err := saClient.CoreV1().Services("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("listing Services without a binding: got %v, want Forbidden", err)
		}

		role := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "shardproxy-test"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
			},
		}
		if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating ClusterRole: %v", err)
		}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "shardproxy-test"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{
				{Kind: rbacv1.ServiceAccountKind, Namespace: "shardproxy-system", Name: "shardproxy"},
			},
		}
		if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating ClusterRoleBinding: %v", err)
		}
		// The RBAC authorizer sees new bindings through an informer: soon, not at once.
		err = poll(ctx, func() (bool, error) {
			_, err := saClient.CoreV1().Services("").List(ctx, metav1.ListOptions{})
			if apierrors.IsForbidden(err) {
				return false, nil
			}
			return err == nil, err
		}, "waiting for the binding to allow listing Services")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := saClient.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("listing Secrets, which the role does not grant: got %v, want Forbidden", err)
		}
	})
}

// TestBindAllAddresses checks the options the e2e suite uses to reach kube-apiserver from
// a network namespace: bound to 0.0.0.0 it answers on every host address (127.0.0.2 stands
// in for a veth's), while clients are still given loopback; advertising a host address
// makes that the endpoint of the "kubernetes" Service.
func TestBindAllAddresses(t *testing.T) {
	if testing.Short() {
		testutil.Unavailable(t, "skipping the real control plane in -short mode")
	}
	hostIP := globalIPv4(t)
	if hostIP == "" {
		testutil.Unavailable(t, "this host has no global IPv4 address to advertise")
	}
	ctx := t.Context()
	cp, stop, err := StartProcess(ctx, Options{BindAddress: "0.0.0.0", AdvertiseAddress: hostIP, Progress: t.Logf})
	if errors.Is(err, ErrEtcdNotFound) {
		testutil.Unavailable(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
		checkStopped(t, cp)
	}()
	if want := "https://127.0.0.1:" + strconv.Itoa(cp.Port); cp.Host != want {
		t.Errorf("Host = %s, want %s", cp.Host, want)
	}

	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	defer client.CloseIdleConnections()
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.2:%d/readyz", cp.Port))
	if err != nil {
		t.Fatalf("reaching kube-apiserver on another host address: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz on 127.0.0.2: %s", resp.Status)
	}

	// kube-apiserver publishes itself as the endpoint of default/kubernetes.
	var got []string
	err = poll(ctx, func() (bool, error) {
		list, err := cp.Client().DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=kubernetes",
		})
		if err != nil {
			return false, err
		}
		got = nil
		for _, slice := range list.Items {
			for _, ep := range slice.Endpoints {
				for _, port := range slice.Ports {
					got = append(got, net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(*port.Port))))
				}
			}
		}
		return len(got) > 0, nil
	}, "waiting for the kubernetes Service's EndpointSlice")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{net.JoinHostPort(hostIP, strconv.Itoa(cp.Port))}; !slices.Equal(got, want) {
		t.Errorf("endpoints of default/kubernetes: %v, want %v", got, want)
	}
}

// globalIPv4 returns an IPv4 address of this host outside loopback, or "".
func globalIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range addrs {
		if ipnet, ok := addr.(*net.IPNet); ok && ipnet.IP.To4() != nil && ipnet.IP.IsGlobalUnicast() {
			return ipnet.IP.String()
		}
	}
	return ""
}

// checkStopped fails the test if anything of a stopped control plane remains.
func checkStopped(t *testing.T, cp *ControlPlane) {
	t.Helper()
	for _, pid := range cp.PIDs() {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after stop (kill -0: %v)", pid, err)
		}
	}
	ports, err := listeningPorts()
	if err != nil {
		t.Fatal(err)
	}
	if ports[cp.Port] {
		t.Errorf("port %d is still listening after stop", cp.Port)
	}
	for _, dir := range []string{cp.Dir, cp.etcdDataDir} {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after stop (stat: %v)", dir, err)
		}
	}
}

// listeningPorts returns the TCP ports something listens on, from /proc/net/tcp{,6}.
func listeningPorts() (map[int]bool, error) {
	const listen = "0A"
	ports := map[int]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		scanner := bufio.NewScanner(f)
		for scanner.Scan() {
			fields := strings.Fields(scanner.Text())
			if len(fields) < 4 || fields[3] != listen {
				continue
			}
			_, port, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(port, 16, 32)
			if err == nil {
				ports[int(n)] = true
			}
		}
		f.Close()
		if err := scanner.Err(); err != nil {
			return nil, err
		}
	}
	return ports, nil
}

// clientFromKubeconfig reads a kubeconfig that WriteKubeconfig wrote, with client-go's own
// kubeconfig codec, into a client.
func clientFromKubeconfig(t *testing.T, path string) kubernetes.Interface {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := runtime.Decode(clientcmdlatest.Codec, data)
	if err != nil {
		t.Fatalf("decoding kubeconfig %s: %v", path, err)
	}
	config, ok := obj.(*clientcmdapi.Config)
	if !ok {
		t.Fatalf("kubeconfig %s decoded to %T", path, obj)
	}
	current := config.Contexts[config.CurrentContext]
	if current == nil {
		t.Fatalf("kubeconfig %s has no current context", path)
	}
	cluster, user := config.Clusters[current.Cluster], config.AuthInfos[current.AuthInfo]
	if cluster == nil || user == nil {
		t.Fatalf("kubeconfig %s: context %q names a missing cluster or user", path, config.CurrentContext)
	}
	client, err := kubernetes.NewForConfig(&rest.Config{
		Host:            cluster.Server,
		BearerToken:     user.Token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: cluster.InsecureSkipTLSVerify},
	})
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// toolsVersion reads the k8s.io/kubernetes version that hack/tools/go.mod under root
// requires.
func toolsVersion(root string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "hack", "tools", "go.mod"))
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) == 3 && fields[0] == "require" && fields[1] == "k8s.io/kubernetes" {
			return fields[2], nil
		}
	}
	return "", errors.New("no single-line require of k8s.io/kubernetes")
}
