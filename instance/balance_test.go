package instance

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/tables"
)

func annotated(v string) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Annotations = map[string]string{LoadBalancingAnnotation: v}
	}
}

// TestLoadBalancingAnnotation: a Service gets its instance's mode, or the mode it asks
// for when the instance allows it; anything else is a problem (a Warning event) and the
// instance's mode. Every port of both families gets the same mode.
func TestLoadBalancingAnnotation(t *testing.T) {
	team := LoadBalancing{Mode: tables.LBConsistentHash, Allowed: []tables.LBMode{tables.LBRoundRobin}}
	for _, tc := range []struct {
		name    string
		lb      LoadBalancing
		edits   []func(*corev1.Service)
		want    tables.LBMode
		problem string
	}{
		{name: "no settings, no annotation: random", want: tables.LBRandom},
		{name: "the instance's mode", lb: team, want: tables.LBConsistentHash},
		{name: "an allowed mode", lb: team, edits: []func(*corev1.Service){annotated("roundRobin")}, want: tables.LBRoundRobin},
		{name: "the instance's own mode needs no listing", lb: team, edits: []func(*corev1.Service){annotated("consistentHash")}, want: tables.LBConsistentHash},
		{name: "an empty annotation is no request", lb: team, edits: []func(*corev1.Service){annotated("")}, want: tables.LBConsistentHash},
		{name: "a mode the instance does not allow", lb: team, edits: []func(*corev1.Service){annotated("sourceHash")},
			want: tables.LBConsistentHash, problem: "sourceHash is not allowed by this instance (allowed: [roundRobin]); using the instance's mode consistentHash"},
		{name: "no allowed list: the guard is closed", edits: []func(*corev1.Service){annotated("roundRobin")},
			want: tables.LBRandom, problem: "roundRobin is not allowed by this instance (allowed: []); using the instance's mode random"},
		{name: "an unknown mode", lb: team, edits: []func(*corev1.Service){annotated("maglev")},
			want: tables.LBConsistentHash, problem: `unknown load-balancing mode "maglev"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service(append([]func(*corev1.Service){dualStack, func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
			}}, tc.edits...)...)
			m := tc.lb.Build(svc, nil, thisNode())
			n := 0
			for fam, ports := range m.Ports {
				for _, p := range ports {
					n++
					if p.LoadBalancing != tc.want {
						t.Errorf("%s %s: mode %q, want %q", fam, p.Name, p.LoadBalancing, tc.want)
					}
				}
			}
			if n != 4 {
				t.Fatalf("%d ports, want 2 per family", n)
			}
			switch {
			case tc.problem == "" && len(m.Problems) > 0:
				t.Errorf("problems %q, want none", m.Problems)
			case tc.problem != "" && (len(m.Problems) != 1 || !strings.Contains(m.Problems[0], LoadBalancingAnnotation+": ") || !strings.Contains(m.Problems[0], tc.problem)):
				t.Errorf("problems %q, want one naming the annotation and %q", m.Problems, tc.problem)
			}
		})
	}
}

// TestProxyLoadBalancing: an instance's settings reach its tables, and a Service's
// annotation changes its rules at the next sync.
func TestProxyLoadBalancing(t *testing.T) {
	p, nft := newTestProxy(t, nil, func(o *Options) {
		o.LoadBalancing = LoadBalancing{Mode: tables.LBConsistentHash, Allowed: []tables.LBMode{tables.LBSourceHash}}
	})
	ctx := context.Background()
	p.UpdateService(service())
	p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1.2", thisNodeName), ep("10.244.2.2", "other")))
	if _, err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	if d := nft.dump(); !strings.Contains(d, "goto pick-ch-256") {
		t.Fatalf("consistentHash instance: no pick-ch-256 dispatch in\n%s", d)
	}
	p.UpdateService(service(annotated("sourceHash")))
	if _, err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if d := nft.dump(); !strings.Contains(d, "goto pick-sh-2") || strings.Contains(d, "goto pick-ch-") {
		t.Fatalf("after the Service asked for sourceHash:\n%s", d)
	}
}

// TestRotationChainsOnlyWhereAllowed: an instance's tables hold the consistentHash
// rotation chains when its mode is consistentHash or its Services may ask for it, and
// not otherwise (tables.Config.ConsistentHash, set by New from LoadBalancing).
func TestRotationChainsOnlyWhereAllowed(t *testing.T) {
	for _, tc := range []struct {
		name string
		lb   LoadBalancing
		want bool
	}{
		{"random, nothing allowed", LoadBalancing{}, false},
		{"random, roundRobin allowed", LoadBalancing{Mode: tables.LBRandom, Allowed: []tables.LBMode{tables.LBRoundRobin}}, false},
		{"consistentHash", LoadBalancing{Mode: tables.LBConsistentHash}, true},
		{"sourceHash, consistentHash allowed", LoadBalancing{Mode: tables.LBSourceHash, Allowed: []tables.LBMode{tables.LBConsistentHash}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.lb.MayUse(tables.LBConsistentHash); got != tc.want {
				t.Errorf("MayUse(consistentHash) = %v, want %v", got, tc.want)
			}
			p, nft := newTestProxy(t, nil, func(o *Options) { o.LoadBalancing = tc.lb })
			p.UpdateService(service())
			p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1.2", thisNodeName), ep("10.244.2.2", "other")))
			if _, err := p.Sync(context.Background(), true); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(nft.dump(), "add chain ip shardproxy-test ch-rotation-0\n"); got != tc.want {
				t.Errorf("rotation chains in the table: %v, want %v", got, tc.want)
			}
		})
	}
}
