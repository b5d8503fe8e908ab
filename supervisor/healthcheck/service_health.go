package healthcheck

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"

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

// ServiceHealth runs one HTTP server per health-check node port of the node's
// LoadBalancer Services with externalTrafficPolicy Local, for every instance. Load
// balancers probe the port to learn whether this node has ready local endpoints for the
// Service. It is safe for concurrent use.
type ServiceHealth struct {
	listen   Listener
	recorder EventRecorder
	healthy  func(instance string) bool
	logger   klog.Logger

	// mu guards everything below and every hcService's endpoints.
	mu sync.RWMutex
	// services holds each instance's wanted health checks, bound or not, by Service.
	services map[string]map[types.NamespacedName]*hcService
	// ports holds the health check serving each bound port; one port serves one Service.
	ports  map[int32]*hcService
	closed bool
}

// hcService is one Service's health check.
type hcService struct {
	// instance owns the health check; it changes when another instance adopts it.
	instance string
	name     types.NamespacedName
	port     int32
	// endpoints is the number of local ready endpoints, guarded by ServiceHealth.mu.
	endpoints int
	// server is nil while the port is not bound; the next SyncServices retries it.
	server *http.Server
	// listener is the server's socket, closed by us too: the server only learns of it once
	// its Serve goroutine runs, and the port must be free as soon as it is given up.
	listener net.Listener
}

// NewServiceHealth returns a ServiceHealth with no servers. listen opens ports (nil means
// NewTCPListener(nil)); recorder records events on Services (nil records none); healthy
// reports whether an instance is healthy, usually ProxyHealth.Healthy (nil means always).
func NewServiceHealth(listen Listener, recorder EventRecorder, healthy func(instance string) bool) *ServiceHealth {
	if listen == nil {
		listen = NewTCPListener(nil)
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
		ports:    map[int32]*hcService{},
	}
}

// SyncServices makes ports the complete set of health-check node ports of the instance's
// Services: servers for Services that are gone or changed port are closed, new ones are
// opened, and other instances' servers are left alone. A port already serving another
// Service goes to whichever asked first (within one call, the first by namespace/name);
// a port that cannot be opened is logged, recorded as a Warning event on the Service, and
// retried on the next call. Ports given up here are handed at once to Services of any
// instance still waiting for them.
func (s *ServiceHealth) SyncServices(instance string, ports map[types.NamespacedName]int32) {
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
		if port, ok := ports[name]; ok && port == svc.port {
			continue
		}
		if s.closeLocked(logger, svc) {
			freed = append(freed, svc.port)
		}
		delete(old, name)
	}

	wanted := make(map[types.NamespacedName]*hcService, len(ports))
	for _, name := range sortedNames(ports) {
		svc := old[name]
		if svc == nil {
			svc = s.adoptLocked(logger, instance, name, ports[name])
		}
		if svc == nil {
			svc = &hcService{instance: instance, name: name, port: ports[name]}
		}
		wanted[name] = svc
		if svc.server == nil {
			s.openLocked(logger, svc, true)
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

// adoptLocked hands instance the running health check of Service name on port when
// another instance serves it there: the Service moved between instances (a relabel, or
// the end of a migration), and the load balancer must keep finding the port open, not
// see it closed and reopened. The new owner's endpoint count replaces the old one's in
// the same observer pass (SyncEndpoints). It returns nil when there is nothing to adopt.
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

// SyncEndpoints sets the number of local ready endpoints of the instance's Services; a
// Service missing from localEndpoints has none. Services the instance has not passed to
// SyncServices are ignored.
func (s *ServiceHealth) SyncEndpoints(instance string, localEndpoints map[types.NamespacedName]int) {
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

// RetryFailed tries again to open every health check whose port could not be bound,
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
			if svc.server == nil {
				s.openLocked(logger, svc, false)
			}
		}
	}
}

// openLocked binds svc's port and starts serving it, or logs (and, with report, records
// an event saying) why it could not.
func (s *ServiceHealth) openLocked(logger klog.Logger, svc *hcService, report bool) {
	logger = logger.WithValues("service", svc.name, "port", svc.port)
	fail := func(err error) {
		if report {
			s.failLocked(logger, svc, err)
		} else {
			logger.V(4).Info("Service health check still cannot open", "err", err)
		}
	}
	if holder, ok := s.ports[svc.port]; ok {
		fail(fmt.Errorf("port %d already serves the health check of Service %s (instance %q)",
			svc.port, holder.name, holder.instance))
		return
	}
	if svc.port <= 0 || svc.port > 65535 {
		fail(fmt.Errorf("port %d is not a valid port", svc.port))
		return
	}
	l, err := s.listen.Listen(int(svc.port))
	if err != nil {
		fail(err)
		return
	}
	srv := &http.Server{
		Handler:           hcHandler{s: s, svc: svc, logger: logger},
		ReadHeaderTimeout: readHeaderTimeout,
	}
	svc.server = srv
	svc.listener = l
	s.ports[svc.port] = svc
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Service health check stopped serving")
		}
	}()
	logger.V(2).Info("Opened service health check", "address", l.Addr().String())
}

// failLocked reports that svc's port could not be opened; the next sync retries.
func (s *ServiceHealth) failLocked(logger klog.Logger, svc *hcService, err error) {
	logger.Error(err, "Failed to start service health check")
	if s.recorder != nil {
		s.recorder.Eventf(svc.name, eventTypeWarning, ReasonFailedToStartServiceHealthcheck,
			"failed to start health check on node port %d (instance %q): %v", svc.port, svc.instance, err)
	}
}

// closeLocked stops svc's server and reports whether it had its port bound.
func (s *ServiceHealth) closeLocked(logger klog.Logger, svc *hcService) bool {
	if svc.server == nil {
		return false
	}
	logger = logger.WithValues("service", svc.name, "port", svc.port)
	// Close, not Shutdown: probes are idempotent, and the port must be free when this returns
	// so another Service or instance can take it in the same sync.
	err := svc.server.Close()
	if lerr := svc.listener.Close(); lerr != nil && !errors.Is(lerr, net.ErrClosed) {
		err = errors.Join(err, lerr)
	}
	if err != nil {
		logger.Error(err, "Closing service health check")
	}
	svc.server, svc.listener = nil, nil
	delete(s.ports, svc.port)
	logger.V(2).Info("Closed service health check")
	return true
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
			if svc.server == nil && slices.Contains(freed, svc.port) {
				waiting = append(waiting, svc)
			}
		}
	}
	slices.SortFunc(waiting, func(a, b *hcService) int {
		return cmp.Or(cmp.Compare(a.instance, b.instance), compareNames(a.name, b.name))
	})
	for _, svc := range waiting {
		if _, taken := s.ports[svc.port]; taken {
			continue
		}
		s.openLocked(s.logger.WithValues("instance", svc.instance), svc, true)
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

func (h hcHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.s.mu.RLock()
	count, instance := h.svc.endpoints, h.svc.instance
	h.s.mu.RUnlock()
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

// sortedNames returns the keys of ports by namespace/name, so which of two Services asking
// for one port wins does not depend on map order.
func sortedNames(ports map[types.NamespacedName]int32) []types.NamespacedName {
	names := make([]types.NamespacedName, 0, len(ports))
	for name := range ports {
		names = append(names, name)
	}
	slices.SortFunc(names, compareNames)
	return names
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// Unbound lists the health checks whose node port is not bound (another process or
// another Service holds it, or it is invalid), as "port N (Service ns/name, instance
// I)", sorted; RetryFailed tries them again.
func (s *ServiceHealth) Unbound() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for instance, services := range s.services {
		for _, svc := range services {
			if svc.server == nil {
				out = append(out, fmt.Sprintf("port %d (Service %s, instance %s)", svc.port, svc.name, instance))
			}
		}
	}
	slices.Sort(out)
	return out
}
