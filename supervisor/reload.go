package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/tables"
)

// A live configuration change. The supervisor reads its configuration file every
// ConfigPoll; a changed content that reads the same twice in a row (a ConfigMap volume
// swaps a symlink; an editor may write in steps) is applied to the instance set:
//
//   - an added instance starts and takes its Services, handed over as a relabel hands a
//     Service over (its old owner lets go once it has programmed them);
//   - a removed instance lets go of its Services the same way; once it holds none its
//     loop stops and its tables are deleted;
//   - an instance whose table settings changed is restarted alone, with the same tables;
//     one whose routing alone changed (default, proxyNames, tenant) keeps running;
//   - the other instances are not touched: same loop, same tables, no resync.
//
// Without a default instance the node watches only the Services of its proxy names: a
// change of those names rescopes the watches (Watches.Rescope) before the switch.
//
// A file that does not validate, that changes a node-wide field (those of
// config.FixedChanges), or that adds or removes the default instance (whether the node
// watches every Service) is refused with one log line and an Event on this Node; the
// running configuration stays in force.

// defaultConfigPoll is how often the configuration file is read for changes.
const defaultConfigPoll = 2 * time.Second

// instanceLoop is one instance's supervised loop, stopped alone when a live change
// restarts or removes the instance.
type instanceLoop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startInstance starts p's supervised loop.
func (s *Supervisor) startInstance(ctx context.Context, wg *sync.WaitGroup, p *instance.Proxy) {
	ctx, cancel := context.WithCancel(ctx)
	l := &instanceLoop{cancel: cancel, done: make(chan struct{})}
	s.instancesMu.Lock()
	s.loops[p.Name()] = l
	s.instancesMu.Unlock()
	wg.Go(func() {
		defer close(l.done)
		s.superviseInstance(ctx, p)
	})
}

// stopInstance stops an instance's loop and waits for it to end. Its rules stay.
func (s *Supervisor) stopInstance(name string) {
	s.instancesMu.Lock()
	l := s.loops[name]
	delete(s.loops, name)
	s.instancesMu.Unlock()
	if l != nil {
		l.cancel()
		<-l.done
	}
}

// configHash names a configuration file's content: the first 16 hex digits of its
// SHA-256.
func configHash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// setConfigApplied records the configuration in force, and why a newer file was
// refused ("" if none was), in /status and the metrics.
func (s *Supervisor) setConfigApplied(hash string, applied time.Time, refused string) {
	// The metrics first: whoever sees /status's new hash sees them too.
	s.metrics.SetConfig(hash, applied)
	s.health.SetConfig(healthcheck.ConfigStatus{Hash: hash, Applied: applied, Refused: refused})
}

// watchConfig reads the configuration file every ConfigPoll and applies a changed
// content once two reads in a row agree, until ctx ends. Applying runs here, one
// change at a time.
func (s *Supervisor) watchConfig(ctx context.Context, wg *sync.WaitGroup) {
	poll := s.deps.ConfigPoll
	current, pending := configHash(s.deps.ConfigData), ""
	var lastErr string
	runEvery(ctx, poll, func() {
		data, err := os.ReadFile(s.deps.ConfigFile)
		if err != nil {
			// A ConfigMap volume's update swaps a symlink: a read may fail in between.
			if err.Error() != lastErr {
				s.logger.Error(err, "Reading the configuration file for changes", "config", s.deps.ConfigFile)
				lastErr = err.Error()
			}
			return
		}
		lastErr = ""
		switch h := configHash(data); {
		case h == current:
			pending = ""
		case h != pending:
			pending = h // settle first: applied if the next read agrees
		default:
			pending, current = "", h
			s.applyConfig(ctx, wg, data, h)
		}
	})
}

// applyConfig applies a changed configuration file's content, or refuses it.
func (s *Supervisor) applyConfig(ctx context.Context, wg *sync.WaitGroup, data []byte, hash string) {
	logger := s.logger.WithValues("config", s.deps.ConfigFile, "hash", hash)
	next, err := config.Parse(data, s.deps.ConfigFile)
	if err != nil {
		s.refuseConfig(logger, metrics.ReloadInvalid, "ConfigInvalid",
			"The changed configuration is invalid; the running one stays in force: "+err.Error())
		return
	}
	if fixed := config.FixedChanges(s.cfg, next); len(fixed) > 0 {
		s.refuseConfig(logger, metrics.ReloadRefused, "ConfigRefused", fmt.Sprintf(
			"The changed configuration changes %s, which cannot change while shardproxy runs (restart its pods to apply it); the running configuration stays in force",
			strings.Join(fixed, ", ")))
		return
	}
	scope, was := watchScope(next.Instances, s.watches.ServiceCIDRsServed()), s.watches.Scope()
	if scopedBy(scope) != scopedBy(was) {
		s.refuseConfig(logger, metrics.ReloadRefused, "ConfigRefused",
			"The changed configuration adds or removes the default instance, which changes whether this node watches every Service: restart its pods to apply it; the running configuration stays in force")
		return
	}
	if next.WatchesOtherNodes() && !s.watches.WatchesOtherNodes() {
		s.refuseConfig(logger, metrics.ReloadRefused, "ConfigRefused",
			"The changed configuration makes an instance serve externalIPs or load-balancer IPs where none did, which needs the watch of every Node's addresses (reserveOtherNodeAddresses): restart its pods to apply it; the running configuration stays in force")
		return
	}
	var rescope func() error
	if !slices.Equal(scope, was) {
		rescope = func() error { return s.watches.Rescope(ctx, scope, s.deps.RescopeTimeout) }
	}
	plan := planReload(s.instanceSpecs(), next.Instances)
	removed, err := s.reconfigure(ctx, wg, next, plan, rescope)
	if err != nil {
		s.refuseConfig(logger, metrics.ReloadRefused, "ConfigRefused",
			"Applying the changed configuration failed; the running one stays in force: "+err.Error())
		return
	}
	s.metrics.ConfigReloaded(metrics.ReloadApplied)
	s.setConfigApplied(hash, time.Now(), "")
	logger.Info("Applied a changed configuration", "added", plan.added, "removed", plan.removed,
		"restarted", plan.replaced, "rerouted", plan.rerouted, "unchanged", plan.unchanged)
	for name, p := range removed {
		s.retire(ctx, name, p)
	}
}

// refuseConfig reports a changed configuration that is not applied: one log line, an
// Event on this Node, the metric and /status.
func (s *Supervisor) refuseConfig(logger klog.Logger, result, reason, msg string) {
	logger.Info("Refused a changed configuration", "reason", reason, "why", msg)
	s.metrics.ConfigReloaded(result)
	s.health.RefuseConfig(msg)
	// The Event last: whoever sees it sees the metric and /status too.
	if r, ok := s.deps.Recorder.(NodeRecorder); ok {
		r.NodeEventf(corev1.EventTypeWarning, reason, "%s", msg)
	}
}

// reloadPlan is what a live change does to each instance, by name.
type reloadPlan struct {
	added, removed, replaced, rerouted, unchanged []string
}

// planReload compares the running instances with the next ones. An instance whose
// settings differ only in what routes Services to it (default, proxyNames, tenant) is
// rerouted, not restarted: its tables do not depend on them.
func planReload(running, next []config.Instance) reloadPlan {
	var p reloadPlan
	was := map[string]config.Instance{}
	for _, in := range running {
		was[in.Name] = in
	}
	for _, in := range next {
		old, ok := was[in.Name]
		delete(was, in.Name)
		switch {
		case !ok:
			p.added = append(p.added, in.Name)
		case reflect.DeepEqual(old, in):
			p.unchanged = append(p.unchanged, in.Name)
		case reflect.DeepEqual(withoutRouting(old), withoutRouting(in)):
			p.rerouted = append(p.rerouted, in.Name)
		default:
			p.replaced = append(p.replaced, in.Name)
		}
	}
	p.removed = slices.Sorted(maps.Keys(was))
	return p
}

// withoutRouting is an instance's configuration less what only routes Services to it.
func withoutRouting(in config.Instance) config.Instance {
	in.Default, in.ProxyNames, in.Tenant = false, nil, config.Tenant{}
	return in
}

// defaultRescopeTimeout bounds the wait for the initial lists of the watches a live change
// adds.
const defaultRescopeTimeout = 2 * time.Minute

// reconfigure switches the instance set to next's: the new instances are built and the
// watches rescoped when the proxy names they select change (a failure of either changes
// nothing), the restarted instances' loops stopped, the set swapped, every Service the
// change concerns routed again, and the new loops started. The removed instances keep
// running until retire; reconfigure returns them.
func (s *Supervisor) reconfigure(ctx context.Context, wg *sync.WaitGroup, next *config.Config, plan reloadPlan, rescope func() error) (map[string]*instance.Proxy, error) {
	router, specs, err := buildRouter(next)
	if err != nil {
		return nil, err
	}
	s.nodeMu.Lock()
	node := s.node
	s.nodeMu.Unlock()
	running, runningSpecs := s.running()
	fresh := map[string]*instance.Proxy{}
	for _, name := range slices.Concat(plan.added, plan.replaced) {
		p, err := s.newInstance(specs[name], node)
		if err != nil {
			return nil, fmt.Errorf("instance %q: %w", name, err)
		}
		if old, ok := runningSpecs[name]; ok && *old.Slot != *specs[name].Slot {
			// Its base chains move to other priorities: a table's chains cannot be
			// re-hooked in place, so the first full sync recreates it, in one transaction.
			for _, fam := range instanceFamilies() {
				p.RecreateTable(fam)
			}
		}
		fresh[name] = p
	}
	if rescope != nil {
		// Before the switch: the objects of proxy names no longer watched leave their
		// instances as when a Service's label moves to a proxy nothing here runs.
		if err := rescope(); err != nil {
			return nil, err
		}
	}
	// A restarted instance's successor writes the same tables: the old loop ends first.
	// The rules stay in place meanwhile, and the successor's first sync is a full one.
	for _, name := range plan.replaced {
		s.stopInstance(name)
	}
	s.instancesMu.Lock()
	instances := maps.Clone(running)
	maps.Copy(instances, fresh)
	removed := map[string]*instance.Proxy{}
	for _, name := range plan.removed {
		removed[name] = instances[name]
		delete(instances, name)
	}
	s.instances, s.specs, s.order, s.router = instances, specs, slices.Clone(next.Instances), router
	s.instancesMu.Unlock()
	for _, name := range slices.Concat(plan.added, plan.replaced) {
		s.listenHealthChecks(instances[name])
	}
	for _, name := range plan.added {
		s.health.AddInstance(name)
		s.metrics.InitInstance(name)
	}
	sinks := map[string]selector.Sink{}
	for n, p := range instances {
		sinks[n] = &countingSink{Sink: p, instance: n, counter: s.changes}
	}
	changed := slices.Concat(plan.added, plan.removed, plan.replaced, plan.rerouted)
	s.dispatcher.Reconfigure(router, sinks, plan.replaced, changed, s.watches.HeldServices())
	for _, name := range slices.Concat(plan.added, plan.replaced) {
		s.startInstance(ctx, wg, fresh[name])
	}
	return removed, nil
}

// retireWait is how often retire looks whether a removed instance has let go.
const retireWait = 100 * time.Millisecond

// retireSyncTimeout bounds how long retire waits for a removed instance to sync the
// Services it let go of.
const retireSyncTimeout = 30 * time.Second

// retire ends a removed instance once it has let go of every Service (each once its
// new owner programmed it, or after the dispatcher's handover timeout) and synced that
// (the conntrack cleanup of a Service nobody serves any more follows that sync, as
// after a Service's deletion): its loop stops, its tables are deleted (their rules
// would otherwise keep serving at their own priorities), and its health and metrics
// are forgotten.
func (s *Supervisor) retire(ctx context.Context, name string, p *instance.Proxy) {
	logger := s.logger.WithValues("instance", name)
	t := time.NewTicker(retireWait)
	defer t.Stop()
	for !s.dispatcher.Forget(name) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	synced := time.After(retireSyncTimeout)
	for p.AppliedCount() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-synced:
			logger.Info("A removed instance did not sync the Services it let go of in time; deleting its tables", "timeout", retireSyncTimeout, "programmed", p.AppliedCount())
		case <-t.C:
			continue
		}
		break
	}
	s.stopInstance(name)
	for _, fam := range instanceFamilies() {
		table := tables.TableName(s.cfg.TablePrefix, name)
		nft, err := s.deps.NFT(fam, table)
		if err == nil {
			err = tables.DeleteTable(ctx, nft)
		}
		if err != nil {
			logger.Error(err, "Deleting the table of a removed instance", "family", tables.KnftFamily(fam), "table", table)
			s.metrics.CleanupFailed(name, fam.String())
		}
	}
	s.svcHC.SyncServices(name, nil)
	s.svcHC.SyncEndpoints(name, nil)
	s.health.RemoveInstance(name)
	s.metrics.ForgetInstance(name)
	logger.Info("Removed an instance: its Services were handed over and its tables deleted")
}
