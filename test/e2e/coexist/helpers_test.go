package coexist

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

var tcp80 = []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8080}}

// serversOnce starts the identity servers (port 8080, TCP) on every pod once for the
// whole package; they stop with the namespaces.
var serversOnce sync.Once

func servers(t *testing.T, e *env.Env) {
	t.Helper()
	var err error
	serversOnce.Do(func() {
		for ns, name := range map[string]string{e.TP.Pod1: "pod1", e.TP.Pod2: "pod2", e.TP.Remote: "remote"} {
			if _, err = e.TP.Serve(ns, name, "tcp", "", 8080, func(string, ...any) {}); err != nil {
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// passName is the name of a Service in this pass: the nftables pass suffixes "-nft"; the
// iptables pass, which runs after, keeps the names it always had.
func passName(name string) string {
	if mode == modeNFTables {
		return name + "-nft"
	}
	return name
}

// service creates a Service on port 80 backed by pod1 and remote, labeled for proxyName
// unless it is "", and returns its cluster IP.
func service(t *testing.T, e *env.Env, name, proxyName string) string {
	t.Helper()
	name = passName(name)
	var edits []env.ServiceSpec
	if proxyName != "" {
		edits = append(edits, env.WithProxyName(proxyName))
	}
	svc, err := e.CreateService(context.Background(), "coexist", name, tcp80, []env.Backend{env.Pod1v4, env.Remotev4}, edits...)
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// reach dials until both backends (pod1, remote) answered, failing on anything else.
//
// It dials only once some proxy has rules for addr: a SYN sent before would leave an
// untranslated conntrack entry that turns away every SYN reusing its client port for two
// minutes (kubernetes/kubernetes#48719). shardproxy deletes those entries for the
// addresses it programs; kube-proxy leaves them, and the client loops that run later
// would count kube-proxy's failures as the migration's.
func reach(t *testing.T, e *env.Env, from, addr string) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, "a proxy to program "+addr, func() bool {
		out, err := e.TP.ListRuleset(e.TP.Node)
		return err == nil && strings.Contains(out, addr+" ")
	})
	seen := map[string]bool{}
	deadline := time.Now().Add(20 * time.Second)
	var lastErr error
	for len(seen) < 2 && time.Now().Before(deadline) {
		r, err := e.TP.Dial(from, "tcp", addr, 80)
		if err != nil {
			lastErr = err
			time.Sleep(50 * time.Millisecond)
			continue
		}
		seen[r.Server] = true
	}
	if !seen["pod1"] || !seen["remote"] || len(seen) != 2 {
		t.Fatalf("%s -> %s:80: reached %v, want pod1 and remote (last error %v)", from, addr, seen, lastErr)
	}
}

// load is a client dialing a Service in a loop and counting what failed.
type load struct {
	name         string
	ok, failed   atomic.Int64
	mu           sync.Mutex
	firstErrors  []string
	stop, done   chan struct{}
	from, target string
}

// startLoad dials addr:80 from namespace from every 20ms, each attempt bounded by one
// second (one SYN, no retransmission: a gap of any length shows), until stopLoad.
func startLoad(e *env.Env, name, from, addr string) *load {
	l := &load{name: name, stop: make(chan struct{}), done: make(chan struct{}), from: from, target: addr}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			began := time.Now()
			_, err := e.TP.DialWith(from, "tcp", addr, 80, netns.DialOptions{Timeout: time.Second})
			if err != nil {
				l.failed.Add(1)
				l.mu.Lock()
				if len(l.firstErrors) < 3 {
					// The wall-clock time lines the failure up with the supervisor's and
					// kube-proxy's logs (klog prints the same clock).
					l.firstErrors = append(l.firstErrors, fmt.Sprintf("%s (+%v): %v",
						began.Format("15:04:05.000"), time.Since(began).Round(time.Millisecond), err))
				}
				l.mu.Unlock()
			} else {
				l.ok.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return l
}

// finish stops the loop and reports its counts (also on stdout, for the record).
func (l *load) finish(t *testing.T) (ok, failed int64) {
	t.Helper()
	close(l.stop)
	<-l.done
	ok, failed = l.ok.Load(), l.failed.Load()
	msg := fmt.Sprintf("%s: %d connections succeeded, %d failed", l.name, ok, failed)
	if failed > 0 {
		msg += fmt.Sprintf(" (first errors: %v)", l.firstErrors)
	}
	t.Log(msg)
	fmt.Println("coexist:", t.Name()+":", msg)
	if ok == 0 {
		t.Errorf("%s: no connection succeeded", l.name)
	}
	return ok, failed
}

// iptablesSave returns iptables-save and ip6tables-save of the node namespace, without
// comments and counters, one sorted line per rule or chain, so two saves compare equal
// when the rules are the same.
func iptablesSave(t *testing.T, e *env.Env) []string {
	t.Helper()
	counters := regexp.MustCompile(` \[\d+:\d+\]$`)
	var lines []string
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		out, err := e.TP.Exec(e.TP.Node, cmd)
		if err != nil {
			t.Fatal(err)
		}
		table := ""
		for _, line := range strings.Split(out, "\n") {
			switch {
			case line == "" || strings.HasPrefix(line, "#") || line == "COMMIT":
				continue
			case strings.HasPrefix(line, "*"):
				table = line[1:]
				continue
			}
			lines = append(lines, cmd+" "+table+" "+counters.ReplaceAllString(line, ""))
		}
	}
	sort.Strings(lines)
	return lines
}

// tables returns `nft list tables` of the node namespace, one "family name" per entry.
// kubeProxyRules are the running kube-proxy's rules, one entry per line, without
// counters: iptables-save's in iptables mode, its "kube-proxy" tables in nftables mode.
func kubeProxyRules(t *testing.T, e *env.Env) []string {
	t.Helper()
	if mode == modeIPTables {
		return iptablesSave(t, e)
	}
	var lines []string
	for _, fam := range []string{"ip", "ip6"} {
		out, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", fam, "kube-proxy")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(counterless(out), "\n") {
			lines = append(lines, fam+" "+strings.TrimSpace(line))
		}
	}
	return lines
}

func tables(t *testing.T, e *env.Env) map[string]bool {
	t.Helper()
	out, err := e.TP.Exec(e.TP.Node, "nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		got[strings.TrimPrefix(line, "table ")] = true
	}
	return got
}

// ourTables are the shardproxy tables of the two instances.
var ourTables = []string{"ip shardproxy-team-a", "ip6 shardproxy-team-a", "ip shardproxy-team-b", "ip6 shardproxy-team-b"}

// tableState is each of our tables' kernel handle and listing: a table deleted and
// recreated gets a new handle.
func tableState(t *testing.T, e *env.Env) map[string]string {
	t.Helper()
	state := map[string]string{}
	for _, tbl := range ourTables {
		args := append([]string{"nft", "-a", "list", "table"}, strings.Fields(tbl)...)
		out, err := e.TP.Exec(e.TP.Node, args...)
		if err != nil {
			t.Fatalf("listing %s: %v", tbl, err)
		}
		state[tbl] = out
	}
	return state
}

// diffLines returns the lines only in a and only in b.
func diffLines(a, b []string) (onlyA, onlyB []string) {
	in := func(s []string) map[string]int {
		m := map[string]int{}
		for _, x := range s {
			m[x]++
		}
		return m
	}
	ma, mb := in(a), in(b)
	for x, n := range ma {
		if mb[x] < n {
			onlyA = append(onlyA, x)
		}
	}
	for x, n := range mb {
		if ma[x] < n {
			onlyB = append(onlyB, x)
		}
	}
	sort.Strings(onlyA)
	sort.Strings(onlyB)
	return onlyA, onlyB
}

// invalidDrops returns how many packets kube-proxy's "drop conntrack-INVALID" rule (in
// iptables mode, unless nf_conntrack_tcp_be_liberal is set) has dropped in the node
// namespace, or -1 if the rule is not there. It drops forwarded packets of every Service,
// shardproxy's too, so a lost connection with a non-zero count is kube-proxy's doing.
func invalidDrops(e *env.Env) int64 {
	out, err := e.TP.Exec(e.TP.Node, "iptables", "-t", "filter", "-nvxL", "KUBE-FORWARD")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && strings.Contains(line, "INVALID") && f[2] == "DROP" {
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// rejectCounters lists, in iptables mode, the node namespace's iptables REJECT and DROP
// rules that have counted packets (in nftables mode, kube-proxy's tables, whose rules
// have no counters), and conntrack's statistics: where a refused or lost connection went.
func rejectCounters(e *env.Env) string {
	var b strings.Builder
	if mode == modeNFTables {
		for _, fam := range []string{"ip", "ip6"} {
			out, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", fam, "kube-proxy")
			if err != nil {
				out = err.Error()
			}
			b.WriteString(out)
		}
	} else {
		out, err := e.TP.Exec(e.TP.Node, "iptables-save", "-c")
		if err != nil {
			return err.Error()
		}
		for _, line := range strings.Split(out, "\n") {
			if (strings.Contains(line, "-j REJECT") || strings.Contains(line, "-j DROP")) && !strings.HasPrefix(line, "[0:0]") {
				b.WriteString(line + "\n")
			}
		}
	}
	if st, err := e.TP.Exec(e.TP.Node, "conntrack", "-S"); err == nil {
		b.WriteString(st)
	}
	return b.String()
}

// capture records, in the node namespace, the conntrack events and (when SHARDPROXY_TRACE
// is set) an nft trace of every TCP SYN to addrs, for reading after a failed connection.
// Tracing runs every packet's verdicts through netlink, so it is opt-in: it changes the
// timing it is meant to observe.
type capture struct {
	events, trace *netns.Process
	e             *env.Env
}

func startCapture(t *testing.T, e *env.Env, addrs []string) *capture {
	t.Helper()
	c := &capture{e: e}
	var err error
	c.events, err = e.TP.StartProcess(e.TP.Node, "conntrack", "-E", "-p", "tcp", "-o", "timestamp")
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("SHARDPROXY_TRACE") != "" {
		script := fmt.Sprintf("table ip sp-trace {\n chain pre {\n  type filter hook prerouting priority -400;\n  ip daddr { %s } tcp flags syn meta nftrace set 1\n }\n}\n", strings.Join(addrs, ", "))
		if err := e.TP.NFT(e.TP.Node, script); err != nil {
			t.Fatal(err)
		}
		// Every ruleset change and every trace event, each stamped with the wall clock.
		c.trace, err = e.TP.StartProcess(e.TP.Node, "sh", "-c",
			`nft monitor | perl -MTime::HiRes=time -MPOSIX=strftime -ne '$|=1; my $t=time; printf "%s.%06d %s", strftime("%H:%M:%S", localtime $t), ($t-int $t)*1e6, $_'`)
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// stop ends the capture and, if keep, writes what it saw under dir and says where.
func (c *capture) stop(t *testing.T, keep bool) {
	t.Helper()
	_ = c.events.Stop()
	if c.trace != nil {
		_ = c.trace.Stop()
		_, _ = c.e.TP.Exec(c.e.TP.Node, "nft", "delete", "table", "ip", "sp-trace")
	}
	if !keep {
		return
	}
	dir, err := os.MkdirTemp("", "shardproxy-capture-")
	if err != nil {
		t.Log(err)
		return
	}
	_ = os.WriteFile(filepath.Join(dir, "conntrack-events"), []byte(c.events.Output()), 0o644)
	if c.trace != nil {
		_ = os.WriteFile(filepath.Join(dir, "nft-trace"), []byte(c.trace.Output()), 0o644)
	}
	t.Logf("conntrack events (and nft trace, if SHARDPROXY_TRACE was set) kept in %s", dir)
}
