package fleet

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/bench/gen"
)

// TestMigrateAcrossFleet is make fleet's migrate step at five hollow nodes against a real
// kube-apiserver and etcd: `migrate move` (the CLI's Mover and Lease) of 30 of 60
// Services to every node's second instance must wait for every node's confirmation of
// each batch, after which every node's team-a instance alone holds them; the rollback
// must wait for every node too and leave them with the default instance alone; with the
// last node's supervisor stopped a move must fail naming that node, and only it, and
// leave the Services where they were.
func TestMigrateAcrossFleet(t *testing.T) {
	_, env := startFleetControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := env.Admin
	const nodes, services, moved = 5, 60, 30
	c := gen.Generate(services, 3)
	MarkForMigration(c, moved)
	if err := Prepare(ctx, admin, nodes, c, 4); err != nil {
		t.Fatal(err)
	}
	const block = 5 * time.Second
	res, err := Measure(ctx, env, Options{Nodes: nodes, Settle: time.Second, Steady: time.Second, StatusPeriod: time.Second, Changes: 1,
		QPS: 5, Burst: 10, ReadyTimeout: time.Minute, Migrate: moved, MigrateTimeout: time.Minute, BlockTimeout: block, Logf: t.Logf}, services)
	if err != nil {
		t.Fatal(err)
	}
	m := res.Migration
	if m == nil {
		t.Fatal("no migrate step")
	}
	t.Log("\n" + MigrationTable([]*Result{res}))
	for _, s := range []MigrationStep{m.Move, m.Rollback} {
		if s.Report.Moved != moved || s.Report.Batches != 2 {
			t.Errorf("%s: %+v, want %d Services in 2 batches", s.Name, s.Report, moved)
		}
		if s.Confirmed != nodes {
			t.Errorf("%s: the fewest nodes a wait named confirming is %d, want every node (%d)", s.Name, s.Confirmed, nodes)
		}
		// Each Service is patched at least twice (marked, then labeled), and each node
		// writes its status when its shadows change.
		if s.Mover["patch services"] < 2*moved {
			t.Errorf("%s: the mover patched Services %v times, want at least %d", s.Name, s.Mover["patch services"], 2*moved)
		}
		if s.Nodes["update configmaps"] < nodes {
			t.Errorf("%s: the nodes updated their statuses %v times, want at least one each (%d)", s.Name, s.Nodes["update configmaps"], nodes)
		}
		if s.StatusWrites["shadow"] < nodes || s.StatusWrites.Total() > s.Nodes["update configmaps"]+s.Nodes["create configmaps"] {
			t.Errorf("%s: status writes by change %v, want a shadow change from each node at least, and no more than the nodes' %v writes",
				s.Name, s.StatusWrites, s.Nodes)
		}
		if s.Server.WatchEvents["services"] < 2*moved*nodes {
			t.Errorf("%s: %v Service watch events, want at least %d (each patch to each node)", s.Name, s.Server.WatchEvents["services"], 2*moved*nodes)
		}
	}
	// With the CLI's client limits (migrate.ClientQPS, ClientBurst) a batch's patches
	// reach the nodes together, so each node publishes the batch's shadow list once and
	// little more: the floor is 2 status writes per node and batch. At client-go's
	// default QPS 5 they trickled in and every node published each partial list, 12-13
	// writes per node and batch (docs/fleet.md). Heartbeats (every 30 s while a
	// migration runs) change nothing and are left out, so a slow run under -race cannot
	// fail this.
	mv := m.Move
	if w, bound := mv.StatusWrites.Total()-mv.StatusWrites["heartbeat"], float64(3*nodes*mv.Report.Batches); w > bound {
		t.Errorf("move: the nodes wrote their statuses %v times (%v), want at most %v (3 per node and batch; the floor is 2)",
			w, mv.StatusWrites, bound)
	}
	if m.Stopped != NodeName(nodes-1) || !slices.Equal(m.Named, []string{m.Stopped}) {
		t.Errorf("blocked move: stopped %s, named %v, want it alone", m.Stopped, m.Named)
	}
	if !strings.Contains(m.Blocked.Err, "not programmed in shadow within "+block.String()) {
		t.Errorf("blocked move: %s", m.Blocked.Err)
	}
	if m.Blocked.Took < block || m.Blocked.Took > block+30*time.Second {
		t.Errorf("blocked move took %v, want its timeout (%v) and a little more", m.Blocked.Took, block)
	}
}

func TestStatusChange(t *testing.T) {
	base := migrate.NodeStatus{Instances: map[string]migrate.InstanceStatus{"default": {Default: true}, "team-a": {ProxyNames: []string{"team-a"}}}}
	with := func(f func(*migrate.NodeStatus)) migrate.NodeStatus {
		st := base
		st.Instances = maps.Clone(base.Instances)
		f(&st)
		return st
	}
	for _, tc := range []struct {
		name string
		cur  migrate.NodeStatus
		seen bool
		want string
	}{
		{"first status seen", base, false, "created"},
		{"a shadow programmed", with(func(st *migrate.NodeStatus) {
			st.Instances["team-a"] = migrate.InstanceStatus{ProxyNames: []string{"team-a"}, Shadow: []string{"bench/a"}}
		}), true, "shadow"},
		{"handed back", with(func(st *migrate.NodeStatus) {
			st.Instances["default"] = migrate.InstanceStatus{Default: true, HandedBack: []string{"bench/a"}}
		}), true, "handedBack"},
		{"failing", with(func(st *migrate.NodeStatus) {
			st.Instances["default"] = migrate.InstanceStatus{Default: true, Failing: "sync failed"}
		}), true, "health"},
		{"last sync moved", with(func(st *migrate.NodeStatus) {
			st.Instances["default"] = migrate.InstanceStatus{Default: true, LastSync: time.Unix(300, 0)}
		}), true, "health"},
		{"holdings", with(func(st *migrate.NodeStatus) { st.Holdings = []selector.Holding{{Port: 80}} }), true, "holdings"},
		{"heartbeat only", with(func(st *migrate.NodeStatus) { st.Heartbeat = time.Unix(30, 0) }), true, "heartbeat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := statusChange(base, tc.cur, tc.seen); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNamedNodes(t *testing.T) {
	for _, tc := range []struct{ name, msg string }{
		{"a live node that did not confirm", "batch 1: not programmed in shadow within 5s: node-4: bench/svc-0, node-4: bench/svc-1, and 18 more; its Services stay where they were"},
		{"a silent Ready node", "batch 1: not programmed in shadow within 30s: node-4: no status for 1m40s, Node Ready; its Services stay where they were"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NamedNodes(tc.msg); !slices.Equal(got, []string{"node-4"}) {
				t.Errorf("got %v, want [node-4]", got)
			}
		})
	}
	if got := NamedNodes("batch 1: not programmed in shadow within 5s: node-10: bench/a, node-2: no status for 2m0s, Node Ready"); !slices.Equal(got, []string{"node-10", "node-2"}) {
		t.Errorf("two nodes: %v", got)
	}
	out := "batch 1: 20 Services programmed in shadow on 5 node(s) (node-0, ...) after 1s; labeled team-a\n" +
		"batch 2: team-a stepped back to a shadow on 4 node(s) (node-0, ...) after 1s; 10 Services handed back to the unlabeled proxy; programmed by it on 5 node(s)\n"
	if got := confirmedNodes(out); got != 4 {
		t.Errorf("confirmedNodes: %d, want the fewest, 4", got)
	}
	if got := confirmedNodes("nothing"); got != -1 {
		t.Errorf("confirmedNodes of no wait: %d, want -1", got)
	}
}
