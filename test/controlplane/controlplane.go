// Package controlplane runs a real, throwaway Kubernetes control plane for integration
// tests, the e2e suite and the demo: Debian's etcd and a kube-apiserver built from the
// k8s.io/kubernetes Go module (hack/build-apiserver.sh), on free ports, with token
// authentication, RBAC, a dual-stack service CIDR and a service-account token signer.
// There is no controller manager and no scheduler: objects are stored and served, and
// nothing acts on them except what kube-apiserver does itself (default namespace, default
// ServiceCIDR, ClusterIP and NodePort allocation, RBAC bootstrap roles, TokenRequest).
//
// Tests call Start (or StartWith); other programs call StartProcess and the stop function
// it returns. hack/local-up.sh runs one for humans.
package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// Defaults for Options.
const (
	DefaultBindAddress  = "127.0.0.1"
	DefaultStartTimeout = 2 * time.Minute
	// DefaultServiceAccountIssuer is the issuer of service-account tokens, as in kubeadm
	// clusters.
	DefaultServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
)

// DefaultServiceCIDRs are the service CIDRs of the control plane, IPv4 first: the range of
// the default ServiceCIDR object "kubernetes" and of --service-cluster-ip-range.
var DefaultServiceCIDRs = []string{"10.96.0.0/16", "fd00:96::/112"}

// Admin credentials, in the token file. system:masters passes every RBAC check.
const (
	adminUser  = "shardproxy-admin"
	adminGroup = "system:masters"
)

// ErrEtcdNotFound is returned when there is no etcd binary; hack/install-deps.sh installs
// Debian's etcd-server.
var ErrEtcdNotFound = errors.New("etcd is not installed (run hack/install-deps.sh)")

// Options configure StartProcess. The zero value is a loopback-only control plane.
type Options struct {
	// BindAddress is where kube-apiserver listens (default 127.0.0.1). Use 0.0.0.0 to let
	// a network namespace reach it through a veth to the host side.
	BindAddress string
	// AdvertiseAddress is kube-apiserver's --advertise-address: the endpoint of the
	// "kubernetes" Service in the default namespace. Default: BindAddress, or 127.0.0.1
	// when BindAddress is unspecified (0.0.0.0 or ::). A loopback address cannot be an
	// endpoint, so with one the "kubernetes" Service has none; set a host address (a
	// veth's, with BindAddress 0.0.0.0) to give it one.
	AdvertiseAddress string
	// ServiceCIDRs is the primary service CIDR and optionally a secondary one of the other
	// family (default DefaultServiceCIDRs).
	ServiceCIDRs []string
	// APIServerBinary is the kube-apiserver to run (default APIServerBinary, which may
	// build it).
	APIServerBinary string
	// EtcdBinary is the etcd to run (default etcd from $PATH).
	EtcdBinary string
	// Dir is where the control plane's temporary directory goes (default os.TempDir()).
	// etcd's data goes to /dev/shm when there is one: fsync on tmpfs is free.
	Dir string
	// StartTimeout bounds the start after the binaries are found (default
	// DefaultStartTimeout); ctx can end it sooner.
	StartTimeout time.Duration
	// ExtraAPIServerArgs are appended to kube-apiserver's flags, e.g. "--v=4" or
	// "--feature-gates=...".
	ExtraAPIServerArgs []string
	// Netns, when set, runs etcd and kube-apiserver inside that network namespace (so
	// nodes in other test namespaces reach it through their own veths). Dial must then
	// open connections inside it; the control plane's own checks and Client use it.
	Netns string
	// Dial opens client connections to the control plane (default: net.Dialer).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Progress receives one line per start step and the build output when the
	// kube-apiserver binary has to be built (default none).
	Progress func(format string, args ...any)
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	// Host is the URL clients use, https://127.0.0.1:PORT for the default BindAddress.
	Host string
	// Port is kube-apiserver's secure port.
	Port int
	// Kubeconfig is a kubeconfig file for the admin token, pointing at Host.
	Kubeconfig string
	// AdminToken is a bearer token of a user in system:masters.
	AdminToken string
	// ServiceCIDRs are the service CIDRs, primary first.
	ServiceCIDRs []string
	// Dir is the control plane's temporary directory: kubeconfigs, serving certificates,
	// the service-account key and the etcd and kube-apiserver logs. Stopping removes it.
	Dir string
	// APIServerLog and EtcdLog are the processes' log files in Dir.
	APIServerLog, EtcdLog string

	etcd, apiserver *process
	etcdDataDir     string
	client          kubernetes.Interface
	dial            func(ctx context.Context, network, address string) (net.Conn, error)
	// etcdURL is etcd's client URL; apiserverCmd is how kube-apiserver was started, for
	// RestartAPIServer. apiMu guards apiserver, which StopAPIServer and StartAPIServer
	// replace while tests run.
	etcdURL      string
	apiserverCmd apiserverCommand
	apiMu        sync.Mutex
}

// Start starts a control plane with the default Options for the test and stops it when
// the test ends, leaving no processes or files behind. It skips the test with the reason
// when etcd is missing or under -short (the first run builds kube-apiserver, which takes
// minutes). It logs the tail of kube-apiserver's log when the test failed.
func Start(t testing.TB) *ControlPlane {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options; Progress defaults to t.Logf.
func StartWith(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if testing.Short() {
		testutil.Unavailable(t, "skipping the real control plane in -short mode: needs etcd and a kube-apiserver build")
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		testutil.Unavailable(t, "%v", ErrEtcdNotFound)
	}
	ctx := context.Background()
	if deadline, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if d, ok := deadline.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d)
			defer cancel()
		}
	}
	if opts.Progress == nil {
		opts.Progress = t.Logf
	}
	cp, stop, err := StartProcess(ctx, opts)
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log tail (%s):\n%s", cp.APIServerLog, cp.apiserver.logTail(40))
		}
		if err := stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	return cp
}

// StartProcess starts a control plane and returns it with the function that stops both
// processes and removes their files. ctx bounds only the start: the processes run until
// stop is called (or this process dies, which kills them).
func StartProcess(ctx context.Context, opts Options) (*ControlPlane, func() error, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	if opts.EtcdBinary == "" {
		path, err := exec.LookPath("etcd")
		if err != nil {
			return nil, nil, ErrEtcdNotFound
		}
		opts.EtcdBinary = path
	}
	if opts.APIServerBinary == "" {
		path, err := APIServerBinary(ctx, progressWriter(opts.Progress))
		if err != nil {
			return nil, nil, err
		}
		opts.APIServerBinary = path
	}

	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	start := time.Now()
	removeStale(opts.Dir, opts.Progress)

	cp := &ControlPlane{ServiceCIDRs: slices.Clone(opts.ServiceCIDRs)}
	stop := sync.OnceValue(cp.stop)
	if err := cp.start(ctx, opts); err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	opts.Progress("control plane ready at %s in %v (kubeconfig %s)", cp.Host, time.Since(start).Round(time.Millisecond), cp.Kubeconfig)
	return cp, stop, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.BindAddress == "" {
		o.BindAddress = DefaultBindAddress
	}
	bind := net.ParseIP(o.BindAddress)
	if bind == nil {
		return o, fmt.Errorf("bind address %q is not an IP address", o.BindAddress)
	}
	if o.AdvertiseAddress == "" {
		o.AdvertiseAddress = o.BindAddress
		if bind.IsUnspecified() {
			o.AdvertiseAddress = "127.0.0.1"
		}
	}
	if net.ParseIP(o.AdvertiseAddress) == nil {
		return o, fmt.Errorf("advertise address %q is not an IP address", o.AdvertiseAddress)
	}
	if len(o.ServiceCIDRs) == 0 {
		o.ServiceCIDRs = DefaultServiceCIDRs
	}
	if len(o.ServiceCIDRs) > 2 {
		return o, fmt.Errorf("service CIDRs %v: at most one per IP family", o.ServiceCIDRs)
	}
	for _, cidr := range o.ServiceCIDRs {
		if _, _, err := net.ParseCIDR(cidr); err != nil {
			return o, fmt.Errorf("service CIDR: %w", err)
		}
	}
	if o.Dir == "" {
		o.Dir = os.TempDir()
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	if o.Netns != "" && o.Dial == nil {
		return o, fmt.Errorf("control plane in network namespace %q needs a Dial function", o.Netns)
	}
	if o.Dial == nil {
		o.Dial = (&net.Dialer{}).DialContext
	}
	return o, nil
}

// clientHost is the address our clients use: BindAddress, or loopback of its family when
// kube-apiserver listens on every address.
func clientHost(bindAddress string) string {
	ip := net.ParseIP(bindAddress)
	switch {
	case !ip.IsUnspecified():
		return bindAddress
	case ip.To4() != nil:
		return "127.0.0.1"
	default:
		return "::1"
	}
}

func (cp *ControlPlane) start(ctx context.Context, opts Options) error {
	dir, err := os.MkdirTemp(opts.Dir, dirPrefix)
	if err != nil {
		return fmt.Errorf("creating the control plane directory: %w", err)
	}
	cp.Dir = dir
	cp.EtcdLog = filepath.Join(dir, "etcd.log")
	cp.APIServerLog = filepath.Join(dir, "kube-apiserver.log")
	if err := writeOwner(dir); err != nil {
		return err
	}
	cp.etcdDataDir = filepath.Join(dir, "etcd")
	if shm, err := os.MkdirTemp(shmDir, shmPrefix); err == nil {
		cp.etcdDataDir = shm
		if err := writeOwner(shm); err != nil {
			return err
		}
	}
	// etcd wants a data dir of its own, without our owner file.
	etcdData := filepath.Join(cp.etcdDataDir, "data")

	keyFile := filepath.Join(dir, "service-account.key")
	if err := writeServiceAccountKey(keyFile); err != nil {
		return err
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return err
	}
	cp.AdminToken = hex.EncodeToString(token)
	tokenFile := filepath.Join(dir, "tokens.csv")
	tokens := fmt.Sprintf("%s,%s,%s,%q\n", cp.AdminToken, adminUser, adminUser, adminGroup)
	if err := os.WriteFile(tokenFile, []byte(tokens), 0o600); err != nil {
		return err
	}

	// Ports are picked by binding to port 0 and closing again, so another process can take
	// one before our child binds it. Rare, but then start again on other ports.
	for attempt := 1; ; attempt++ {
		err := cp.startProcesses(ctx, opts, etcdData, keyFile, tokenFile)
		if err == nil || attempt == 3 || !errors.Is(err, errPortTaken) {
			return err
		}
		opts.Progress("%v; retrying on other ports", err)
		if err := cp.stopProcesses(); err != nil {
			return err
		}
		if err := os.RemoveAll(etcdData); err != nil {
			return err
		}
	}
}

var errPortTaken = errors.New("a port was taken before the process bound it")

func (cp *ControlPlane) startProcesses(ctx context.Context, opts Options, etcdData, keyFile, tokenFile string) error {
	ports := []int{2379, 2380, 6443} // a namespace of our own has every port free
	if opts.Netns == "" {
		var err error
		if ports, err = freePorts(opts.BindAddress, 3); err != nil {
			return err
		}
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	cp.etcdURL = etcdURL
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cp.Port = ports[2]
	cp.Host = "https://" + net.JoinHostPort(clientHost(opts.BindAddress), strconv.Itoa(cp.Port))
	if opts.Netns != "" {
		cp.Host = "https://" + net.JoinHostPort(opts.AdvertiseAddress, strconv.Itoa(cp.Port))
	}
	cp.dial = opts.Dial
	var err error

	opts.Progress("starting etcd on %s", etcdURL)
	cp.etcd, err = startProcess("etcd", cp.EtcdLog, opts.Netns, opts.EtcdBinary, []string{
		"--name=shardproxy",
		"--data-dir=" + etcdData,
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=shardproxy=" + peerURL,
		"--initial-cluster-state=new",
		"--logger=zap",
		"--log-outputs=stderr",
	})
	if err != nil {
		return err
	}
	httpClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: opts.Dial}}
	if err := waitReady(ctx, cp.etcd, httpClient, etcdURL+"/health", ""); err != nil {
		return err
	}

	opts.Progress("starting kube-apiserver on %s", cp.Host)
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + opts.BindAddress,
		"--advertise-address=" + opts.AdvertiseAddress,
		"--secure-port=" + strconv.Itoa(cp.Port),
		"--cert-dir=" + filepath.Join(cp.Dir, "certs"),
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=" + strings.Join(opts.ServiceCIDRs, ","),
		"--service-account-key-file=" + keyFile,
		"--service-account-signing-key-file=" + keyFile,
		"--service-account-issuer=" + DefaultServiceAccountIssuer,
		"--allow-privileged=true",
		"--profiling=false",
	}
	if net.ParseIP(opts.AdvertiseAddress).IsLoopback() {
		// The "kubernetes" Service cannot have a loopback endpoint (validation rejects it),
		// so the lease reconciler would fail and log it every 10s. Leave it without one.
		args = append(args, "--endpoint-reconciler-type=none")
	}
	cp.apiserverCmd = apiserverCommand{netns: opts.Netns, binary: opts.APIServerBinary, args: append(args, opts.ExtraAPIServerArgs...)}
	if err := cp.startAPIServer(ctx); err != nil {
		return err
	}

	cp.Kubeconfig = filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := WriteKubeconfig(cp.Kubeconfig, cp.Host, adminUser, cp.AdminToken); err != nil {
		return err
	}
	if cp.client, err = kubernetes.NewForConfig(cp.RESTConfig()); err != nil {
		return fmt.Errorf("building the admin client: %w", err)
	}
	return cp.waitBootstrapped(ctx)
}

// waitBootstrapped waits for what kube-apiserver creates after /readyz turns ok: the
// default namespace and the default ServiceCIDR, which tests need before they can create
// Services, and the "kubernetes" Service, which would otherwise appear in the middle of a
// test that watches Services.
func (cp *ControlPlane) waitBootstrapped(ctx context.Context) error {
	client := cp.client
	return poll(ctx, func() (bool, error) {
		if _, err := client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
			return false, ignoreNotFound(err)
		}
		cidr, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return false, ignoreNotFound(err)
		}
		for _, c := range cidr.Status.Conditions {
			if c.Type == networkingv1.ServiceCIDRConditionReady && c.Status == metav1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}, "waiting for the default ServiceCIDR and the kubernetes Service")
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// poll calls check every 100ms until it returns true or an error, or ctx ends.
func poll(ctx context.Context, check func() (bool, error), what string) error {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		done, err := check()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, context.Cause(ctx))
		case <-ticker.C:
		}
	}
}

// waitReady polls url until it answers 200, failing early with the end of the log when
// the process exits.
func waitReady(ctx context.Context, p *process, client *http.Client, url, token string) error {
	var last string
	err := poll(ctx, func() (bool, error) {
		if !p.running() {
			tail := p.logTail(30)
			err := fmt.Errorf("%s exited (%v) before it was ready; log %s ends:\n%s", p.name, p.waitErr, p.logPath, tail)
			if strings.Contains(tail, "address already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return false, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK, nil
	}, "waiting for "+p.name)
	if err != nil && last != "" && p.running() {
		return fmt.Errorf("%w (last answer from %s: %s); log %s ends:\n%s", err, url, last, p.logPath, p.logTail(30))
	}
	return err
}

// freePorts returns n distinct TCP ports that are free on address right now.
func freePorts(address string, n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(address, "0"))
		if err != nil {
			return nil, fmt.Errorf("finding a free port on %s: %w", address, err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeServiceAccountKey writes a new RSA private key. kube-apiserver signs tokens with it
// and verifies them with its public half, which it derives from the same file.
func writeServiceAccountKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating the service-account key: %w", err)
	}
	block := &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return fmt.Errorf("writing the service-account key: %w", err)
	}
	return nil
}

// stop stops both processes and removes the control plane's files.
func (cp *ControlPlane) stop() error {
	err := cp.stopProcesses()
	for _, dir := range []string{cp.etcdDataDir, cp.Dir} {
		if dir == "" {
			continue
		}
		if rmErr := os.RemoveAll(dir); rmErr != nil {
			err = errors.Join(err, rmErr)
		}
	}
	return err
}

// stopProcesses stops kube-apiserver, then etcd, which it needs until it has stopped.
func (cp *ControlPlane) stopProcesses() error {
	var errs []error
	errs = append(errs, cp.StopAPIServer())
	if cp.etcd != nil {
		errs = append(errs, cp.etcd.stop(10*time.Second))
	}
	return errors.Join(errs...)
}

// PIDs returns the process ids of etcd and kube-apiserver, for tests that check they are
// gone after stopping.
func (cp *ControlPlane) PIDs() []int {
	var pids []int
	cp.apiMu.Lock()
	defer cp.apiMu.Unlock()
	for _, p := range []*process{cp.etcd, cp.apiserver} {
		if p != nil {
			pids = append(pids, p.cmd.Process.Pid)
		}
	}
	return pids
}

// RESTConfig returns a client configuration for the admin token. The serving certificate
// is self-signed, so TLS verification is off.
func (cp *ControlPlane) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            cp.Host,
		BearerToken:     cp.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             200,
		Burst:           400,
		Dial:            cp.dial,
	}
}

// Client returns a client with the admin token.
func (cp *ControlPlane) Client() kubernetes.Interface {
	return cp.client
}

// progressWriter turns a Progress function into a writer, one call per line.
func progressWriter(progress func(string, ...any)) *lineWriter {
	return &lineWriter{emit: func(line string) { progress("%s", line) }}
}

type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.emit(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}
