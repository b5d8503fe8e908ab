package healthcheck

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

const (
	// ReasonFailedToStartServiceHealthcheck is the reason of the Warning event recorded on a
	// Service whose health-check node port could not be opened; the same as upstream's, so
	// existing alerts keep matching.
	ReasonFailedToStartServiceHealthcheck = "FailedToStartServiceHealthcheck"

	// eventTypeWarning is corev1.EventTypeWarning, spelled out to keep k8s.io/api out of
	// this package.
	eventTypeWarning = "Warning"
)

// EventRecorder records an event on a Service.
type EventRecorder interface {
	Eventf(service types.NamespacedName, eventType, reason, messageFmt string, args ...any)
}

// LocalEndpoints counts a Service's ready endpoints on this node per IP family. Each
// family's health check answers with its own count, as upstream's per-family proxiers
// each run their own health check server with their own family's endpoints: a
// dual-stack Service whose IPv6 endpoints on this node are gone fails IPv6 probes while
// IPv4 probes pass.
type LocalEndpoints struct {
	IPv4, IPv6 int
}

// HealthCheck is one Service's health-check node port and the IP families it is served
// in: the Service's, as upstream's per-family proxiers serve it in each of them.
type HealthCheck struct {
	Port       int32
	IPv4, IPv6 bool
}

// ServiceHealth runs one HTTP server per health-check node port of the node's
// LoadBalancer Services with externalTrafficPolicy Local, for every instance. Load
// balancers probe the port to learn whether this node has ready local endpoints for the
// Service. As upstream's, a port listens only on the owning instance's node port
// addresses (SetInstanceAddrs) of the Service's IP families, never on every address of
// the node. It is safe for concurrent use.
type ServiceHealth struct {
	listen   Listener
	recorder EventRecorder
	healthy  func(instance string) bool
	logger   klog.Logger

	// mu guards everything below and every hcService's fields.
	mu sync.RWMutex
	// services holds each instance's wanted health checks, bound or not, by Service.
	services map[string]map[types.NamespacedName]*hcService
	// addrs holds each instance's node port addresses.
	addrs map[string][]netip.Addr
	// ports holds the health check serving each bound port; one port serves one Service.
	ports  map[int32]*hcService
	closed bool
	// ownerOf names the instance serving a Service now; nil: unknown (SetOwnerLookup).
	ownerOf func(types.NamespacedName) string
	// now is the clock of failure reports (time.Now; tests set it).
	now func() time.Time
}

// reportEvery is how often a health check that keeps failing with the same error is
// reported again (logged as an error, and an event). Every sync retries it; reporting
// each retry cost the API server an event write per Service and sync (measured on real
// nodes whose Node address was not local: ~5 event writes per second per node), while
// the event stays visible for its TTL (1 h by default).
const reportEvery = 5 * time.Minute

// hcService is one Service's health check.
type hcService struct {
	// instance owns the health check; it changes when another instance adopts it.
	instance string
	name     types.NamespacedName
	check    HealthCheck
	// endpoints are the numbers of local ready endpoints, guarded by ServiceHealth.mu.
	endpoints LocalEndpoints
	// server serves every listener; nil while none is open.
	server *http.Server
	// listeners are the open sockets by address, closed by us too: the server only learns
	// of one once its Serve goroutine runs, and the port must be free as soon as it is
	// given up.
	listeners map[netip.Addr]net.Listener
	// incomplete is set while an address it should listen on could not be bound.
	incomplete bool
	// byConfig is set, with incomplete, while the health check cannot open because of what
	// the Services and the instance's configuration ask (no node port address in the
	// Service's families, a port another Service holds, an invalid port), not because
	// this node refused a socket: Unserved lists it, Unbound does not.
	byConfig bool
	// reported is the failure last reported (its instance and error), at reportedAt; ""
	// once it opened fully.
	reported   string
	reportedAt time.Time
}

// NewServiceHealth returns a ServiceHealth with no servers. listen opens ports (nil means
// TCPListener); recorder records events on Services (nil records none); healthy reports
// whether an instance is healthy, usually ProxyHealth.Healthy (nil means always).
func NewServiceHealth(listen Listener, recorder EventRecorder, healthy func(instance string) bool) *ServiceHealth {
	if listen == nil {
		listen = TCPListener{}
	}
	if healthy == nil {
		healthy = func(string) bool { return true }
	}
	return &ServiceHealth{
		listen:   listen,
		recorder: recorder,
		healthy:  healthy,
		logger:   klog.Background().WithName("service-health"),
		services: map[string]map[types.NamespacedName]*hcService{},
		addrs:    map[string][]netip.Addr{},
		ports:    map[int32]*hcService{},
		now:      time.Now,
	}
}

// SetInstanceAddrs sets the node addresses an instance's health checks listen on (its
// nodePortAddresses resolved on this node) and moves its open health checks to them:
// new addresses are opened before old ones are closed.
func (s *ServiceHealth) SetInstanceAddrs(instance string, addrs []netip.Addr) {
	logger := s.logger.WithValues("instance", instance)
	s.mu.Lock()
	defer s.mu.Unlock()
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	if slices.Equal(s.addrs[instance], addrs) {
		return
	}
	s.addrs[instance] = addrs
	if s.closed {
		return
	}
	var freed []int32
	for _, name := range sortedNames(s.services[instance]) {
		svc := s.services[instance][name]
		if s.ports[svc.check.Port] != nil && s.ports[svc.check.Port] != svc {
			continue // waiting for a port another Service holds
		}
		if s.reconcileLocked(logger, svc, true) {
			freed = append(freed, svc.check.Port)
		}
	}
	s.openWaitingLocked(freed)
	logger.V(2).Info("Set service health check addresses", "addresses", addrs)
}

// SyncServices makes checks the complete set of health-check node ports of the
// instance's Services: servers for Services that are gone or changed port are closed,
// new ones are opened, changed families are followed, and other instances' servers are
// left alone. A port already serving another Service goes to whichever asked first
// (within one call, the first by namespace/name); an address that cannot be bound is
// logged, recorded as a Warning event on the Service, and retried on the next call. Ports
// given up here are handed at once to Services of any instance still waiting for them.
func (s *ServiceHealth) SyncServices(instance string, checks map[types.NamespacedName]HealthCheck) {
	logger := s.logger.WithValues("instance", instance)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		logger.V(2).Info("Ignoring service health sync after close")
		return
	}

	old := s.services[instance]
	var freed []int32
	for name, svc := range old {
		if c, ok := checks[name]; ok && c.Port == svc.check.Port {
			continue
		}
		delete(old, name)
		if _, present := checks[name]; !present && s.handOverLocked(logger, svc) {
			continue
		}
		if s.closeLocked(logger, svc) {
			freed = append(freed, svc.check.Port)
		}
	}

	wanted := make(map[types.NamespacedName]*hcService, len(checks))
	for _, name := range sortedNames(checks) {
		svc := old[name]
		if svc == nil {
			svc = s.adoptLocked(logger, instance, name, checks[name].Port)
		}
		if svc == nil {
			svc = &hcService{instance: instance, name: name}
		}
		changed := svc.check != checks[name]
		svc.check = checks[name]
		wanted[name] = svc
		if svc.server == nil || svc.incomplete || changed || !slices.Equal(svc.boundAddrs(), s.wantedAddrsLocked(svc)) {
			if s.reconcileLocked(logger, svc, true) {
				freed = append(freed, svc.check.Port)
			}
		}
	}
	if len(wanted) == 0 {
		delete(s.services, instance)
	} else {
		s.services[instance] = wanted
	}

	s.openWaitingLocked(freed)
	logger.V(2).Info("Synced service health checks", "services", len(wanted), "freedPorts", len(freed))
}

// SetOwnerLookup gives the ServiceHealth the instance that serves a Service now ("":
// none), usually the dispatcher's Owner. With it, an instance dropping a Service that
// another instance has taken over hands the running health check to that instance
// instead of closing it: the load balancer never finds the port closed in the moment
// between the old owner's sync and the new owner's.
func (s *ServiceHealth) SetOwnerLookup(owner func(types.NamespacedName) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ownerOf = owner
}

// handOverLocked moves svc, which its instance no longer wants, to the instance that
// serves its Service now, if that is another instance this ServiceHealth knows; the new
// owner's next SyncServices keeps it, or closes it if it does not want it. It reports
// whether svc was handed over.
func (s *ServiceHealth) handOverLocked(logger klog.Logger, svc *hcService) bool {
	if s.ownerOf == nil || svc.server == nil {
		return false
	}
	to := s.ownerOf(svc.name)
	if _, known := s.addrs[to]; !known || to == svc.instance {
		return false
	}
	logger.V(2).Info("Handed a service health check over to the Service's new owner", "service", svc.name, "port", svc.check.Port, "to", to)
	svc.instance = to
	if s.services[to] == nil {
		s.services[to] = map[types.NamespacedName]*hcService{}
	}
	s.services[to][svc.name] = svc
	s.reconcileLocked(logger.WithValues("instance", to), svc, true)
	return true
}

// adoptLocked hands instance the running health check of Service name on port when
// another instance serves it there: the Service moved between instances (a relabel, or
// the end of a migration), and the load balancer must keep finding the port open, not
// see it closed and reopened. The caller then moves it to instance's addresses, opening
// before closing. The new owner's endpoint count replaces the old one's in the same
// observer pass (SyncEndpoints). It returns nil when there is nothing to adopt.
func (s *ServiceHealth) adoptLocked(logger klog.Logger, instance string, name types.NamespacedName, port int32) *hcService {
	holder := s.ports[port]
	if holder == nil || holder.name != name || holder.instance == instance {
		return nil
	}
	delete(s.services[holder.instance], name)
	if len(s.services[holder.instance]) == 0 {
		delete(s.services, holder.instance)
	}
	logger.V(2).Info("Took over a service health check from another instance", "service", name, "port", port, "from", holder.instance)
	holder.instance = instance
	return holder
}

// SyncEndpoints sets the numbers of local ready endpoints of the instance's Services, per
// IP family; a Service missing from localEndpoints has none. Services the instance has
// not passed to SyncServices are ignored.
func (s *ServiceHealth) SyncEndpoints(instance string, localEndpoints map[types.NamespacedName]LocalEndpoints) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, svc := range s.services[instance] {
		svc.endpoints = localEndpoints[name]
	}
	s.logger.V(4).Info("Synced service health endpoints", "instance", instance, "services", len(s.services[instance]))
}

// Close closes every server. Later SyncServices calls do nothing.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for instance, services := range s.services {
		logger := s.logger.WithValues("instance", instance)
		for _, svc := range services {
			s.closeLocked(logger, svc)
		}
	}
	s.services = map[string]map[types.NamespacedName]*hcService{}
}

// RetryFailed tries again to open every health check address that could not be bound,
// without new events: a port another process held (a legacy kube-proxy letting go of a
// migrated Service) opens within one call of being freed, not at the owner's next sync.
func (s *ServiceHealth) RetryFailed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for instance, services := range s.services {
		logger := s.logger.WithValues("instance", instance)
		for _, svc := range services {
			if svc.server == nil || svc.incomplete {
				s.reconcileLocked(logger, svc, false)
			}
		}
	}
}

// wantedAddrsLocked are the addresses svc should listen on: its instance's node port
// addresses of the Service's families, sorted.
func (s *ServiceHealth) wantedAddrsLocked(svc *hcService) []netip.Addr {
	var out []netip.Addr
	for _, a := range s.addrs[svc.instance] {
		if (a.Is4() || a.Is4In6()) && svc.check.IPv4 || a.Is6() && !a.Is4In6() && svc.check.IPv6 {
			out = append(out, a)
		}
	}
	return out
}

// boundAddrs are the addresses svc listens on, sorted.
func (svc *hcService) boundAddrs() []netip.Addr {
	return slices.SortedFunc(maps.Keys(svc.listeners), netip.Addr.Compare)
}

// reconcileLocked makes svc listen on exactly its wanted addresses: it opens the missing
// ones first and only then closes those no longer wanted, so a health check moving
// between addresses (its Service moved to an instance with other nodePortAddresses)
// answers somewhere throughout. What cannot be opened is reported (with report, as an
// event too) and retried later; what is open stays. It reports whether the port was
// given up entirely.
func (s *ServiceHealth) reconcileLocked(logger klog.Logger, svc *hcService, report bool) (freed bool) {
	logger = logger.WithValues("service", svc.name, "port", svc.check.Port)
	fail := func(err error, byConfig bool) {
		svc.incomplete, svc.byConfig = true, byConfig
		if report && s.newFailureLocked(svc, err) {
			s.failLocked(logger, svc, err)
		} else {
			logger.V(4).Info("Service health check still cannot open", "err", err)
		}
	}
	if holder, ok := s.ports[svc.check.Port]; ok && holder != svc {
		fail(fmt.Errorf("port %d already serves the health check of Service %s (instance %q)",
			svc.check.Port, holder.name, holder.instance), true)
		return false
	}
	if svc.check.Port <= 0 || svc.check.Port > 65535 {
		fail(fmt.Errorf("port %d is not a valid port", svc.check.Port), true)
		return false
	}
	want := s.wantedAddrsLocked(svc)
	var errs []error
	for _, addr := range want {
		if svc.listeners[addr] != nil {
			continue
		}
		if err := s.listenLocked(logger, svc, addr); err != nil {
			errs = append(errs, err)
		}
	}
	for addr, l := range svc.listeners {
		if !slices.Contains(want, addr) {
			closeListener(logger, l)
			delete(svc.listeners, addr)
			logger.V(2).Info("Closed service health check address", "address", addr)
		}
	}
	svc.incomplete, svc.byConfig = false, false
	if len(want) == 0 {
		fail(fmt.Errorf("instance %q has no node port address in the Service's IP families to listen on", svc.instance), true)
	} else if len(errs) > 0 {
		fail(errors.Join(errs...), false)
	} else {
		svc.reported = ""
	}
	if len(svc.listeners) == 0 && svc.server != nil {
		return s.closeLocked(logger, svc)
	}
	return false
}

// listenLocked opens svc's port on addr and serves it.
func (s *ServiceHealth) listenLocked(logger klog.Logger, svc *hcService, addr netip.Addr) error {
	l, err := s.listen.Listen(addr, int(svc.check.Port))
	if err != nil {
		return err
	}
	if svc.server == nil {
		svc.server = &http.Server{
			Handler:           hcHandler{s: s, svc: svc, logger: logger},
			ReadHeaderTimeout: readHeaderTimeout,
		}
		svc.listeners = map[netip.Addr]net.Listener{}
	}
	svc.listeners[addr] = l
	s.ports[svc.check.Port] = svc
	srv := svc.server
	go func() {
		// A listener closed alone (its address no longer wanted) ends Serve with ErrClosed.
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			logger.Error(err, "Service health check stopped serving", "address", addr)
		}
	}()
	logger.V(2).Info("Opened service health check", "address", l.Addr().String())
	return nil
}

// newFailureLocked tells whether err is to be reported: a failure other than the one
// last reported, or the same one reportEvery after it was.
func (s *ServiceHealth) newFailureLocked(svc *hcService, err error) bool {
	now := s.now()
	// The instance is part of it: a check handed to another instance failing alike is
	// a new failure, and its report names the new owner.
	if msg := svc.instance + ": " + err.Error(); msg != svc.reported || now.Sub(svc.reportedAt) >= reportEvery {
		svc.reported, svc.reportedAt = msg, now
		return true
	}
	return false
}

// failLocked reports that svc's port could not be opened; the next sync retries.
func (s *ServiceHealth) failLocked(logger klog.Logger, svc *hcService, err error) {
	logger.Error(err, "Failed to start service health check")
	if s.recorder != nil {
		s.recorder.Eventf(svc.name, eventTypeWarning, ReasonFailedToStartServiceHealthcheck,
			"failed to start health check on node port %d (instance %q): %v", svc.check.Port, svc.instance, err)
	}
}

// closeLocked stops svc's server and reports whether it had its port bound.
func (s *ServiceHealth) closeLocked(logger klog.Logger, svc *hcService) bool {
	if svc.server == nil {
		return false
	}
	logger = logger.WithValues("service", svc.name, "port", svc.check.Port)
	// Close, not Shutdown: probes are idempotent, and the port must be free when this returns
	// so another Service or instance can take it in the same sync.
	if err := svc.server.Close(); err != nil {
		logger.Error(err, "Closing service health check")
	}
	for _, l := range svc.listeners {
		closeListener(logger, l)
	}
	svc.server, svc.listeners = nil, nil
	if s.ports[svc.check.Port] == svc {
		delete(s.ports, svc.check.Port)
	}
	logger.V(2).Info("Closed service health check")
	return true
}

func closeListener(logger klog.Logger, l net.Listener) {
	if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		logger.Error(err, "Closing service health check socket", "address", l.Addr().String())
	}
}

// openWaitingLocked retries the health checks of any instance that wait for a freed port,
// so a Service moving between instances gets its port back without waiting for the new
// owner's next sync.
func (s *ServiceHealth) openWaitingLocked(freed []int32) {
	if len(freed) == 0 {
		return
	}
	var waiting []*hcService
	for _, services := range s.services {
		for _, svc := range services {
			if svc.server == nil && slices.Contains(freed, svc.check.Port) {
				waiting = append(waiting, svc)
			}
		}
	}
	slices.SortFunc(waiting, func(a, b *hcService) int {
		return cmp.Or(cmp.Compare(a.instance, b.instance), compareNames(a.name, b.name))
	})
	for _, svc := range waiting {
		if _, taken := s.ports[svc.check.Port]; taken {
			continue
		}
		s.reconcileLocked(s.logger.WithValues("instance", svc.instance), svc, true)
	}
}

// hcHandler answers a Service's health check on any path.
type hcHandler struct {
	s      *ServiceHealth
	svc    *hcService
	logger klog.Logger
}

// serviceHealthResponse is the body of a Service health check, as upstream's.
type serviceHealthResponse struct {
	Service             serviceRef `json:"service"`
	LocalEndpoints      int        `json:"localEndpoints"`
	ServiceProxyHealthy bool       `json:"serviceProxyHealthy"`
}

type serviceRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// ServeHTTP answers with the local endpoints of the IP family the probe came in on: the
// connection's local address's, which is the listener's own on a node address, and on a
// wildcard socket taking both families (an IPv4-mapped address is IPv4) the one the
// client reached.
func (h hcHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.s.mu.RLock()
	endpoints, instance := h.svc.endpoints, h.svc.instance
	h.s.mu.RUnlock()
	count := endpoints.IPv4
	if probedIPv6(r) {
		count = endpoints.IPv6
	}
	proxyHealthy := h.s.healthy(instance)

	// Load balancers that support weights (upstream added this header for them) spread
	// traffic by the number of local endpoints.
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	writeJSON(h.logger, w, statusCode(count > 0 && proxyHealthy), serviceHealthResponse{
		Service:             serviceRef{Namespace: h.svc.name.Namespace, Name: h.svc.name.Name},
		LocalEndpoints:      count,
		ServiceProxyHealthy: proxyHealthy,
	})
}

// probedIPv6 reports whether r came in on an IPv6 address of this node.
func probedIPv6(r *http.Request) bool {
	switch local := r.Context().Value(http.LocalAddrContextKey).(type) {
	case *net.TCPAddr:
		return local.AddrPort().Addr().Unmap().Is6()
	case net.Addr:
		ap, err := netip.ParseAddrPort(local.String())
		return err == nil && ap.Addr().Unmap().Is6()
	}
	return false
}

// sortedNames returns the keys of m by namespace/name, so which of two Services asking
// for one port wins does not depend on map order.
func sortedNames[V any](m map[types.NamespacedName]V) []types.NamespacedName {
	return slices.SortedFunc(maps.Keys(m), compareNames)
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// Unbound lists the health checks whose node port this node refused to bind on an
// address it should listen on (another process holds it: a kube-proxy still running
// during a switch), as "port N (Service ns/name, instance I)", sorted; RetryFailed tries
// them again. They gate the pod's readiness: the operator's to fix, not a tenant's
// doing.
func (s *ServiceHealth) Unbound() []string {
	return s.unopened(false)
}

// Unserved lists, as Unbound does, the health checks that cannot open because of what
// the Services and the instances' configuration ask: the instance has no node port
// address in the Service's IP families, another Service holds the port, or the port is
// invalid. They are reported (log and event) and listed in /status but do not gate
// readiness: a tenant writes them, and one tenant's Service must not make the node's
// pod NotReady (and stall every rollout of the DaemonSet).
func (s *ServiceHealth) Unserved() []string {
	return s.unopened(true)
}

// unopened lists the health checks not open on every address they should be, those
// failing byConfig or the others.
func (s *ServiceHealth) unopened(byConfig bool) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for instance, services := range s.services {
		for _, svc := range services {
			if (svc.server == nil || svc.incomplete) && svc.byConfig == byConfig {
				out = append(out, fmt.Sprintf("port %d (Service %s, instance %s)", svc.check.Port, svc.name, instance))
			}
		}
	}
	slices.Sort(out)
	return out
}
