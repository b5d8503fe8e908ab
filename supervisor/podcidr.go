package supervisor

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/tables"
)

// setNode records this Node and wakes whoever waits for it to change (waitForPodCIDRs).
func (s *Supervisor) setNode(node *corev1.Node) (old *corev1.Node) {
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	old = s.node
	s.node = node
	close(s.nodeChanged)
	s.nodeChanged = make(chan struct{})
	return old
}

// waitForPodCIDRs holds back an instance whose detectLocal mode is NodeCIDR until this
// Node has spec.podCIDRs, as upstream kube-proxy waits for them before it proxies:
// started without them, the instance would run with local-traffic detection off, and
// nothing would say so. Meanwhile the instance is down in /status, /healthz and
// shardproxy_instance_up with the reason, and the other instances run. It returns false
// when ctx ends first.
func (s *Supervisor) waitForPodCIDRs(ctx context.Context, name string) bool {
	if spec, _ := s.spec(name); spec.DetectLocal.Mode != string(tables.LocalNodeCIDR) {
		return true
	}
	logger := s.logger.WithValues("instance", name)
	waiting := false
	for {
		s.nodeMu.Lock()
		node, changed := s.node, s.nodeChanged
		s.nodeMu.Unlock()
		if node != nil && len(parsePrefixes(node.Spec.PodCIDRs)) > 0 {
			if waiting {
				logger.Info("This Node has pod CIDRs now; starting the instance", "podCIDRs", node.Spec.PodCIDRs)
			}
			return true
		}
		if !waiting {
			reason := fmt.Sprintf("waiting for Node %s to have spec.podCIDRs (detectLocal mode NodeCIDR)", s.cfg.NodeName)
			logger.Info("Waiting for this Node's pod CIDRs before starting the instance: detectLocal mode NodeCIDR needs them", "node", s.cfg.NodeName)
			s.health.SetInstanceUp(name, false, reason)
			s.metrics.SetInstanceUp(name, false)
			waiting = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}
