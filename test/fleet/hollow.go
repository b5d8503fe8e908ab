// Package fleet runs many hollow shardproxy nodes against one control plane and
// measures what they cost it: the real supervisor (watches, dispatcher, instances,
// status publisher, health and metrics servers) with the kernel faked (knftables' Fake,
// a fake conntrack table, health-check node ports that never open a socket), each node
// with its own Node object and its own API client and rate limits, as kubemark's hollow
// nodes are. It is a mode of the test tree, never of the shipped binary.
package fleet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/legacy"
	"github.com/shardproxy/shardproxy/supervisor"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/conntrack"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/tablestest"
	"github.com/shardproxy/shardproxy/test/bench/gen"
)

// DefaultInstance is the one instance every hollow node runs: the default one, serving
// every Service without a service-proxy-name label, as a node's only proxy would.
const DefaultInstance = "default"

// HollowOptions describe one hollow node.
type HollowOptions struct {
	// Name is the node's name; its Node object must exist (the supervisor waits for it).
	Name string
	// Addr is the node's address (InterfaceAddrs).
	Addr netip.Addr
	// Client is the node's own API client.
	Client kubernetes.Interface
	// StatusNamespace holds the node status ConfigMaps; config.StatusDisabled turns them off.
	StatusNamespace string
	// ReserveOtherNodeAddresses is the configuration's reserveOtherNodeAddresses: with it
	// on, every node watches every Node.
	ReserveOtherNodeAddresses bool
	// OtherNodeAddresses is the configuration's otherNodeAddresses: "watch" (every Node,
	// the default) or "published" (the list `shardproxy node-addresses` writes).
	OtherNodeAddresses string
	// Logger receives the supervisor's log lines; default: discarded.
	Logger logr.Logger
	// FullFake keeps every rule and element in knftables' Fake (its Dump is then the
	// ruleset); default: names only (namesOnly), which hundreds of nodes can afford.
	FullFake bool
	// MigrationTarget, when set, adds a second instance of that name serving that proxy
	// name (service-proxy-name) in the generated Services' namespace: the target a
	// `migrate move` hands Services to. It serves no external or load-balancer IPs (no
	// two tenants' ranges may overlap, and the default instance's cover everything); the
	// fleet's Services have none (Prepare drops their load-balancer status).
	MigrationTarget string
}

// HollowNode is one running supervisor with a fake kernel.
type HollowNode struct {
	Name   string
	sup    *supervisor.Supervisor
	tables *fakeTables
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// hollowConfig is the node's configuration: one default instance with the defaults
// (minSyncPeriod 1s, syncPeriod 30s, as kube-proxy) that serves external and load-balancer
// IPs from anywhere, as kube-proxy does (so reserveOtherNodeAddresses has its Node watch
// to make), servers on free loopback ports (set after validation).
func hollowConfig(opts HollowOptions) (*config.Config, error) {
	otherNodeAddresses := opts.OtherNodeAddresses
	if otherNodeAddresses == "" {
		otherNodeAddresses = config.OtherNodeAddressesWatch
	}
	yaml := fmt.Sprintf(`apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
nodeName: %s
statusNamespace: %q
reserveOtherNodeAddresses: %t
otherNodeAddresses: %q
instances:
- name: %s
  default: true
  slot: 0
  tenant: {externalIPCIDRs: [0.0.0.0/0, "::/0"], loadBalancerCIDRs: [0.0.0.0/0, "::/0"]}
`, opts.Name, opts.StatusNamespace, opts.ReserveOtherNodeAddresses, otherNodeAddresses, DefaultInstance)
	if opts.MigrationTarget != "" {
		yaml += fmt.Sprintf(`- name: %[1]s
  proxyNames: [%[1]s]
  slot: 1
  tenant: {namespaces: [%[2]s]}
`, opts.MigrationTarget, gen.Namespace)
	}
	cfg, err := config.Decode([]byte(yaml), opts.Name+".yaml")
	if err != nil {
		return nil, err
	}
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Any free loopback port, which validation refuses in a node's file: many nodes
	// share this host, and the supervisor's servers still run and answer.
	cfg.HealthzBindAddress, cfg.MetricsBindAddress = "127.0.0.1:0", "127.0.0.1:0"
	return cfg, nil
}

// StartHollow starts a hollow node; it runs until ctx ends or Stop.
func StartHollow(ctx context.Context, opts HollowOptions) (*HollowNode, error) {
	if opts.StatusNamespace == "" {
		opts.StatusNamespace = config.DefaultStatusNamespace
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	cfg, err := hollowConfig(opts)
	if err != nil {
		return nil, fmt.Errorf("hollow node %s: %w", opts.Name, err)
	}
	ft := &fakeTables{full: opts.FullFake, fakes: map[string]*knftables.Fake{}, names: map[string]*namesOnly{}}
	addr := opts.Addr
	sup, err := supervisor.New(cfg, supervisor.Deps{
		Client:              opts.Client,
		Version:             "hollow",
		NFT:                 ft.open,
		Conntrack:           conntrack.NewFake(),
		HealthCheckListener: nullListener{},
		InterfaceAddrs:      func() ([]netip.Addr, error) { return []netip.Addr{addr}, nil },
		Sysctl:              func(string, string) error { return nil },
		ConntrackHashsize:   func(int) error { return nil },
		NumCPU:              func() int { return 2 },
		ListTables:          ft.list,
		LegacyRules:         func(context.Context) (map[string]legacy.ServiceRules, error) { return nil, nil },
		Logger:              opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("hollow node %s: %w", opts.Name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	h := &HollowNode{Name: opts.Name, sup: sup, tables: ft, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		h.err = sup.Run(ctx)
	}()
	return h, nil
}

// Programmed says whether the node's instance has programmed Service n (its tables hold
// it: the model is recorded only after the transaction ran).
func (h *HollowNode) Programmed(n types.NamespacedName) bool {
	return h.ProgrammedBy(DefaultInstance, n)
}

// ProgrammedBy says whether the node's instance inst has programmed Service n, as its
// owner or in shadow.
func (h *HollowNode) ProgrammedBy(inst string, n types.NamespacedName) bool {
	p := h.sup.Instance(inst)
	return p != nil && p.AppliedModel(n) != nil
}

// Healthy says whether the node's health server would answer 200.
func (h *HollowNode) Healthy() bool { return h.sup.Health().Healthy(DefaultInstance) }

// Tables returns how many fake tables the node's instance has written.
func (h *HollowNode) Tables() int {
	h.tables.mu.Lock()
	defer h.tables.mu.Unlock()
	return len(h.tables.fakes) + len(h.tables.names)
}

// Stop stops the node and waits for every goroutine of its supervisor.
func (h *HollowNode) Stop() error {
	h.cancel()
	<-h.done
	return h.err
}

// fakeTables hands out one fake per table: knftables.Fake (full) or namesOnly.
type fakeTables struct {
	full  bool
	mu    sync.Mutex
	fakes map[string]*knftables.Fake
	names map[string]*namesOnly
}

func (f *fakeTables) open(fam tables.Family, table string) (knftables.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := tablestest.Key(fam, table)
	if !f.full {
		n := f.names[key]
		if n == nil {
			n = newNamesOnly(tables.KnftFamily(fam), table)
			f.names[key] = n
		}
		return n, nil
	}
	fk := f.fakes[key]
	if fk == nil {
		fk = knftables.NewFake(tables.KnftFamily(fam), table)
		f.fakes[key] = fk
	}
	return fk, nil
}

func (f *fakeTables) list(_ context.Context, fam tables.Family) ([]tables.ListedTable, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.full {
		return tablestest.Listed(f.fakes, fam), nil
	}
	var out []tables.ListedTable
	for key, n := range f.names {
		family, _, _ := strings.Cut(key, " ")
		if t, ok := n.listed(); ok && family == string(tables.KnftFamily(fam)) {
			out = append(out, t)
		}
	}
	return out, nil
}

// nullListener opens health-check node ports that accept nothing: many hollow nodes
// share one host, and the same port on the same address can be bound only once.
type nullListener struct{}

func (nullListener) Listen(addr netip.Addr, port int) (net.Listener, error) {
	return &idleListener{addr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, uint16(port))), closed: make(chan struct{})}, nil
}

// idleListener is a net.Listener whose Accept blocks until Close.
type idleListener struct {
	addr   net.Addr
	once   sync.Once
	closed chan struct{}
}

func (l *idleListener) Accept() (net.Conn, error) {
	<-l.closed
	return nil, net.ErrClosed
}

func (l *idleListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *idleListener) Addr() net.Addr { return l.addr }
