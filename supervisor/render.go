package supervisor

import (
	"context"
	"fmt"
	goslices "slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/tables"
)

// Render computes, offline, the nft script an instance would load for the given
// Services and EndpointSlices on the given node: the same routing, guards, model and
// compiler as a running supervisor, against knftables' fake. Problems are the lines a
// running instance would log and report as events.
func Render(cfg *config.Config, instanceName string, services []*corev1.Service, slices []*discoveryv1.EndpointSlice, node *corev1.Node) (script string, problems []string, err error) {
	router, specs, err := buildRouter(cfg)
	if err != nil {
		return "", nil, err
	}
	spec, ok := specs[instanceName]
	if !ok {
		return "", nil, fmt.Errorf("no instance %q in the configuration", instanceName)
	}
	base := tableConfigs{cfg: cfg, interfaceAddrs: hostAddrs, logger: klog.Background()}.forInstance(spec, node)
	info := nodeInfo(cfg.NodeName, node)
	lb := loadBalancing(spec)
	base = lb.TableConfig(base)

	bySvc := map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	for _, sl := range slices {
		if name, ok := selector.ServiceOf(sl); ok {
			bySvc[name] = append(bySvc[name], sl)
		}
	}
	models := map[tables.ServiceName]*instance.ServiceModel{}
	for _, svc := range services {
		dec := router.Route(svc)
		if dec.Rejected != "" {
			problems = append(problems, fmt.Sprintf("%s/%s: %s", svc.Namespace, svc.Name, dec.Rejected))
		}
		// The owner and a shadow (AnnotationShadow) program the same rules.
		if !goslices.Contains(dec.Owners(), instanceName) {
			continue
		}
		guarded, guardProblems := router.Guard(instanceName, svc)
		for _, p := range guardProblems {
			problems = append(problems, fmt.Sprintf("%s/%s: %s", svc.Namespace, svc.Name, p))
		}
		m := lb.Build(guarded, bySvc[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}], info)
		if m == nil {
			continue
		}
		for _, p := range m.Problems {
			problems = append(problems, fmt.Sprintf("%s/%s: %s", svc.Namespace, svc.Name, p))
		}
		models[tables.ServiceName{Namespace: svc.Namespace, Name: svc.Name}] = m
	}

	var out strings.Builder
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		tc := base
		tc.Family = fam
		fake := knftables.NewFake(tables.KnftFamily(fam), tc.TableName())
		syncer, err := tables.NewSyncer(tc, fake)
		if err != nil {
			return "", nil, err
		}
		ports := map[tables.ServiceName][]*tables.ServicePort{}
		for n, m := range models {
			if p := m.Ports[fam]; len(p) > 0 {
				ports[n] = p
			}
		}
		if _, err := syncer.Full(context.Background(), ports); err != nil {
			return "", nil, fmt.Errorf("rendering %s: %w", fam, err)
		}
		out.WriteString(fake.Dump())
	}
	return out.String(), problems, nil
}
