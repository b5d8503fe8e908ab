package healthcheck

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

const (
	// DefaultProxyHealthAddress is where kube-proxy serves /healthz and /livez, so kubelet
	// probes and cloud load balancer checks written for kube-proxy keep working.
	DefaultProxyHealthAddress = "0.0.0.0:10256"

	// DefaultHealthTimeout is how long a queued update may stay unapplied before its instance
	// counts as unhealthy: upstream uses twice the default 30s sync period.
	DefaultHealthTimeout = 60 * time.Second

	// ToBeDeletedTaint is the taint the cluster autoscaler puts on a Node it is about to
	// remove; upstream kube-proxy's /healthz reports such a node not eligible.
	ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

	// shutdownTimeout bounds the graceful shutdown of the proxy health server; probes are
	// answered in microseconds, so anything still open after this is a stuck client.
	shutdownTimeout = 5 * time.Second
)

// Clock tells the time. Tests substitute a fake to decide when a queued update goes stale.
type Clock interface {
	Now() time.Time
}

// RealClock is the Clock that reads the system time.
type RealClock struct{}

var _ Clock = RealClock{}

// Now returns the current system time.
func (RealClock) Now() time.Time { return time.Now() }

// ProxyHealth tracks the sync health of every proxy instance on the node and serves it over
// HTTP. Following upstream, an instance is healthy unless an update was queued and has not
// been applied within its health timeout, and, beyond upstream, unless the supervisor has
// marked it down.
//
// Beyond upstream, an instance whose sync loop has finished no sync (successful or not)
// for twice its health timeout is stale too, with nothing queued: a periodic sync that
// hangs queues nothing.
//
// /healthz is what load balancers read, for every tenant's traffic at once, so it fails
// only for what is node-wide: while the Node is being deleted (as upstream), or when no
// instance is healthy (nothing on the node proxies). One unhealthy instance among healthy
// ones shows in its entry, in /status (stale, with why) and in the metrics, and, for its
// Local-policy LoadBalancer Services, on their health-check node ports; draining the node
// for it would move every other tenant's traffic too. /livez, which the kubelet restarts
// the pod on, fails likewise only when the node is wedged as a whole: instances are up
// and none of them is live. One stale instance among live ones would be restarted with
// every other tenant's; the supervisor restarts a down instance itself.
//
// The /healthz and /livez bodies have upstream kube-proxy's fields with upstream's
// meaning (lastUpdated, currentTime, nodeEligible on /healthz, healthy, and status per IP
// family), computed over the node's instances, plus each instance's health (instances).
// The top-level healthy is the node-wide verdict above, without the node's eligibility
// (as upstream, where nodeEligible says that part); a family's status is healthy when
// every instance that programs it is, so one failing instance shows there too.
//
// /status adds each instance's last error and why it is down (which may hold a panic's
// stack) and its counts; it answers only clients on loopback. It is safe for concurrent
// use.
type ProxyHealth struct {
	clock   Clock
	timeout func(instance string) time.Duration
	logger  klog.Logger

	mu           sync.RWMutex
	instances    map[string]*instanceState
	nodeDeleting bool
	// nodeToBeDeleted: the Node carries ToBeDeletedTaint.
	nodeToBeDeleted bool
	// listenErrors says, per server (readiness.go), why its address is not bound.
	listenErrors map[string]string
	// unserved says, per server (readiness.go), what it does not serve as configured.
	unserved map[string]string
	// config is the configuration in force, for /status.
	config *ConfigStatus
	// nodeAddresses is the published node address list's state, for /status.
	nodeAddresses *NodeAddressesStatus
}

// NodeAddressesStatus is the state of the published node address list the node reads
// the other Nodes' addresses from (otherNodeAddresses: published), as /status reports it.
type NodeAddressesStatus struct {
	// ConfigMap is the list's namespace/name.
	ConfigMap string `json:"configMap"`
	// State is "ok" (read and valid), "absent" (not there, or deleted) or "invalid"
	// (unreadable); in the last two the list read last (if any) stays reserved.
	State string `json:"state"`
	// Error says what is wrong when State is not ok.
	Error string `json:"error,omitempty"`
	// Nodes is how many Nodes the list in use names; ResourceVersion and Read are the
	// ConfigMap's version and when this node read it.
	Nodes           int       `json:"nodes"`
	ResourceVersion string    `json:"resourceVersion,omitempty"`
	Read            time.Time `json:"read,omitzero"`
}

// SetNodeAddresses records the published node address list's state.
func (h *ProxyHealth) SetNodeAddresses(st NodeAddressesStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeAddresses = &st
}

// ConfigStatus is the configuration file in force, as /status reports it.
type ConfigStatus struct {
	// Hash is the SHA-256 of the file's content, its first 16 hex digits.
	Hash string `json:"hash"`
	// Applied is when it was applied: at start, or by a live change.
	Applied time.Time `json:"applied"`
	// Refused says why the newest changed file was not applied (invalid, or a field
	// that cannot change while running); empty once a later one is.
	Refused string `json:"refused,omitempty"`
}

// RefuseConfig records why the newest configuration file was not applied; the one in
// force (SetConfig) stays. No-op before a SetConfig.
func (h *ProxyHealth) RefuseConfig(why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.config != nil {
		c := *h.config
		c.Refused = why
		h.config = &c
	}
}

// SetConfig records the configuration in force, and why a newer one was refused ("":
// none was).
func (h *ProxyHealth) SetConfig(c ConfigStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.config = &c
}

// instanceState is what ProxyHealth knows about one instance.
type instanceState struct {
	// lastUpdated is when the last successful sync finished; zero before the first.
	lastUpdated time.Time
	// familyUpdated is, for each IP family the instance programs, when a successful sync
	// last programmed it; a family appears with its first sync, as in upstream's status.
	familyUpdated map[corev1.IPFamily]time.Time
	// oldestQueued is when the oldest update not yet applied was queued; zero when none is
	// pending. Later QueuedUpdate calls do not move it, so a proxy that keeps receiving
	// changes but never applies them still goes stale.
	oldestQueued time.Time
	lastError    string
	services     int
	endpoints    int
	up           bool
	downReason   string
	// upSince is when the instance last came back up; zero if it never went down. An
	// update queued before then does not count against /livez for the time the instance
	// was down.
	upSince time.Time
	// lastRun is when the instance's sync loop last finished a sync, successful or not
	// (or was added, or came back up): a loop that stops finishing syncs is stuck, even
	// with nothing queued (its periodic syncs hang).
	lastRun time.Time
}

// StuckFactor times an instance's health timeout is how long its sync loop may go
// without finishing a sync before it is stale. The loop syncs at least every sync period
// (the timeout is twice that), so this leaves a sync a whole timeout to run before it
// counts as hung.
const StuckFactor = 2

// NewProxyHealth returns a ProxyHealth with no instances. healthTimeout gives each
// instance's timeout (typically twice its sync period); nil means DefaultHealthTimeout for
// all. It is called with ProxyHealth's lock held and must not call back into it. A nil
// clock means RealClock.
func NewProxyHealth(clock Clock, healthTimeout func(instance string) time.Duration) *ProxyHealth {
	if clock == nil {
		clock = RealClock{}
	}
	if healthTimeout == nil {
		healthTimeout = func(string) time.Duration { return DefaultHealthTimeout }
	}
	return &ProxyHealth{
		clock:     clock,
		timeout:   healthTimeout,
		logger:    klog.Background().WithName("proxy-health"),
		instances: map[string]*instanceState{},
	}
}

// AddInstance starts tracking an instance. Like upstream at start-up it is healthy until
// an update it queued goes stale. Adding an instance that is already tracked keeps its state.
func (h *ProxyHealth) AddInstance(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.instances[name]; ok {
		return
	}
	h.instances[name] = &instanceState{up: true, familyUpdated: map[corev1.IPFamily]time.Time{}, lastRun: h.clock.Now()}
	h.logger.V(2).Info("Tracking instance health", "instance", name)
}

// RemoveInstance stops tracking an instance, so it no longer counts towards node health.
func (h *ProxyHealth) RemoveInstance(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.instances, name)
	h.logger.V(2).Info("Stopped tracking instance health", "instance", name)
}

// QueuedUpdate records that the instance received a change it has not yet applied. If
// Updated does not follow within the instance's health timeout, the instance is unhealthy.
func (h *ProxyHealth) QueuedUpdate(instance string) {
	h.update(instance, func(st *instanceState) {
		if st.oldestQueued.IsZero() {
			st.oldestQueued = h.clock.Now()
		}
	})
}

// Updated records that the instance finished a successful sync of the given IP families
// (an instance syncs all of its families at once): nothing is pending any more.
func (h *ProxyHealth) Updated(instance string, families ...corev1.IPFamily) {
	h.update(instance, func(st *instanceState) {
		now := h.clock.Now()
		st.oldestQueued = time.Time{}
		st.lastUpdated = now
		st.lastRun = now
		for _, f := range families {
			st.familyUpdated[f] = now
		}
	})
}

// SetInstanceError records the instance's last sync error for /status; nil
// clears it. An error does not by itself make the instance unhealthy: as upstream, a failing
// sync shows up as a queued update that goes stale.
func (h *ProxyHealth) SetInstanceError(instance string, err error) {
	h.update(instance, func(st *instanceState) {
		st.lastError = ""
		if err != nil {
			st.lastError = err.Error()
		}
	})
}

// SyncFinished records that the instance's sync loop finished a sync, failed or not:
// the loop is running. Updated implies it.
func (h *ProxyHealth) SyncFinished(instance string) {
	h.update(instance, func(st *instanceState) { st.lastRun = h.clock.Now() })
}

// SetInstanceCounts records how many Services and endpoints the instance programmed in its
// last sync, for /status.
func (h *ProxyHealth) SetInstanceCounts(instance string, services, endpoints int) {
	h.update(instance, func(st *instanceState) {
		st.services = services
		st.endpoints = endpoints
	})
}

// SetInstanceUp records whether the instance is running, and reason why it is down (shown
// only on /status). A down instance (crashed, restarting) is unhealthy whatever its sync
// state, but not dead for /livez: the supervisor restarts it, and once it is back up its
// pending update has a whole timeout again before /livez counts it as stale.
func (h *ProxyHealth) SetInstanceUp(instance string, up bool, reason string) {
	h.update(instance, func(st *instanceState) {
		if st.up != up {
			h.logger.V(2).Info("Instance health changed", "instance", instance, "up", up, "reason", reason)
			if up {
				st.upSince = h.clock.Now()
			}
		}
		if up {
			// The supervisor (re)starts the loop: its first sync has a whole bound.
			st.lastRun = h.clock.Now()
		}
		st.up = up
		st.downReason = ""
		if !up {
			st.downReason = reason
		}
	})
}

// SetNodeDeleting records whether this node's Node object has a deletionTimestamp. A
// deleting node fails /healthz, so load balancers drain it, but not /livez, so the kubelet
// does not restart a proxy that is working.
func (h *ProxyHealth) SetNodeDeleting(deleting bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.nodeDeleting != deleting {
		h.logger.V(2).Info("Node deletion state changed", "deleting", deleting)
	}
	h.nodeDeleting = deleting
}

// SetNodeToBeDeleted records whether this node's Node carries the cluster autoscaler's
// ToBeDeletedTaint. As upstream's, such a node is not eligible: it fails /healthz, so
// load balancers drain it before the autoscaler removes it, but not /livez.
func (h *ProxyHealth) SetNodeToBeDeleted(toBeDeleted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.nodeToBeDeleted != toBeDeleted {
		h.logger.V(2).Info("Node autoscaler deletion taint changed", "taint", ToBeDeletedTaint, "present", toBeDeleted)
	}
	h.nodeToBeDeleted = toBeDeleted
}

// Healthy reports whether the instance is healthy, ignoring node deletion like upstream's
// IsHealthy. An instance that is not tracked is not healthy: nothing proxies its Services.
func (h *ProxyHealth) Healthy(instance string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	st, ok := h.instances[instance]
	if !ok {
		return false
	}
	return h.healthyLocked(instance, st, h.clock.Now())
}

// Live reports whether the instance passes /livez: it is down (the supervisor's to
// restart) or has no update that went stale while it was up. An instance that is not
// tracked is not live.
func (h *ProxyHealth) Live(instance string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	st, ok := h.instances[instance]
	if !ok {
		return false
	}
	return h.liveLocked(instance, st, h.clock.Now())
}

// update applies fn to a tracked instance's state. Calls for an instance that is not
// tracked are dropped: they come from an instance being removed, and must not bring it back.
func (h *ProxyHealth) update(instance string, fn func(*instanceState)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.instances[instance]
	if !ok {
		h.logger.V(4).Info("Ignoring health update for untracked instance", "instance", instance)
		return
	}
	fn(st)
}

// healthyLocked is the upstream verdict plus the up flag and the stuck loop; h.mu must
// be held.
func (h *ProxyHealth) healthyLocked(instance string, st *instanceState, now time.Time) bool {
	return st.up && h.staleLocked(instance, st, now, false) == ""
}

// liveLocked is the instance's /livez verdict; h.mu must be held: a down instance is
// live (the supervisor restarts it), an up one unless it is stale, counting only the
// time it has been up.
func (h *ProxyHealth) liveLocked(instance string, st *instanceState, now time.Time) bool {
	return !st.up || h.staleLocked(instance, st, now, true) == ""
}

// staleLocked says why the instance is behind its bound, or "": as upstream, a pending
// update goes stale once it is as old as the timeout (with sinceUp, only the time the
// instance has been up counts); beyond upstream, a sync loop that has finished no sync
// for StuckFactor timeouts is stuck, pending work or not. h.mu must be held.
func (h *ProxyHealth) staleLocked(instance string, st *instanceState, now time.Time, sinceUp bool) string {
	timeout := h.timeout(instance)
	if !st.oldestQueued.IsZero() {
		since := st.oldestQueued
		if sinceUp && st.upSince.After(since) {
			since = st.upSince
		}
		if age := now.Sub(since); age >= timeout {
			return fmt.Sprintf("an update queued %s ago is not programmed (health timeout %s)", age.Round(time.Millisecond), timeout)
		}
	}
	return h.stuckLocked(instance, st, now)
}

// stuckLocked says why the instance's sync loop, while up, is stuck, or "". h.mu must be
// held.
func (h *ProxyHealth) stuckLocked(instance string, st *instanceState, now time.Time) string {
	bound := StuckFactor * h.timeout(instance)
	if idle := now.Sub(st.lastRun); st.up && idle >= bound {
		return fmt.Sprintf("no sync finished for %s (bound %s): the sync loop is stuck", idle.Round(time.Millisecond), bound)
	}
	return ""
}

// Idle is how long the instance's sync loop, while up, has finished no sync (0 while it
// is down or not tracked): the supervisor restarts an instance idle for too long.
func (h *ProxyHealth) Idle(instance string) time.Duration {
	h.mu.RLock()
	defer h.mu.RUnlock()
	st, ok := h.instances[instance]
	if !ok || !st.up {
		return 0
	}
	return h.clock.Now().Sub(st.lastRun)
}

// staleOf is staleLocked's reason for an instance that is up, "" for one that is down
// (DownReason says why). h.mu must be held.
func (h *ProxyHealth) staleOf(instance string, st *instanceState, now time.Time) string {
	if !st.up {
		return ""
	}
	return h.staleLocked(instance, st, now, false)
}

// Stale returns, for each tracked instance, why it is stale ("" when it is not), for the
// per-instance metric.
func (h *ProxyHealth) Stale() map[string]string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	now := h.clock.Now()
	out := make(map[string]string, len(h.instances))
	for name, st := range h.instances {
		out[name] = h.staleOf(name, st, now)
	}
	return out
}

// HealthResponse is the body of /healthz and /livez: upstream kube-proxy's fields (its
// ProxyHealth) with their meaning, plus the state of each instance. It is served on every
// address the health server listens on, so it holds verdicts and times only, never error
// text.
type HealthResponse struct {
	// LastUpdated is, as upstream, the current time when the response is 200 (older
	// clients read a recent value as "synced") and otherwise the newest successful sync
	// of any instance (zero before the first).
	LastUpdated time.Time `json:"lastUpdated"`
	// CurrentTime is when the response was built.
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is false when the Node is being deleted; only /healthz reports it.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is the verdict on the instances, without the node's eligibility (as
	// upstream): on /healthz, false only when no instance is healthy; on /livez, false
	// only when instances are up and none of them is live (the whole node is wedged).
	Healthy bool `json:"healthy"`
	// Status is the health of each IP family the instances have programmed, keyed
	// "IPv4" and "IPv6" as upstream; absent before the first sync.
	Status map[corev1.IPFamily]FamilyHealth `json:"status,omitempty"`
	// Instances is the health of each instance, by name.
	Instances map[string]InstanceHealth `json:"instances"`
}

// FamilyHealth is the health of one IP family over the node's instances, upstream's
// per-family ProxierHealth.
type FamilyHealth struct {
	// LastUpdated is the oldest of the instances' last successful syncs of the family:
	// every instance programming it has synced it since.
	LastUpdated time.Time `json:"lastUpdated"`
	// Healthy is true when every instance that programs the family is healthy (live, on
	// /livez).
	Healthy bool `json:"healthy"`
}

// InstanceHealth is the health of one instance as /healthz, /livez and /status report it.
type InstanceHealth struct {
	// Healthy is the instance's verdict: false while it is down or stale (a queued update
	// older than its health timeout, or a sync loop that finished no sync for twice it).
	// /livez gives its own verdict, which ignores whether the instance is up and counts
	// only the time it has been up; /healthz and /status give the full one. Neither
	// endpoint fails for one instance among live ones.
	Healthy bool `json:"healthy"`
	// LastUpdated is when the last successful sync finished; absent before the first.
	LastUpdated time.Time `json:"lastUpdated,omitzero"`
	// LastQueued is when the oldest update not yet applied was queued; absent when none is.
	LastQueued time.Time `json:"lastQueued,omitzero"`
	// Up is false while the instance is crashed or restarting.
	Up bool `json:"up"`
}

// StatusResponse is the body of /status.
type StatusResponse struct {
	// CurrentTime is when the response was built.
	CurrentTime time.Time `json:"currentTime"`
	// NodeDeleting is true when the Node object has a deletionTimestamp.
	NodeDeleting bool `json:"nodeDeleting"`
	// NodeToBeDeleted is true when the Node carries the cluster autoscaler's
	// ToBeDeletedTaint (ToBeDeletedByClusterAutoscaler).
	NodeToBeDeleted bool `json:"nodeToBeDeleted,omitempty"`
	// Instances is the status of each instance, by name.
	Instances map[string]InstanceStatus `json:"instances"`
	// ListenErrors says, per server ("healthz", "metrics", "healthCheckNodePorts"), why
	// it does not listen (another process holds its address); retried with backoff.
	ListenErrors map[string]string `json:"listenErrors,omitempty"`
	// Unserved says, per server ("healthCheckNodePorts"), what it does not serve because
	// the configuration and the Services ask what it cannot do (a Service in an IP family
	// its instance has no node port address in); unlike ListenErrors, it does not fail
	// /readyz.
	Unserved map[string]string `json:"unserved,omitempty"`
	// Config is the configuration file in force; nil when the supervisor was given none.
	Config *ConfigStatus `json:"config,omitempty"`
	// NodeAddresses is the published node address list's state; nil unless the node
	// reads one (otherNodeAddresses: published).
	NodeAddresses *NodeAddressesStatus `json:"nodeAddresses,omitempty"`
}

// InstanceStatus is the state of one instance as /status reports it: its health plus the
// details that stay on loopback.
type InstanceStatus struct {
	InstanceHealth
	// LastError is the last sync error, empty when the last sync succeeded.
	LastError string `json:"lastError"`
	// DownReason says why the instance is down; after a panic, it holds the stack.
	DownReason string `json:"downReason,omitempty"`
	// Stale says why the instance, while up, is behind its bound (a stale queued update,
	// a stuck sync loop); empty when it is not.
	Stale string `json:"stale,omitempty"`
	// Services is how many Services the instance programmed in its last sync.
	Services int `json:"services"`
	// Endpoints is how many endpoints the instance programmed in its last sync.
	Endpoints int `json:"endpoints"`
}

// snapshot is a consistent copy of the state, taken under the lock, that the handlers
// render without holding it.
type snapshot struct {
	now             time.Time
	nodeDeleting    bool
	nodeToBeDeleted bool
	listenErrors    map[string]string
	unserved        map[string]string
	config          *ConfigStatus
	nodeAddrs       *NodeAddressesStatus
	instances       map[string]InstanceStatus
	// live is each instance's /livez verdict.
	live map[string]bool
	// families is, for each instance, when it last synced each family it programs.
	families map[string]map[corev1.IPFamily]time.Time
}

func (h *ProxyHealth) snapshot() snapshot {
	h.mu.RLock()
	defer h.mu.RUnlock()
	s := snapshot{
		now:             h.clock.Now(),
		nodeDeleting:    h.nodeDeleting,
		nodeToBeDeleted: h.nodeToBeDeleted,
		listenErrors:    maps.Clone(h.listenErrors),
		unserved:        maps.Clone(h.unserved),
		config:          h.config,
		nodeAddrs:       h.nodeAddresses,
		instances:       make(map[string]InstanceStatus, len(h.instances)),
		live:            make(map[string]bool, len(h.instances)),
		families:        make(map[string]map[corev1.IPFamily]time.Time, len(h.instances)),
	}
	for name, st := range h.instances {
		s.live[name] = h.liveLocked(name, st, s.now)
		s.families[name] = maps.Clone(st.familyUpdated)
		s.instances[name] = InstanceStatus{
			InstanceHealth: InstanceHealth{
				Healthy:     h.healthyLocked(name, st, s.now),
				LastUpdated: st.lastUpdated,
				LastQueued:  st.oldestQueued,
				Up:          st.up,
			},
			LastError:  st.lastError,
			DownReason: st.downReason,
			Stale:      h.staleOf(name, st, s.now),
			Services:   st.services,
			Endpoints:  st.endpoints,
		}
	}
	return s
}

// healthResponse builds the /healthz body and verdict (withNode), or the /livez ones,
// where each instance's verdict is its live one. /healthz fails on the instances only
// when there are some and none is healthy; /livez only when some instance is up and
// none of those up is live (the node wedged as a whole: one stale instance among live
// ones does not fail it, and instances that are all down do not either, since the
// supervisor restarts them itself). An instance syncs all its families at once, so its
// verdict is also its verdict on each family.
func (s snapshot) healthResponse(withNode bool) (HealthResponse, bool) {
	resp := HealthResponse{
		CurrentTime: s.now,
		Instances:   make(map[string]InstanceHealth, len(s.instances)),
	}
	healthyCount, unhealthyCount, upCount, upLive := 0, 0, 0, 0
	var newest time.Time
	for name, status := range s.instances {
		st := status.InstanceHealth
		if !withNode {
			st.Healthy = s.live[name]
		}
		resp.Instances[name] = st
		if st.LastUpdated.After(newest) {
			newest = st.LastUpdated
		}
		for fam, synced := range s.families[name] {
			fh, seen := resp.Status[fam]
			if !seen {
				if resp.Status == nil {
					resp.Status = map[corev1.IPFamily]FamilyHealth{}
				}
				fh = FamilyHealth{LastUpdated: synced, Healthy: true}
			}
			if synced.Before(fh.LastUpdated) {
				fh.LastUpdated = synced
			}
			fh.Healthy = fh.Healthy && st.Healthy
			resp.Status[fam] = fh
		}
		if st.Healthy {
			healthyCount++
		} else {
			unhealthyCount++
		}
		if st.Up {
			upCount++
			if s.live[name] {
				upLive++
			}
		}
	}
	if withNode {
		resp.Healthy = unhealthyCount == 0 || healthyCount > 0
	} else {
		// Only a wedge of the whole node is the kubelet's to fix by restarting the pod:
		// one stale instance is shown per instance, and restarting the pod for it would
		// stop every other tenant's too.
		resp.Healthy = upCount == 0 || upLive > 0
	}
	healthy := resp.Healthy
	if withNode {
		eligible := !s.nodeDeleting && !s.nodeToBeDeleted
		resp.NodeEligible = &eligible
		healthy = healthy && eligible
	}
	resp.LastUpdated = newest
	if healthy {
		resp.LastUpdated = s.now
	}
	return resp, healthy
}

// Status returns what /status serves: each instance's health, counts and errors. The
// node status the supervisor publishes is built from it.
func (h *ProxyHealth) Status() StatusResponse {
	s := h.snapshot()
	return StatusResponse{
		CurrentTime:     s.now,
		NodeDeleting:    s.nodeDeleting,
		NodeToBeDeleted: s.nodeToBeDeleted,
		Instances:       s.instances,
		ListenErrors:    s.listenErrors,
		Unserved:        s.unserved,
		Config:          s.config,
		NodeAddresses:   s.nodeAddrs,
	}
}

// Handler returns the handler for /healthz, /livez and /status. /status answers 403 to
// clients that are not on loopback: its errors and stacks are for the node's operator
// (`shardproxy status` on the node), not for whoever can reach the health port.
func (h *ProxyHealth) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		resp, healthy := h.snapshot().healthResponse(true)
		writeJSON(h.logger, w, statusCode(healthy), resp)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		resp, healthy := h.snapshot().healthResponse(false)
		writeJSON(h.logger, w, statusCode(healthy), resp)
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		if !fromLoopback(r) {
			h.logger.V(4).Info("Refused /status to a client not on loopback", "client", r.RemoteAddr)
			http.Error(w, statusForbidden, http.StatusForbidden)
			return
		}
		writeJSON(h.logger, w, http.StatusOK, h.Status())
	})
	mux.HandleFunc(ReadyzPath, h.serveReadyz)
	return mux
}

// Serve listens on addr and serves Handler until ctx is done, then shuts down gracefully.
// A failure to bind is returned at once.
func (h *ProxyHealth) Serve(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening for proxy health on %s: %w", addr, err)
	}
	return h.ServeListener(ctx, l)
}

// ServeListener serves Handler on l until ctx is done, then shuts down gracefully. It
// takes ownership of l. Tests use it to serve on an ephemeral port they can address.
func (h *ProxyHealth) ServeListener(ctx context.Context, l net.Listener) error {
	logger := klog.FromContext(ctx).WithValues("address", l.Addr().String())
	logger.V(2).Info("Serving proxy health")
	err := Serve(ctx, l, h.Handler())
	logger.V(2).Info("Stopped serving proxy health")
	if err != nil {
		return fmt.Errorf("proxy health: %w", err)
	}
	return nil
}
