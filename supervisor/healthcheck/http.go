package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"k8s.io/klog/v2"
)

// readHeaderTimeout bounds how long a client may take to send its request headers, so a
// slow or stuck prober cannot pin connections on a node-wide port.
const readHeaderTimeout = 10 * time.Second

// Serve serves h on l until ctx is done, then shuts down gracefully, giving requests in
// flight shutdownTimeout, and returns once they are answered (or cut). It returns nil
// after a clean shutdown, else why serving or shutting down failed.
func Serve(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	select {
	case err := <-served:
		return fmt.Errorf("serving on %s: %w", l.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	if err != nil {
		err = errors.Join(fmt.Errorf("shutting down the server on %s: %w", l.Addr(), err), srv.Close())
	}
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("serving on %s: %w", l.Addr(), serveErr))
	}
	return err
}

// writeJSON writes v as the JSON body of a response with the given status, with the headers
// upstream sets on every health response.
func writeJSON(logger klog.Logger, w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only reachable through a programming error in the response types.
		logger.Error(err, "Encoding health response")
		http.Error(w, "encoding health response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	if _, err := w.Write(body); err != nil {
		logger.V(4).Info("Writing health response", "err", err)
	}
}

// statusCode maps a health verdict to the HTTP status probers act on.
func statusCode(healthy bool) int {
	if healthy {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

// statusForbidden is the body of /status for a client not on loopback.
const statusForbidden = "/status is served only to clients on loopback: run `shardproxy status` on the node"

// fromLoopback reports whether the request's client is on loopback (127.0.0.0/8, ::1, or
// 127.0.0.0/8 mapped into IPv6): a process on the node, in its network namespace. A
// client elsewhere cannot pose as one: the kernel drops loopback sources arriving on other
// interfaces as martians, and a TCP handshake from such an address would be answered to
// the node itself. Forwarded-for headers, which anyone can write, are ignored.
func fromLoopback(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}
