package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
)

// TestEachInstanceServesOnlyItsServices: three instances in one supervisor, each with its
// own table pair at its own priorities, each holding only the Services labeled for it.
func TestEachInstanceServesOnlyItsServices(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	servers(t, e, 8081, "tcp")
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8081}}
	backends := []env.Backend{env.Pod1v4, env.Remotev4}
	svcs := map[string]*corev1.Service{}
	for inst, label := range map[string]string{"default": "", "team-a": "team-a", "team-b": "team-b"} {
		var edits []env.ServiceSpec
		if label != "" {
			edits = append(edits, env.WithProxyName(label))
		}
		svc, err := e.CreateService(ctx, "instances", "web-"+inst, ports, backends, edits...)
		if err != nil {
			t.Fatal(err)
		}
		svcs[inst] = svc
	}
	foreign, err := e.CreateService(ctx, "instances", "foreign", ports, backends, env.WithProxyName("another-proxy"))
	if err != nil {
		t.Fatal(err)
	}

	for inst, svc := range svcs {
		reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1", "remote")
		t.Logf("%s serves %s/%s on %s", inst, svc.Namespace, svc.Name, svc.Spec.ClusterIP)
	}
	for i, inst := range []string{"default", "team-a", "team-b"} {
		table, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", "shardproxy-"+inst)
		if err != nil {
			t.Fatalf("%s's table: %v", inst, err)
		}
		if _, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip6", "shardproxy-"+inst); err != nil {
			t.Errorf("%s has no ip6 table: %v", inst, err)
		}
		if want := fmt.Sprintf("type nat hook prerouting priority %d;", -67+i); !strings.Contains(table, want) {
			t.Errorf("%s: want %q in its table", inst, want)
		}
		for other, svc := range svcs {
			has := strings.Contains(table, svc.Spec.ClusterIP+" . tcp . 80")
			if has != (other == inst) {
				t.Errorf("%s's table holding %s's Service: %v", inst, other, has)
			}
		}
		if strings.Contains(table, foreign.Spec.ClusterIP+" ") {
			t.Errorf("%s programs a Service of another proxy", inst)
		}
	}
	if _, err := e.TP.Dial(e.TP.Pod2, "tcp", foreign.Spec.ClusterIP, 80); err == nil {
		t.Error("a Service no local instance owns was served")
	}
	_ = time.Second
}
