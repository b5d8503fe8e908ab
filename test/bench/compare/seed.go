package compare

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/shardproxy/shardproxy/test/bench/gen"
)

// The etcd the control plane runs, inside its namespace (test/controlplane), and the
// most operations one etcd transaction may hold (etcd's --max-txn-ops default).
const (
	etcdURL       = "http://127.0.0.1:2379"
	etcdTxnOps    = 128
	storagePrefix = "/registry"
)

// etcdSeeder writes API objects into the control plane's etcd as the apiserver stores
// them (protobuf, under /registry), through etcd's JSON gateway.
type etcdSeeder struct {
	http *http.Client
	pb   *protobuf.Serializer
	now  metav1.Time
}

func newEtcdSeeder(dial func(ctx context.Context, network, address string) (net.Conn, error)) *etcdSeeder {
	return &etcdSeeder{
		http: &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: dial}},
		pb:   protobuf.NewSerializer(nil, nil),
		now:  metav1.Now(),
	}
}

// seedEtcd writes c's Services (with their cluster IPs' IPAddress objects) and
// EndpointSlices straight into etcd, and the NodePorts they hold into the apiserver's
// NodePort allocation, so that its repair loop finds nothing to repair. The apiserver
// serves them from its watch of etcd as if they had been created through it; the
// proxies list and watch them, and every measured change still goes through the
// apiserver. At 100,000 Services this takes minutes where creating them through an
// apiserver that gets half a core of a busy 2-core machine takes over an hour.
//
// The addresses and NodePorts are written first: the apiserver's IP repair controller
// reconciles each Service as it arrives, and would otherwise find its IPAddress missing
// and try to create it (a burst of errors and retries in the apiserver while the proxy
// is measured).
func seedEtcd(ctx context.Context, s *etcdSeeder, c *gen.Cluster, clients int) error {
	ports, err := s.nodePortAllocation(c)
	if err != nil {
		return err
	}
	if err := s.put(ctx, []keyValue{ports}); err != nil {
		return err
	}
	for _, objects := range []func(*gen.Cluster, int) ([]keyValue, error){s.addressObjects, s.serviceObjects} {
		if err := s.putAll(ctx, c, clients, objects); err != nil {
			return err
		}
	}
	return nil
}

// putAll writes the objects of every Service of c, etcdTxnOps at most per transaction.
func (s *etcdSeeder) putAll(ctx context.Context, c *gen.Cluster, clients int, objects func(*gen.Cluster, int) ([]keyValue, error)) error {
	const perTxn = etcdTxnOps / 2 // Services per transaction: up to two objects each
	batches := (len(c.Services) + perTxn - 1) / perTxn
	return parallel(ctx, batches, clients, func(b int) error {
		var kvs []keyValue
		for i := b * perTxn; i < min((b+1)*perTxn, len(c.Services)); i++ {
			objs, err := objects(c, i)
			if err != nil {
				return err
			}
			kvs = append(kvs, objs...)
		}
		return s.put(ctx, kvs)
	})
}

type keyValue struct {
	key   string
	value []byte
}

// serviceObjects are Service i of c and its EndpointSlice, as stored.
func (s *etcdSeeder) serviceObjects(c *gen.Cluster, i int) ([]keyValue, error) {
	svc := c.Services[i].DeepCopy()
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	s.stamp(&svc.ObjectMeta)
	// What the apiserver defaults on create.
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
	if svc.Spec.SessionAffinity == "" {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	if svc.Spec.InternalTrafficPolicy == nil {
		svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(true)
	}
	slice := c.Slices[i].DeepCopy()
	slice.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
	s.stamp(&slice.ObjectMeta)
	onThisNode(slice.Endpoints)
	return s.encode(
		stored{fmt.Sprintf("%s/services/specs/%s/%s", storagePrefix, svc.Namespace, svc.Name), svc},
		stored{fmt.Sprintf("%s/endpointslices/%s/%s", storagePrefix, slice.Namespace, slice.Name), slice})
}

// addressObjects are the IPAddress of Service i's cluster IP, as the apiserver's
// allocator stores it.
func (s *etcdSeeder) addressObjects(c *gen.Cluster, i int) ([]keyValue, error) {
	svc := c.Services[i]
	family := "IPv4"
	if netip.MustParseAddr(svc.Spec.ClusterIP).Is6() {
		family = "IPv6"
	}
	ip := &networkingv1.IPAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"},
		ObjectMeta: metav1.ObjectMeta{Name: svc.Spec.ClusterIP, Labels: map[string]string{
			networkingv1.LabelIPAddressFamily: family,
			networkingv1.LabelManagedBy:       "ipallocator.k8s.io",
		}},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: svc.Namespace, Name: svc.Name}},
	}
	s.stamp(&ip.ObjectMeta)
	return s.encode(stored{fmt.Sprintf("%s/ipaddresses/%s", storagePrefix, ip.Name), ip})
}

// stored is an object and its etcd key.
type stored struct {
	key string
	obj runtime.Object
}

// encode encodes objects as the apiserver stores them.
func (s *etcdSeeder) encode(objs ...stored) ([]keyValue, error) {
	out := make([]keyValue, 0, len(objs))
	for _, o := range objs {
		var b bytes.Buffer
		if err := s.pb.Encode(o.obj, &b); err != nil {
			return nil, fmt.Errorf("encoding %s: %w", o.key, err)
		}
		out = append(out, keyValue{o.key, b.Bytes()})
	}
	return out, nil
}

// stamp sets what the apiserver sets on create (the resource version is etcd's).
func (s *etcdSeeder) stamp(m *metav1.ObjectMeta) {
	m.ResourceVersion = ""
	m.UID = types.UID(uuid.NewUUID())
	m.CreationTimestamp = s.now
}

// nodePortAllocation is the apiserver's NodePort allocation (a bitmap over
// gen.NodePortRange, as its allocator stores it) holding every NodePort of c.
func (s *etcdSeeder) nodePortAllocation(c *gen.Cluster) (keyValue, error) {
	lo, hi, _ := strings.Cut(gen.NodePortRange, "-")
	base, err := strconv.Atoi(lo)
	if err != nil {
		return keyValue{}, err
	}
	top, err := strconv.Atoi(hi)
	if err != nil {
		return keyValue{}, err
	}
	bits := new(big.Int)
	for _, svc := range c.Services {
		for _, p := range gen.NodePorts(svc) {
			bits.SetBit(bits, int(p)-base, 1)
		}
	}
	ra := &corev1.RangeAllocation{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "RangeAllocation"},
		ObjectMeta: metav1.ObjectMeta{Name: "", CreationTimestamp: s.now},
		Range:      fmt.Sprintf("%d-%d", base, top),
		Data:       bits.Bytes(),
	}
	kv, err := s.encode(stored{storagePrefix + "/ranges/servicenodeports", ra})
	if err != nil {
		return keyValue{}, err
	}
	return kv[0], nil
}

// put writes kvs in one etcd transaction.
func (s *etcdSeeder) put(ctx context.Context, kvs []keyValue) error {
	type put struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	type op struct {
		RequestPut put `json:"request_put"`
	}
	ops := make([]op, len(kvs))
	for i, kv := range kvs {
		ops[i] = op{put{base64.StdEncoding.EncodeToString([]byte(kv.key)), base64.StdEncoding.EncodeToString(kv.value)}}
	}
	body, err := json.Marshal(map[string]any{"success": ops})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, etcdURL+"/v3/kv/txn", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("etcd transaction of %d puts: %w", len(kvs), err)
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || bytes.Contains(reply, []byte(`"error"`)) {
		return fmt.Errorf("etcd transaction of %d puts: %s: %s", len(kvs), resp.Status, reply)
	}
	return nil
}

// waitServed waits until the apiserver lists n Services and n EndpointSlices in
// gen.Namespace (its watch of etcd has caught up with the seeding).
func waitServed(ctx context.Context, client kubernetes.Interface, n int) error {
	count := func(list func(metav1.ListOptions) (int64, int, error)) (int, error) {
		rem, items, err := list(metav1.ListOptions{Limit: 1})
		return int(rem) + items, err
	}
	services := func(o metav1.ListOptions) (int64, int, error) {
		l, err := client.CoreV1().Services(gen.Namespace).List(ctx, o)
		if err != nil {
			return 0, 0, err
		}
		return ptr.Deref(l.RemainingItemCount, 0), len(l.Items), nil
	}
	slices := func(o metav1.ListOptions) (int64, int, error) {
		l, err := client.DiscoveryV1().EndpointSlices(gen.Namespace).List(ctx, o)
		if err != nil {
			return 0, 0, err
		}
		return ptr.Deref(l.RemainingItemCount, 0), len(l.Items), nil
	}
	for {
		ns, err1 := count(services)
		ne, err2 := count(slices)
		if err1 == nil && err2 == nil && ns >= n && ne >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the apiserver serves %d Services and %d EndpointSlices of %d (%v, %v): %w", ns, ne, n, err1, err2, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
