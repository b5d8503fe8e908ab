package coexist

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// testHealthEndpointsMatchKubeProxy: the supervisor's /healthz and /livez carry every
// field the real kube-proxy's carry on the same node, with the same JSON kinds, down to
// the per-family status, so that load balancers, probes and scripts written against
// kube-proxy read ours (which add "instances"); both answer 200 with the same
// Content-Type while healthy. Read from the client namespace, as a load balancer does.
func testHealthEndpointsMatchKubeProxy(t *testing.T) {
	e, _ := environment(t)
	ctx := context.Background()
	url := func(port int, path string) string {
		return "http://" + net.JoinHostPort(netns.NodeIPv4, strconv.Itoa(port)) + path
	}
	for _, path := range []string{"/healthz", "/livez"} {
		var theirs, ours healthAnswer
		testutil.Eventually(t, waitTimeout, "kube-proxy and shardproxy answering 200 on "+path, func() bool {
			theirs = getHealth(ctx, e, url(env.KubeProxyHealthzPort, path))
			ours = getHealth(ctx, e, url(env.HealthzPort, path))
			return theirs.code == http.StatusOK && ours.code == http.StatusOK
		})
		if theirs.contentType != ours.contentType {
			t.Errorf("%s: Content-Type %q, kube-proxy's %q", path, ours.contentType, theirs.contentType)
		}
		if len(theirs.body) == 0 {
			t.Fatalf("%s: kube-proxy answered no fields: %v", path, theirs.err)
		}
		for _, problem := range shapeDiff(path, theirs.body, ours.body) {
			t.Error(problem)
		}
		t.Logf("%s: kube-proxy %s; shardproxy %s", path, theirs.raw, ours.raw)
	}
}

// healthAnswer is one GET of a health endpoint.
type healthAnswer struct {
	code        int
	contentType string
	raw         string
	body        map[string]any
	err         error
}

func getHealth(ctx context.Context, e *env.Env, url string) healthAnswer {
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: e.TP.Dialer(e.TP.Client), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return healthAnswer{err: err}
	}
	resp, err := client.Do(req)
	if err != nil {
		return healthAnswer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	a := healthAnswer{code: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), raw: string(raw), err: err}
	if err == nil {
		a.err = json.Unmarshal(raw, &a.body)
	}
	return a
}

// shapeDiff lists where ours lacks a field of theirs or holds it as another JSON kind,
// recursing into objects; fields only ours has are fine.
func shapeDiff(at string, theirs, ours any) []string {
	tm, isObject := theirs.(map[string]any)
	if !isObject {
		if kind(theirs) != kind(ours) {
			return []string{fmt.Sprintf("%s: %s (%v), kube-proxy's is %s (%v)", at, kind(ours), ours, kind(theirs), theirs)}
		}
		return nil
	}
	om, ok := ours.(map[string]any)
	if !ok {
		return []string{fmt.Sprintf("%s: %s (%v), kube-proxy's is an object", at, kind(ours), ours)}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(tm)) {
		v, ok := om[k]
		if !ok {
			out = append(out, fmt.Sprintf("%s: no field %q, which kube-proxy's has (%v)", at, k, tm[k]))
			continue
		}
		out = append(out, shapeDiff(at+"."+k, tm[k], v)...)
	}
	return out
}

// kind names a decoded JSON value's kind.
func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// TestShapeDiff: the comparison names a field ours lacks and one of another kind, at any
// depth, and lets ours have more.
func TestShapeDiff(t *testing.T) {
	theirs := map[string]any{"healthy": true, "status": map[string]any{"IPv4": map[string]any{"lastUpdated": "t", "healthy": true}}}
	for _, c := range []struct {
		name string
		ours map[string]any
		want int
	}{
		{"same, and more", map[string]any{"healthy": false, "instances": map[string]any{},
			"status": map[string]any{"IPv4": map[string]any{"lastUpdated": "u", "healthy": false}}}, 0},
		{"a field missing deep down", map[string]any{"healthy": true, "status": map[string]any{"IPv4": map[string]any{"healthy": true}}}, 1},
		{"another kind", map[string]any{"healthy": "true", "status": map[string]any{"IPv4": "ok"}}, 2},
	} {
		if got := shapeDiff("/healthz", theirs, c.ours); len(got) != c.want {
			t.Errorf("%s: %d differences %q, want %d", c.name, len(got), got, c.want)
		}
	}
}
