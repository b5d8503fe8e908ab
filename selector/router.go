// Package selector decides which local proxy instance owns each Service (and so its
// EndpointSlices), applies the instances' tenant guards, and hands Services over between
// instances when their labels change.
package selector

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// LabelServiceProxyName is the label that assigns a Service to a proxy by name.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// AnnotationShadow names a proxy (a label value) whose local instance programs the Service
// too, in addition to whoever the label assigns it to: `shardproxy migrate` sets it so the
// target programs Services before the label moves them (and keeps them while a rollback
// hands them back). An instance's rules run after a legacy kube-proxy's, so a shadow copy
// serves nothing while the legacy rules exist.
//
// When it names the very proxy the label names, the owner steps back to a shadow: its
// instance keeps programming the Service but no longer owns it, so it gives up what only
// an owner holds (the health-check node port). A rollback does this first, and hands the
// Service to the legacy proxy only once every node has confirmed it, so the legacy proxy
// finds the port free (kube-proxy tries to bind it only when it syncs).
const AnnotationShadow = "shardproxy.io/shadow"

// LabelShadow is AnnotationShadow as a label, which `shardproxy migrate` sets with it: a
// node that runs no default instance watches only the Services labelled for its proxies
// or shadowed for them, and an annotation cannot be selected on. Where both are set the
// label wins; the annotation alone still works on a node that watches every Service.
const LabelShadow = "shardproxy.io/shadow"

// Spec says what one instance serves.
type Spec struct {
	// Name is the instance's name.
	Name string
	// Default serves the Services without the LabelServiceProxyName label.
	Default bool
	// ProxyNames are the label values the instance serves.
	ProxyNames []string
	// Namespaces, when not empty, are the only namespaces the instance accepts Services
	// from (a tenant guard).
	Namespaces []string
	// ExternalIPCIDRs are the only ranges spec.externalIPs may come from; others are
	// dropped from the Service (a tenant guard). Empty: no external IPs.
	ExternalIPCIDRs []netip.Prefix
	// LoadBalancerCIDRs are the only ranges load-balancer ingress IPs may come from;
	// others are dropped. Empty: no load-balancer IPs.
	LoadBalancerCIDRs []netip.Prefix
}

// Router maps Services to instances. It is immutable once built, so it is safe for
// concurrent use.
type Router struct {
	specs       map[string]Spec
	byProxyName map[string]string
	defaultName string
}

// NewRouter builds a Router; it fails when two instances claim the same proxy name or
// both claim to be the default.
func NewRouter(specs []Spec) (*Router, error) {
	r := &Router{specs: map[string]Spec{}, byProxyName: map[string]string{}}
	var errs []error
	for _, s := range specs {
		if _, dup := r.specs[s.Name]; dup {
			errs = append(errs, fmt.Errorf("instance %q is defined twice", s.Name))
			continue
		}
		r.specs[s.Name] = s
		if s.Default {
			if r.defaultName != "" {
				errs = append(errs, fmt.Errorf("instances %q and %q are both the default", r.defaultName, s.Name))
			} else {
				r.defaultName = s.Name
			}
		}
		for _, pn := range s.ProxyNames {
			if other, dup := r.byProxyName[pn]; dup {
				errs = append(errs, fmt.Errorf("proxy name %q is served by both %q and %q", pn, other, s.Name))
				continue
			}
			r.byProxyName[pn] = s.Name
		}
	}
	return r, errors.Join(errs...)
}

// Has reports whether the Router routes to an instance of that name.
func (r *Router) Has(inst string) bool {
	_, ok := r.specs[inst]
	return ok
}

// Decision is the outcome of routing one Service.
type Decision struct {
	// Instance is the owning instance, or "" when no local instance serves the Service.
	Instance string
	// Shadow is the instance that programs the Service in shadow (AnnotationShadow), or
	// "" when there is none or it is Instance itself. When the annotation names the
	// label's own proxy, the label's instance is the Shadow and Instance is "" (the owner
	// stepped back).
	Shadow string
	// Rejected explains why an instance the label or annotation names refused the
	// Service (a tenant guard); that instance is then not in the decision.
	Rejected string
	// RejectedBy names the instances that refused it, for the metrics.
	RejectedBy []string
}

// Owners lists the instances that program the Service: the owner, then the shadow.
func (d Decision) Owners() []string {
	var out []string
	if d.Instance != "" {
		out = append(out, d.Instance)
	}
	if d.Shadow != "" {
		out = append(out, d.Shadow)
	}
	return out
}

// Route returns the instances that serve svc.
func (r *Router) Route(svc *corev1.Service) Decision {
	var dec Decision
	var rejected []string
	admit := func(inst string) string {
		if inst == "" {
			return ""
		}
		spec := r.specs[inst]
		if len(spec.Namespaces) > 0 && !slices.Contains(spec.Namespaces, svc.Namespace) {
			rejected = append(rejected, fmt.Sprintf("instance %q does not accept Services from namespace %q", inst, svc.Namespace))
			dec.RejectedBy = append(dec.RejectedBy, inst)
			return ""
		}
		return inst
	}
	label, labeled := svc.Labels[LabelServiceProxyName]
	if labeled {
		dec.Instance = admit(r.byProxyName[label])
	} else {
		dec.Instance = admit(r.defaultName)
	}
	shadow, shadowed := svc.Labels[LabelShadow]
	if !shadowed {
		shadow, shadowed = svc.Annotations[AnnotationShadow]
	}
	if shadowed {
		switch inst := r.byProxyName[shadow]; {
		case labeled && shadow == label:
			// The owner steps back to a shadow (see AnnotationShadow).
			dec.Instance, dec.Shadow = "", dec.Instance
		case inst != dec.Instance:
			dec.Shadow = admit(inst)
		}
	}
	if len(rejected) > 0 {
		dec.Rejected = strings.Join(rejected, "; ")
	}
	return dec
}

// Guard applies the instance's tenant guards to a Service it owns: externalIPs outside
// its ExternalIPCIDRs and load-balancer IPs outside its LoadBalancerCIDRs are dropped
// (none are allowed where the list is empty). It returns the Service to program (a
// copy when something was removed) and one line per item it removed, for logs and
// events.
func (r *Router) Guard(instance string, svc *corev1.Service) (*corev1.Service, []string) {
	spec := r.specs[instance]
	var problems []string
	allowed := func(s, what string, cidrs []netip.Prefix, field string) bool {
		if a, err := netip.ParseAddr(s); err == nil && slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) }) {
			return true
		}
		problems = append(problems, fmt.Sprintf("%s %q is outside the ranges instance %q allows (tenant.%s); ignored", what, s, instance, field))
		return false
	}
	var ext []string
	for _, s := range svc.Spec.ExternalIPs {
		if allowed(s, "externalIP", spec.ExternalIPCIDRs, "externalIPCIDRs") {
			ext = append(ext, s)
		}
	}
	var ing []corev1.LoadBalancerIngress
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP == "" || allowed(in.IP, "load-balancer IP", spec.LoadBalancerCIDRs, "loadBalancerCIDRs") {
			ing = append(ing, in)
		}
	}
	if len(problems) == 0 {
		return svc, nil
	}
	out := svc.DeepCopy()
	out.Spec.ExternalIPs, out.Status.LoadBalancer.Ingress = ext, ing
	return out, problems
}

// Instances lists the instance names, sorted.
func (r *Router) Instances() []string {
	out := make([]string, 0, len(r.specs))
	for n := range r.specs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
