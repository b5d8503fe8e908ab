package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// apiserverCommand is how kube-apiserver is started, kept so it can be started again.
type apiserverCommand struct {
	netns, binary string
	args          []string
}

// startAPIServer starts kube-apiserver and waits until /readyz answers 200.
func (cp *ControlPlane) startAPIServer(ctx context.Context) error {
	c := cp.apiserverCmd
	p, err := startProcess("kube-apiserver", cp.APIServerLog, c.netns, c.binary, c.args)
	if err != nil {
		return err
	}
	cp.apiMu.Lock()
	cp.apiserver = p
	cp.apiMu.Unlock()
	// kube-apiserver serves a self-signed certificate it generated into --cert-dir.
	httpsClient := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DialContext: cp.dial},
	}
	defer httpsClient.CloseIdleConnections()
	return waitReady(ctx, p, httpsClient, cp.Host+"/readyz", cp.AdminToken)
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 15s) and leaves etcd
// running: every watch breaks and every request fails until StartAPIServer. Stopping a
// stopped kube-apiserver does nothing.
func (cp *ControlPlane) StopAPIServer() error {
	cp.apiMu.Lock()
	p := cp.apiserver
	cp.apiMu.Unlock()
	if p == nil {
		return nil
	}
	return p.stop(15 * time.Second)
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the same flags,
// port, certificates and etcd, and waits until it is ready (bounded by ctx and
// DefaultStartTimeout). Clients reconnect on their own.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	cp.apiMu.Lock()
	running := cp.apiserver != nil && cp.apiserver.running()
	cp.apiMu.Unlock()
	if running {
		return errors.New("kube-apiserver is already running")
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultStartTimeout)
	defer cancel()
	if err := cp.startAPIServer(ctx); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	return nil
}

// Compact compacts etcd's history up to its current revision (physically, as the
// apiserver's own periodic compaction does) and returns that revision. A watch that
// resumes from an older resource version then fails with "too old resource version"
// (410 Gone) wherever it is served from etcd, and its client must list again.
func (cp *ControlPlane) Compact(ctx context.Context) (int64, error) {
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	// Any key will do: the answer's header carries the store's current revision.
	key := base64.StdEncoding.EncodeToString([]byte("/registry/namespaces/default"))
	if err := cp.etcdCall(ctx, "/v3/kv/range", map[string]any{"key": key, "keys_only": true}, &rng); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(rng.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd revision %q: %w", rng.Header.Revision, err)
	}
	if err := cp.etcdCall(ctx, "/v3/kv/compaction", map[string]any{"revision": rev, "physical": true}, nil); err != nil {
		return 0, err
	}
	return rev, nil
}

// etcdCall posts a request to etcd's JSON gateway and decodes the answer into out.
func (cp *ControlPlane) etcdCall(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cp.etcdURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: cp.dial}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("etcd %s: decoding %q: %w", path, data, err)
	}
	return nil
}
