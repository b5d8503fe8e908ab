package app

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestNodeAddressesHealthAndMetrics serves a leading writer's /healthz and /metrics:
// while the API server refuses its writes for longer than SyncTimeout, /healthz answers
// 503 with the error and the
// error counter grows; once they pass, /healthz is 200 and the list's Node count is in
// the metrics.
func TestNodeAddressesHealthAndMetrics(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}}})
	var refuse atomic.Bool
	refuse.Store(true)
	client.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewServiceUnavailable("etcd is down")
		}
		return false, nil, nil
	})
	const ns = "shardproxy-system"
	m := metrics.NewNodeAddressWriter(ns + "/" + nodeaddrs.DefaultName)
	// A logger of the test's own: the writer's goroutines then never read klog's global
	// logger, which the package's other tests set (runCLI) while client-go's last
	// goroutines may still be finishing (a data race under -race).
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	w := &nodeaddrs.Writer{Client: client, Namespace: ns, Debounce: 10 * time.Millisecond, SyncTimeout: 500 * time.Millisecond,
		Recorder: m, Logger: logger}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serveNodeAddresses(ctx, l, w, m) }()
	elected := make(chan error, 1)
	go func() {
		elected <- nodeaddrs.RunElected(ctx, w, nodeaddrs.Election{Identity: "w-0", RetryPeriod: 100 * time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		if err := errors.Join(<-elected, <-served); err != nil {
			t.Errorf("the writer or its server: %v", err)
		}
	})
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + l.Addr().String() + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testutil.Eventually(t, 30*time.Second, "/healthz to fail while writes are refused", func() bool {
		code, body := get("/healthz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "etcd is down")
	})
	_, text := get("/metrics")
	if want := `shardproxy_node_addresses_writer_leader{configmap="shardproxy-system/shardproxy-nodeaddresses"} 1`; !strings.Contains(text, want) {
		t.Errorf("/metrics while refused has no %s:\n%s", want, text)
	}
	// One error per attempt: 1 or more, by the time of the scrape.
	if errs := `shardproxy_node_addresses_writer_publish_errors_total{configmap="shardproxy-system/shardproxy-nodeaddresses"} `; !strings.Contains(text, errs) ||
		strings.Contains(text, errs+"0\n") {
		t.Errorf("/metrics while refused counts no publish error:\n%s", text)
	}
	refuse.Store(false) // the retry, after 1 s of backoff, passes
	testutil.Eventually(t, 30*time.Second, "/healthz to pass once the list is written", func() bool {
		code, _ := get("/healthz")
		return code == http.StatusOK
	})
	_, text = get("/metrics")
	for _, want := range []string{
		`shardproxy_node_addresses_writer_nodes{configmap="shardproxy-system/shardproxy-nodeaddresses"} 1`,
		`shardproxy_node_addresses_writer_last_publish_timestamp_seconds{configmap="shardproxy-system/shardproxy-nodeaddresses"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics once written has no %s:\n%s", want, text)
		}
	}
}

// TestNodeAddressesClientConnection: the node address writer's client, however its
// kubeconfig is found, carries the supervisor's clientConnection defaults (kube-proxy's
// rate and protobuf) and names itself.
func TestNodeAddressesClientConnection(t *testing.T) {
	const server = "https://192.0.2.7:6443"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	body := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"" + server + "\"}\n" +
		"contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n"
	if err := os.WriteFile(kubeconfig, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		flag string // --kubeconfig
		env  string // $KUBECONFIG
	}{
		{name: "the --kubeconfig file", flag: kubeconfig},
		{name: "the files of $KUBECONFIG", env: kubeconfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.env)
			rc, err := nodeAddressesRESTConfig(tc.flag)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []struct {
				field     string
				got, want any
			}{
				{"Host", rc.Host, server},
				{"QPS", rc.QPS, float32(5)},
				{"Burst", rc.Burst, 10},
				{"ContentType", rc.ContentType, "application/vnd.kubernetes.protobuf"},
				{"AcceptContentTypes", rc.AcceptContentTypes, "application/vnd.kubernetes.protobuf,application/json"},
				{"UserAgent", rc.UserAgent, "shardproxy-node-addresses"},
			} {
				if f.got != f.want {
					t.Errorf("%s = %v, want %v", f.field, f.got, f.want)
				}
			}
		})
	}
}

// TestParseMaxEgress: --max-egress takes a quantity of bytes a second or a plain number,
// and refuses fractions and negatives.
func TestParseMaxEgress(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "50Mi", want: 50 << 20},
		{in: "10M", want: 10_000_000},
		{in: "52428800", want: 52428800},
		{in: "0", want: 0},
		{in: "-1", wantErr: "0 or more"},
		{in: "0.5", wantErr: "whole number"},
		{in: "fast", wantErr: `--max-egress "fast"`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseMaxEgress(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("parseMaxEgress(%q) = %d, %v, want an error with %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("parseMaxEgress(%q) = %d, %v, want %d", tc.in, got, err, tc.want)
			}
		})
	}
}
