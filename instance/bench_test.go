package instance

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/test/bench/gen"
)

// BenchmarkBuild turns one Service with its EndpointSlice (10 endpoints) into its model,
// for each kind of Service in test/bench's mix.
func BenchmarkBuild(b *testing.B) {
	c := gen.Generate(100, 10)
	node := NodeInfo{Name: gen.NodeName}
	pick := func(want func(gen.Mix) bool) (*corev1.Service, []*discoveryv1.EndpointSlice) {
		for i := range c.Services {
			if want(gen.MixOf(i)) {
				return c.Services[i], []*discoveryv1.EndpointSlice{c.Slices[i]}
			}
		}
		b.Fatal("no such Service in the mix")
		return nil, nil
	}
	cases := []struct {
		name string
		want func(gen.Mix) bool
	}{
		{"ClusterIP", func(m gen.Mix) bool {
			return m.Type == corev1.ServiceTypeClusterIP && !m.TwoPorts && !m.UDP && !m.Affinity
		}},
		{"NodePort-two-ports", func(m gen.Mix) bool { return m.Type == corev1.ServiceTypeNodePort && m.TwoPorts }},
		{"LoadBalancer-source-ranges-Local", func(m gen.Mix) bool {
			return m.Type == corev1.ServiceTypeLoadBalancer && m.SourceRanges && m.ExternalLocal
		}},
	}
	for _, tc := range cases {
		svc, slices := pick(tc.want)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if Build(svc, slices, node) == nil {
					b.Fatal("no model")
				}
			}
		})
	}
}

// BenchmarkBuildAll builds the models of 1,000 Services of the mix, as a full sync does.
func BenchmarkBuildAll(b *testing.B) {
	c := gen.Generate(1000, 10)
	node := NodeInfo{Name: gen.NodeName}
	b.ReportAllocs()
	for b.Loop() {
		for i, svc := range c.Services {
			Build(svc, []*discoveryv1.EndpointSlice{c.Slices[i]}, node)
		}
	}
}

// BenchmarkTakeDirtyAfterFullSync takes one changed Service after a first sync that
// marked a whole cluster dirty: its cost must be that of the one Service, not of the
// cluster the dirty set once held.
func BenchmarkTakeDirtyAfterFullSync(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			t := NewTracker(NodeInfo{})
			for i := range n {
				t.dirty[types.NamespacedName{Namespace: "ns", Name: fmt.Sprint("svc-", i)}] = struct{}{}
			}
			t.TakeDirty()
			one := types.NamespacedName{Namespace: "ns", Name: "svc-1"}
			for b.Loop() {
				t.dirty[one] = struct{}{}
				if got := t.TakeDirty(); len(got) != 1 {
					b.Fatalf("took %d names, want 1", len(got))
				}
			}
		})
	}
}
