package env

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// sliceLabels are the labels the EndpointSlice controller gives a Service's slices: the
// Service's own, but for the controller's reserved keys, and the controller's (k8s.io/
// endpointslice v0.36.3, setEndpointSliceLabels). A supervisor running no default
// instance selects slices by these labels (service-proxy-name, the migration shadow).
// A managed-by label the slice has stays.
func sliceLabels(svc *corev1.Service, name string, slice map[string]string) map[string]string {
	out := map[string]string{}
	if m, ok := slice[discoveryv1.LabelManagedBy]; ok {
		out[discoveryv1.LabelManagedBy] = m
	}
	for k, v := range svc.Labels {
		switch k {
		case discoveryv1.LabelServiceName, discoveryv1.LabelManagedBy, corev1.IsHeadlessService:
		default:
			out[k] = v
		}
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		out[corev1.IsHeadlessService] = ""
	}
	out[discoveryv1.LabelServiceName] = name
	return out
}

// sliceControllerName is the EndpointSlice controller's managed-by value.
const sliceControllerName = "endpointslice-controller.k8s.io"

// mirrorServiceLabels stands in for the EndpointSlice controller's label copy, which
// the environment's control plane (no controller manager) lacks: whenever a Service's
// labels change, its slices get them, after the Service, as in a cluster; like the
// controller it leaves the slices another controller manages alone. It runs until
// Close. Options.NoLabelMirror turns it off.
func (e *Env) mirrorServiceLabels() error {
	if e.opts.NoLabelMirror {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.OnClose(cancel)
	factory := informers.NewSharedInformerFactory(e.Client, 0)
	inf := factory.Core().V1().Services().Informer()
	sync := func(obj any) {
		if svc, ok := obj.(*corev1.Service); ok {
			if err := e.copyLabelsToSlices(ctx, svc); err != nil && ctx.Err() == nil {
				e.opts.Logf("copying the labels of Service %s/%s to its slices: %v", svc.Namespace, svc.Name, err)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sync,
		UpdateFunc: func(_, obj any) { sync(obj) },
	}); err != nil {
		return fmt.Errorf("mirroring Service labels: %w", err)
	}
	factory.Start(ctx.Done())
	return nil
}

// copyLabelsToSlices gives a Service's slices its labels (sliceLabels).
func (e *Env) copyLabelsToSlices(ctx context.Context, svc *corev1.Service) error {
	slices := e.Client.DiscoveryV1().EndpointSlices(svc.Namespace)
	list, err := slices.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		return err
	}
	for _, sl := range list.Items {
		if m, ok := sl.Labels[discoveryv1.LabelManagedBy]; ok && m != sliceControllerName {
			continue // another controller's slice: the EndpointSlice controller leaves it alone
		}
		want := sliceLabels(svc, svc.Name, sl.Labels)
		if maps.Equal(sl.Labels, want) {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := slices.Get(ctx, sl.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Labels = sliceLabels(svc, svc.Name, cur.Labels)
			_, err = slices.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("EndpointSlice %s: %w", sl.Name, err)
		}
	}
	return nil
}
