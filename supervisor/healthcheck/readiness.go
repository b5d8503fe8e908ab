package healthcheck

import (
	"maps"
	"net/http"
	"slices"
)

// ReadyzPath is the pod's readiness probe: /healthz's verdict, and every server of the
// supervisor listening. It is not upstream's: kube-proxy serves /healthz and /livez
// only, so while kube-proxy still holds the health port (a switch from kube-proxy to
// shardproxy on kube-proxy's ports), a probe of /readyz gets kube-proxy's 404 and the pod
// is not Ready, where a probe of /healthz would read kube-proxy's 200.
const ReadyzPath = "/readyz"

// ReadyResponse is the body of /readyz.
type ReadyResponse struct {
	// Ready is the verdict: Healthy, and no server failing to listen.
	Ready bool `json:"ready"`
	// Healthy is /healthz's verdict (its status code).
	Healthy bool `json:"healthy"`
	// NotListening names the servers that do not listen; why is in /status, which
	// stays on loopback.
	NotListening []string `json:"notListening,omitempty"`
}

// SetListenError records that server (e.g. "metrics") cannot listen, with why; an
// empty msg records that it listens. /status lists the errors and /readyz fails while
// there is one.
func (h *ProxyHealth) SetListenError(server, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if msg == "" {
		delete(h.listenErrors, server)
		return
	}
	if h.listenErrors == nil {
		h.listenErrors = map[string]string{}
	}
	h.listenErrors[server] = msg
}

// SetUnserved records what server does not serve because of what the configuration and
// the Services ask (msg; empty: nothing). /status lists it; /readyz does not fail for it:
// a tenant's Service may cause it, and must not make the node's pod NotReady.
func (h *ProxyHealth) SetUnserved(server, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if msg == "" {
		delete(h.unserved, server)
		return
	}
	if h.unserved == nil {
		h.unserved = map[string]string{}
	}
	h.unserved[server] = msg
}

func (h *ProxyHealth) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	s := h.snapshot()
	_, healthy := s.healthResponse(true)
	resp := ReadyResponse{Healthy: healthy, NotListening: slices.Sorted(maps.Keys(s.listenErrors))}
	resp.Ready = healthy && len(resp.NotListening) == 0
	writeJSON(h.logger, w, statusCode(resp.Ready), resp)
}
