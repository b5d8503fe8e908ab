package supervisor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
)

// Event reasons of the node-wide servers, on this Node (as upstream kube-proxy records
// FailedToStartProxierHealthcheck on its Node).
const (
	reasonFailedToStartHealthz = "FailedToStartProxierHealthcheck"
	reasonFailedToStartMetrics = "FailedToStartMetricServer"
)

// listenBackoff paces the attempts to bind a server's address that another process
// holds (kube-proxy during a switch): soon at first, then every ~10 s.
func listenBackoff() wait.Backoff {
	return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 10 * time.Second}
}

// NodeRecorder records events on this Node; a Recorder that also implements it gets the
// node-wide servers' failures.
type NodeRecorder interface {
	NodeEventf(eventType, reason, messageFmt string, args ...any)
}

// serveRetrying serves h on addr until ctx is done. While addr cannot be bound it
// retries with backoff, and says so once per episode in the log and as an event on the
// Node, and throughout in /status (listenErrors) and /readyz (not ready), so a pod whose
// port another process still holds is not Ready and the operator sees why.
func (s *Supervisor) serveRetrying(ctx context.Context, server, addr, reason string, h http.Handler) error {
	logger := s.logger.WithValues("server", server, "address", addr)
	backoff := listenBackoff()
	failures := 0
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			s.health.SetListenError(server, "")
			if failures > 0 {
				logger.Info("Listening now", "attempts", failures+1)
			}
			return healthcheck.Serve(ctx, l, h)
		}
		msg := fmt.Sprintf("listening on %s: %v (retrying)", addr, err)
		s.health.SetListenError(server, msg)
		if failures == 0 {
			logger.Error(err, "Cannot listen; retrying with backoff (is kube-proxy or another process holding the port?)")
			if r, ok := s.deps.Recorder.(NodeRecorder); ok {
				r.NodeEventf(corev1.EventTypeWarning, reason, "%s server: %s", server, msg)
			}
		} else {
			logger.V(2).Info("Still cannot listen", "err", err, "attempts", failures+1)
		}
		failures++
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff.Step()):
		}
	}
}

// reportUnboundHealthChecks puts the health-check node ports that are not open into
// /status (their Services already got a FailedToStartServiceHealthcheck event): those
// this node refused to bind (another process holds them) as listen errors, which fail
// /readyz; those the configuration and the Services ask for but cannot have (no node port
// address in the Service's families, a port another Service holds) as unserved, which
// do not: a tenant's Service must not make the node's pod NotReady.
func (s *Supervisor) reportUnboundHealthChecks() {
	s.health.SetListenError("healthCheckNodePorts", strings.Join(s.svcHC.Unbound(), "; "))
	s.health.SetUnserved("healthCheckNodePorts", strings.Join(s.svcHC.Unserved(), "; "))
}
