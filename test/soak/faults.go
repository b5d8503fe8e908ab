package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shardproxy/shardproxy/test/e2e/env"
)

// Fault kinds, in the order the summary lists them.
const (
	faultAPIServer   = "apiserver-restart"
	faultCompaction  = "etcd-compaction"
	faultKill        = "kill9-full-sync"
	faultTable       = "nft-table-delete"
	faultChain       = "nft-chain-flush"
	faultElement     = "nft-element-remove"
	faultNFT         = "nft-fail"
	faultNetlink     = "netlink-fail"
	faultConntrack   = "conntrack-full"
	apiserverOutage  = 30 * time.Second
	failureWindow    = 20 * time.Second
	maxFailureWindow = 2 * time.Minute
	// relistTimeout bounds how long a change made while the supervisor's watches were
	// down may take to reach the kernel: client-go's reflector backs off up to 30 s, with
	// as much jitter again, after failed attempts (seen: up to 61 s).
	relistTimeout = 150 * time.Second
	// periodicWait is how long the kill fault waits for a periodic full sync to hold
	// (fullSyncPeriod is 30 s per instance): past twice fullSyncPeriod, and by more than
	// a full sync takes, so that when none came every instance is over the full-sync
	// watch's limit at the kill, and the stall fails the soak rather than being cut short
	// by it (a CI soak saw the three instances' periodic full syncs stall 1m51s).
	periodicWait     = 2*fullSyncPeriod + 15*time.Second
	conntrackWindow  = 10 * time.Second
	conntrackMark    = 0x50a1
	victimsPerExpiry = 5
)

// watchExpiredLog is what client-go's reflector logs (at V(4)) when a watch resumed from a
// compacted resource version: the API's message for 410 Gone.
const watchExpiredLog = "The resourceVersion for the provided watch is too old."

// errNoEffect marks a fault that changed nothing (no element to remove, every chain
// already empty, a failure window in which nothing failed): it is not counted as
// injected, and the summary says how many there were.
var errNoEffect = errors.New("changed nothing")

var faultKinds = []string{faultAPIServer, faultCompaction, faultKill, faultTable, faultChain, faultElement, faultNFT, faultNetlink, faultConntrack}

// damagedInstances are the instances whose whole tables and chains the nft faults break:
// not the default instance, which serves the steady Services (whose probes must never
// fail). Single elements are removed from every instance, never a steady Service's.
var damagedInstances = []string{"team-a", "team-b"}

// injector injects the faults.
type injector struct {
	s *soak
}

// inject runs one fault of kind and returns what it did.
func (in *injector) inject(ctx context.Context, kind string, n int, r *rand.Rand) (string, error) {
	switch kind {
	case faultAPIServer:
		return in.apiserverRestart(ctx, n)
	case faultCompaction:
		return in.expireWatches(ctx, n)
	case faultKill:
		return in.killDuringFullSync(ctx)
	case faultTable:
		return in.deleteTable(ctx, r)
	case faultChain:
		return in.flushChain(ctx, r)
	case faultElement:
		return in.removeElement(ctx, r)
	case faultNFT:
		return in.failNFT(ctx)
	case faultNetlink:
		return in.failNetlink(ctx)
	case faultConntrack:
		return in.fillConntrack(ctx)
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}

// apiserverRestart stops kube-apiserver for apiserverOutage, starts it again, and at
// once creates a Service, which must reach the kernel.
func (in *injector) apiserverRestart(ctx context.Context, n int) (string, error) {
	cp := in.s.e.CP
	if err := cp.StopAPIServer(); err != nil {
		return "", err
	}
	if err := sleep(ctx, apiserverOutage); err != nil {
		return "", err
	}
	if err := cp.StartAPIServer(context.WithoutCancel(ctx)); err != nil {
		return "", err
	}
	back := time.Now()
	svc, err := in.s.createMarker(ctx, fmt.Sprintf("after-restart-%d", n))
	if err != nil {
		return "", fmt.Errorf("creating a Service after the restart: %w", err)
	}
	landed, err := in.s.waitClusterIP(ctx, svc, true, relistTimeout)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("down %v; a Service created right after it returned was programmed %v after its return", apiserverOutage, landed.Sub(back).Round(time.Millisecond)), nil
}

// expireWatches runs watchExpiry, and once more if no watch expired: a reflector that was
// listing, or whose watch broke with an error rather than ending, lists again without
// resuming (the deleted Services must still leave the kernel, and did).
func (in *injector) expireWatches(ctx context.Context, n int) (string, error) {
	detail, err := in.watchExpiry(ctx, n*10)
	if errors.Is(err, errNoWatchExpired) {
		in.s.logf("fault %s #%d: %v; once more", faultCompaction, n, err)
		detail, err = in.watchExpiry(ctx, n*10+1)
	}
	return detail, err
}

var errNoWatchExpired = errors.New("no watch expired")

// watchExpiry makes the supervisor's watches resume from resource versions etcd no
// longer has, with changes in between that no watch saw: kube-apiserver stops (its
// watches end cleanly, so the informers resume rather than list again), the node is cut
// off it (its connections are refused), it starts again, Services are deleted and etcd
// compacted, and the node reconnects: every watch gets "too old resource version" (410)
// and its informer lists again. The deleted Services must leave the kernel.
func (in *injector) watchExpiry(ctx context.Context, n int) (string, error) {
	s := in.s
	var victims []*corev1.Service
	for i := range victimsPerExpiry {
		svc, err := s.createMarker(ctx, fmt.Sprintf("expiry-%d-%d", n, i))
		if err != nil {
			return "", err
		}
		victims = append(victims, svc)
	}
	for _, v := range victims {
		if _, err := s.waitClusterIP(ctx, v, true, 90*time.Second); err != nil {
			return "", err
		}
	}
	expiredBefore := strings.Count(s.e.SupervisorLog(), watchExpiredLog)
	if err := s.e.CP.StopAPIServer(); err != nil {
		return "", err
	}
	if err := in.partition(ctx, true); err != nil {
		return "", err
	}
	healed := false
	defer func() {
		if !healed {
			_ = in.partition(context.WithoutCancel(ctx), false)
		}
	}()
	if err := s.e.CP.StartAPIServer(context.WithoutCancel(ctx)); err != nil {
		return "", err
	}
	for _, v := range victims {
		if err := s.deleteService(ctx, v.Namespace, v.Name); err != nil {
			return "", err
		}
	}
	rev, err := s.e.CP.Compact(ctx)
	if err != nil {
		return "", err
	}
	if err := in.partition(ctx, false); err != nil {
		return "", err
	}
	healed = true
	back := time.Now()
	for _, v := range victims {
		if _, err := s.waitClusterIP(ctx, v, false, relistTimeout); err != nil {
			return "", fmt.Errorf("a Service deleted while the watches were cut: %w", err)
		}
	}
	expired := strings.Count(s.e.SupervisorLog(), watchExpiredLog) - expiredBefore
	if expired == 0 {
		return "", fmt.Errorf("%w after compacting etcd at revision %d (the supervisor logged no %q)", errNoWatchExpired, rev, watchExpiredLog)
	}
	return fmt.Sprintf("compacted at revision %d; %d watches expired (410) and relisted; %d Services deleted while no watch ran left the kernel %v after the node reconnected",
		rev, expired, len(victims), time.Since(back).Round(time.Millisecond)), nil
}

// partition refuses (with a TCP reset) the node's connections to kube-apiserver, in the
// control plane's namespace; or lifts that.
func (in *injector) partition(ctx context.Context, on bool) error {
	cpNS := in.s.e.ControlPlaneNamespace()
	if !on {
		_, err := in.s.check.run(ctx, cpNS, nil, "delete", "table", "inet", "soak-partition")
		return err
	}
	script := fmt.Sprintf(`table inet soak-partition {
	chain input {
		type filter hook input priority 0;
		ip saddr %s tcp dport %d reject with tcp reset
	}
}
`, env.NodeControlPlaneIP, in.s.e.CP.Port)
	_, err := in.s.check.run(ctx, cpNS, []byte(script), "-f", "-")
	return err
}

// killDuringFullSync holds the next full sync's nft transaction (the nft wrapper waits
// while ctl/hold-full exists), kills the supervisor with SIGKILL while it waits, and
// starts it again. When no full sync comes within periodicWait (they come every
// fullSyncPeriod per instance), it kills the supervisor once first and catches the full
// sync every start begins with; the full-sync watch ends every instance's clock at each
// kill, so a stall that fallback cuts short is still reported.
func (in *injector) killDuringFullSync(ctx context.Context) (string, error) {
	s := in.s
	hold := filepath.Join(s.ctl, "hold-full")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		return "", err
	}
	defer os.Remove(hold)
	how := "a periodic full sync"
	held, err := in.waitHeld(ctx, periodicWait)
	if err != nil {
		return "", err
	}
	if held == "" {
		how = fmt.Sprintf("the full sync of its restart (no periodic one came within %v; time since each instance's last full sync: %s)",
			periodicWait, s.syncs.ages(time.Now()))
		s.syncs.stopped(time.Now(), "kill -9 of the supervisor (no full sync held within "+periodicWait.String()+")")
		if err := s.e.StopSupervisor(syscall.SIGKILL); err != nil {
			return "", err
		}
		s.syncs.started()
		if err := s.e.StartSupervisor(); err != nil {
			return "", err
		}
		if held, err = in.waitHeld(ctx, time.Minute); err != nil {
			return "", err
		}
		if held == "" {
			return "", fmt.Errorf("a restarted supervisor began no full sync within 1m")
		}
	}
	table, _ := os.ReadFile(held)
	s.syncs.stopped(time.Now(), "kill -9 of the supervisor")
	if err := s.e.StopSupervisor(syscall.SIGKILL); err != nil {
		return "", err
	}
	os.Remove(hold)
	if m, _ := filepath.Glob(filepath.Join(s.ctl, "held.*")); len(m) > 0 {
		for _, f := range m {
			os.Remove(f)
		}
	}
	s.syncs.started()
	if err := s.e.StartSupervisor(); err != nil {
		return "", err
	}
	start := time.Now()
	if err := s.e.WaitHealthy(ctx, 3*time.Minute); err != nil {
		return "", err
	}
	return fmt.Sprintf("killed while %s of %s waited to commit; restarted, healthy after %v", how, strings.TrimSpace(string(table)), time.Since(start).Round(time.Millisecond)), nil
}

// waitHeld waits up to timeout for the nft wrapper to hold a full sync, and returns its
// marker file, or "" if none came.
func (in *injector) waitHeld(ctx context.Context, timeout time.Duration) (string, error) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		if m, _ := filepath.Glob(filepath.Join(in.s.ctl, "held.*")); len(m) > 0 {
			return m[0], nil
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return "", err
		}
	}
	return "", nil
}

// deleteTable deletes a whole table of a team instance and waits for it to come back.
func (in *injector) deleteTable(ctx context.Context, r *rand.Rand) (string, error) {
	k := tableKey{damagedInstances[r.IntN(len(damagedInstances))], families[r.IntN(len(families))]}
	name := k.String()
	if _, err := in.s.check.run(ctx, in.s.e.TP.Node, nil, append([]string{"delete", "table"}, strings.Fields(name)...)...); err != nil {
		return "", err
	}
	start := time.Now()
	for time.Since(start) < time.Minute {
		if _, err := in.s.check.run(ctx, in.s.e.TP.Node, nil, "list", "chain", k.family, k.table(), "nat-prerouting"); err == nil {
			return fmt.Sprintf("deleted table %s; rebuilt after %v", name, time.Since(start).Round(time.Millisecond)), nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("table %s not rebuilt within 1m", name)
}

// flushChain flushes a random chain with rules of a team instance's table; the next
// full sync (fullSyncPeriod) restores it.
func (in *injector) flushChain(ctx context.Context, r *rand.Rand) (string, error) {
	k := tableKey{damagedInstances[r.IntN(len(damagedInstances))], families[r.IntN(len(families))]}
	out, err := in.listWhenThere(ctx, "-j", "list", "table", k.family, k.table())
	if err != nil {
		return "", err
	}
	chains, err := chainRules(out)
	if err != nil {
		return "", err
	}
	chain, err := pickChain(chains, r)
	if err != nil {
		return "", fmt.Errorf("table %s: %w", k, err)
	}
	if _, err := in.s.check.run(ctx, in.s.e.TP.Node, nil, "flush", "chain", k.family, k.table(), chain); err != nil {
		return "", err
	}
	return fmt.Sprintf("flushed chain %s of table %s (%d rules)", chain, k, chains[chain]), nil
}

// tableGoneWait bounds how long a fault waits for a table another fault deleted (the
// table-delete fault's own bound for its rebuild).
const tableGoneWait = time.Minute

// listWhenThere runs an nft listing in the node, waiting while its table is missing:
// faults run concurrently, and one may pick a table another has just deleted and the
// instance has not rebuilt yet (seen: 11 s while the nft-fail fault failed half the
// rebuild's transactions).
func (in *injector) listWhenThere(ctx context.Context, args ...string) ([]byte, error) {
	deadline := time.Now().Add(tableGoneWait)
	for {
		out, err := in.s.check.run(ctx, in.s.e.TP.Node, nil, args...)
		if err == nil || !strings.Contains(err.Error(), "No such file or directory") || time.Now().After(deadline) {
			return out, err
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// pickChain picks a random chain that has rules: flushing an empty one would change
// nothing (errNoEffect when every chain is empty).
func pickChain(chains map[string]int, r *rand.Rand) (string, error) {
	if len(chains) == 0 {
		return "", errors.New("no chains")
	}
	var withRules []string
	for _, c := range slices.Sorted(maps.Keys(chains)) {
		if chains[c] > 0 {
			withRules = append(withRules, c)
		}
	}
	if len(withRules) == 0 {
		return "", fmt.Errorf("%w: all %d chains are empty", errNoEffect, len(chains))
	}
	return withRules[r.IntN(len(withRules))], nil
}

// chainRules counts the rules of each chain in `nft -j list table`.
func chainRules(listing []byte) (map[string]int, error) {
	var doc struct {
		Nftables []struct {
			Chain *struct{ Name string }  `json:"chain"`
			Rule  *struct{ Chain string } `json:"rule"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(listing, &doc); err != nil {
		return nil, fmt.Errorf("decoding nft's JSON: %w", err)
	}
	chains := map[string]int{}
	for _, o := range doc.Nftables {
		switch {
		case o.Chain != nil:
			chains[o.Chain.Name] += 0
		case o.Rule != nil:
			chains[o.Rule.Chain]++
		}
	}
	return chains, nil
}

// removeElement removes one service-ips element of a churned Service, from a table of
// any instance that has one.
func (in *injector) removeElement(ctx context.Context, r *rand.Rand) (string, error) {
	var keys []tableKey
	for _, inst := range in.s.instances {
		for _, fam := range families {
			keys = append(keys, tableKey{inst, fam})
		}
	}
	r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	for _, k := range keys {
		out, err := in.listWhenThere(ctx, "-j", "list", "map", k.family, k.table(), "service-ips")
		if err != nil {
			return "", err
		}
		elems, err := serviceIPKeys(out)
		if err != nil {
			return "", err
		}
		elems = slices.DeleteFunc(elems, func(e [3]string) bool { return in.s.steadyKey(e[0], e[2]) })
		if len(elems) == 0 {
			continue
		}
		e := elems[r.IntN(len(elems))]
		key := strings.Join(e[:], " . ")
		if _, err := in.s.check.run(ctx, in.s.e.TP.Node, nil, "delete", "element", k.family, k.table(), "service-ips", "{ "+key+" }"); err != nil {
			return "", err
		}
		return fmt.Sprintf("removed element { %s } of service-ips in %s", key, k), nil
	}
	return "", fmt.Errorf("%w: no element of a churned Service in the service-ips map of any table", errNoEffect)
}

// serviceIPKeys lists the keys (address, protocol, port) of the service-ips map in
// `nft -j list map`, sorted.
func serviceIPKeys(listing []byte) ([][3]string, error) {
	var doc struct {
		Nftables []struct {
			Map *struct {
				Elem [][]json.RawMessage `json:"elem"`
			} `json:"map"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(listing, &doc); err != nil {
		return nil, fmt.Errorf("decoding nft's JSON: %w", err)
	}
	var keys [][3]string
	for _, o := range doc.Nftables {
		if o.Map == nil {
			continue
		}
		for _, el := range o.Map.Elem {
			var key struct {
				Concat []any `json:"concat"`
			}
			if len(el) != 2 || json.Unmarshal(el[0], &key) != nil || len(key.Concat) != 3 {
				continue
			}
			var k [3]string
			for i, p := range key.Concat {
				k[i] = fmt.Sprint(p)
			}
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b [3]string) int { return strings.Compare(strings.Join(a[:], " "), strings.Join(b[:], " ")) })
	return keys, nil
}

// failNFT makes the nft wrapper fail half of the supervisor's nft transactions for
// failureWindow, and longer (up to maxFailureWindow) until at least one failed: a window
// in which nothing synced (the apiserver down, say) would test nothing.
func (in *injector) failNFT(ctx context.Context) (string, error) {
	failed := filepath.Join(in.s.ctl, "nft-failed")
	return in.failureWindow(ctx, "nft-fail", "50", "50% of nft", func() int { return countLines(failed) })
}

// failNetlink makes half of the supervisor's netlink transactions fail
// (SHARDPROXY_TEST_NETLINK_FAULTS), as failNFT.
func (in *injector) failNetlink(ctx context.Context) (string, error) {
	return in.failureWindow(ctx, "netlink-fail", "0.5", "50% of netlink", func() int { return strings.Count(in.s.e.SupervisorLog(), "injected netlink fault") })
}

// failureWindow writes share into the control file name for failureWindow, or until
// failures() grew (at most maxFailureWindow), and says how many transactions failed.
func (in *injector) failureWindow(ctx context.Context, name, share, what string, failures func() int) (string, error) {
	path := filepath.Join(in.s.ctl, name)
	before := failures()
	if err := os.WriteFile(path, []byte(share+"\n"), 0o644); err != nil {
		return "", err
	}
	defer os.Remove(path)
	start := time.Now()
	for time.Since(start) < failureWindow || (failures() == before && time.Since(start) < maxFailureWindow) {
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return "", err
		}
	}
	os.Remove(path)
	n := failures() - before
	if n == 0 {
		return "", fmt.Errorf("%w: no transaction failed in %v (nothing synced?)", errNoEffect, time.Since(start).Round(time.Second))
	}
	return fmt.Sprintf("%s transactions set to fail for %v: %d failed", what, time.Since(start).Round(time.Second), n), nil
}

// fillConntrack fills the node's conntrack table (assured entries nobody uses, which the
// kernel cannot evict) for conntrackWindow, then deletes them. nf_conntrack_max cannot be
// lowered in a network namespace other than the host's on this kernel (the sysctl is
// read-only there), so the table is filled up to it instead. The steady probes pause: a
// full table drops new flows in the kernel, by design.
func (in *injector) fillConntrack(ctx context.Context) (string, error) {
	s := in.s
	read := func(name string) (int, error) {
		out, err := s.e.TP.Exec(s.e.TP.Node, "cat", "/proc/sys/net/netfilter/"+name)
		if err != nil {
			return 0, fmt.Errorf("%w: %s", err, out)
		}
		return strconv.Atoi(strings.TrimSpace(out))
	}
	limit, err := read("nf_conntrack_max")
	if err != nil {
		return "", err
	}
	resume := s.probes.Pause()
	defer resume()
	defer func() {
		_, _ = s.e.TP.Exec(s.e.TP.Node, "conntrack", "-D", "-m", strconv.Itoa(conntrackMark))
	}()
	// Entries of other flows expire meanwhile: top the table up until it is full, and
	// through the window.
	next := 0
	fill := func() error {
		count, err := read("nf_conntrack_count")
		if err != nil || count >= limit {
			return err
		}
		var b strings.Builder
		for range limit - count + 16 {
			fmt.Fprintf(&b, "-I -s 10.%d.%d.%d -d 10.254.0.1 -p tcp --sport 1000 --dport 80 --state ESTABLISHED -u ASSURED -t 300 -m %d\n",
				128+(next>>16), (next>>8)&255, next&255, conntrackMark)
			next++
		}
		file := filepath.Join(s.dir, "conntrack-fill")
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			return err
		}
		// conntrack -R stops at the first entry the full table refuses: fine.
		_, _ = s.e.TP.Exec(s.e.TP.Node, "conntrack", "-R", file)
		return nil
	}
	// Probes' closed flows expire by the hundred a second while they pause: top up
	// until the table is full, right before checking that it drops a new flow.
	for range 10 {
		if err := fill(); err != nil {
			return "", err
		}
		if count, err := read("nf_conntrack_count"); err != nil || count >= limit {
			break
		}
	}
	full, err := read("nf_conntrack_count")
	if err != nil {
		return "", err
	}
	_, dialErr := s.e.TP.DialWith(s.e.TP.Client, "tcp", steadyNodeIP, int(s.steadyNodePort), dialOnce)
	for start := time.Now(); time.Since(start) < conntrackWindow; {
		if err := sleep(ctx, time.Second); err != nil {
			return "", err
		}
		if err := fill(); err != nil {
			return "", err
		}
	}
	// A full table still admits a flow when the kernel can evict one that was never
	// assured (early drop), e.g. a one-shot UDP exchange of the probes.
	effect := "a new connection to a steady NodePort still got through (early drop)"
	if dialErr != nil {
		effect = "a new connection to a steady NodePort was dropped"
	}
	return fmt.Sprintf("conntrack table full (%d of %d entries) for %v; %s", full, limit, conntrackWindow, effect), nil
}

func countLines(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(data), "\n")
}

// createMarker creates a one-port Service in soak-x (the default instance's) with one
// ready endpoint, and returns it.
func (s *soak) createMarker(ctx context.Context, name string) (*corev1.Service, error) {
	var created *corev1.Service
	err := retry(ctx, func() error {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "soak-x", Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Protocol: corev1.ProtocolTCP, Port: 7000, TargetPort: intstr.FromInt32(8000)}}}}
		var err error
		created, err = s.e.Client.CoreV1().Services("soak-x").Create(ctx, svc, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	err = retry(ctx, func() error {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "soak-x", Name: name + "-ipv4", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("p"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8000))}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.2.99"}, NodeName: ptr("node-2"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
		}
		_, err := s.e.Client.DiscoveryV1().EndpointSlices("soak-x").Create(ctx, sl, metav1.CreateOptions{})
		return err
	})
	return created, err
}

func (s *soak) deleteService(ctx context.Context, ns, name string) error {
	return retry(ctx, func() error {
		if err := s.e.Client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !refused(err) {
			return err
		}
		return s.e.Client.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	})
}

// waitClusterIP waits until the default instance's service-ips map holds (present) or
// no longer holds the Service's cluster IP, and returns when it did.
func (s *soak) waitClusterIP(ctx context.Context, svc *corev1.Service, present bool, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	want := svc.Spec.ClusterIP + " . tcp . 7000"
	for time.Now().Before(deadline) {
		out, err := s.check.run(ctx, s.e.TP.Node, nil, "list", "map", "ip", tablePrefix+"-default", "service-ips")
		if err == nil && strings.Contains(string(out), svc.Spec.ClusterIP+" . tcp . 7000") == present {
			return time.Now(), nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
	return time.Time{}, fmt.Errorf("%s/%s: %q still %s the kernel after %v", svc.Namespace, svc.Name, want, map[bool]string{true: "not in", false: "in"}[present], timeout)
}

// retry calls f until it succeeds, ctx ends or 3 minutes passed (an apiserver restart
// in between).
func retry(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}
