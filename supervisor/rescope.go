package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/client-go/tools/cache"
)

// Rescope changes the label selectors of the Service and EndpointSlice watches to
// scope's, for a live configuration change of the proxy names on a node without a
// default instance. The watches of the new selectors start first and pass their initial
// lists on (the mergers deliver the objects no watch held before); then the watches of
// the selectors no longer in scope stop, and the objects only they held are deleted.
// An object both scopes hold is never dropped. Both scopes must select by label
// (Scoped); on an error nothing has changed.
func (w *Watches) Rescope(ctx context.Context, scope []string, timeout time.Duration) error {
	old := w.Scope()
	if !scopedBy(old) || !scopedBy(scope) || w.serviceMerger == nil || w.sliceMerger == nil {
		return fmt.Errorf("rescoping the watches from %q to %q: only between label selectors", old, scope)
	}
	var added []*scopedWatch
	for _, sel := range scope {
		if slices.Contains(old, sel) {
			continue
		}
		sw, err := w.startScopedWatch(ctx, sel, timeout)
		if err != nil {
			for _, a := range added {
				w.dropScopedWatch(a)
			}
			return err
		}
		added = append(added, sw)
	}
	for _, sw := range w.watches() {
		if !slices.Contains(scope, sw.sel) {
			w.dropScopedWatch(sw)
		}
	}
	w.logger.Info("Watches rescoped", "scope", w.Scope(), "was", old)
	return nil
}

// startScopedWatch starts the watches of one more selector, joined to the mergers, and
// waits until their initial lists went through.
func (w *Watches) startScopedWatch(ctx context.Context, sel string, timeout time.Duration) (*scopedWatch, error) {
	sw := w.newScopedWatch(sel)
	var err error
	if sw.serviceIndex, err = w.serviceMerger.addWatch(sel); err != nil {
		return nil, err
	}
	if sw.sliceIndex, err = w.sliceMerger.addWatch(sel); err != nil {
		w.serviceMerger.dropWatch(sw.serviceIndex, sw.services.GetStore())
		return nil, err
	}
	// Listed before it starts: a Service the new watch delivers is given to its instance
	// with its slices (SlicesOf), which this watch's cache holds.
	w.mu.Lock()
	w.scoped = append(w.scoped, sw)
	w.mu.Unlock()
	regs := make([]cache.ResourceEventHandlerRegistration, 2)
	regs[0], err = sw.services.AddEventHandler(w.serviceMerger.handlers(sw.serviceIndex))
	if err == nil {
		regs[1], err = sw.slices.AddEventHandler(w.sliceMerger.handlers(sw.sliceIndex))
	}
	if err == nil {
		sw.start(ctx)
		syncCtx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if !cache.WaitForCacheSync(syncCtx.Done(), regs[0].HasSynced, regs[1].HasSynced) {
			err = fmt.Errorf("the watches of %q did not fill within %s", sel, timeout)
		}
	}
	if err != nil {
		w.dropScopedWatch(sw)
		return nil, errors.Join(fmt.Errorf("watching %q", sel), err)
	}
	return sw, nil
}

// dropScopedWatch stops one selector's watches and forgets them, deleting the objects
// only they held.
func (w *Watches) dropScopedWatch(sw *scopedWatch) {
	if sw.stop != nil {
		sw.stop()
	}
	sw.shutdown()
	w.serviceMerger.dropWatch(sw.serviceIndex, sw.services.GetStore())
	w.sliceMerger.dropWatch(sw.sliceIndex, sw.slices.GetStore())
	w.mu.Lock()
	w.scoped = slices.DeleteFunc(w.scoped, func(have *scopedWatch) bool { return have == sw })
	w.mu.Unlock()
}
