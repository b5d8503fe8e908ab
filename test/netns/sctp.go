package netns

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// Go's net package has no SCTP: the helpers below use SOCK_STREAM SCTP sockets (the
// one-to-one style, which behaves as TCP does: listen, accept, connect, read, write) from
// golang.org/x/sys/unix, made non-blocking and wrapped in os.File so that Go's poller waits
// on them and deadlines bound every wait.

// SCTPAvailable returns nil when this kernel opens SCTP sockets, and the reason otherwise:
// a kernel built without SCTP (CONFIG_IP_SCTP unset) answers EPROTONOSUPPORT, and one whose
// sctp module cannot load does the same. Opening the socket makes the kernel load the
// module on demand ("net-pf-2-proto-132"), as any SCTP program on a node would.
func SCTPAvailable() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): %w", err)
	}
	return unix.Close(fd)
}

// sctpSocket opens a non-blocking one-to-one SCTP socket of ip's family; an IPv6 socket is
// IPv6-only, so that its associations never list IPv4 addresses.
func sctpSocket(ip netip.Addr) (int, error) {
	domain := unix.AF_INET
	if ip.Is6() && !ip.Is4In6() {
		domain = unix.AF_INET6
	}
	fd, err := unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return -1, fmt.Errorf("opening an SCTP socket: %w", err)
	}
	if domain == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			_ = unix.Close(fd)
			return -1, fmt.Errorf("setting IPV6_V6ONLY: %w", err)
		}
	}
	return fd, nil
}

func sockaddr(ip netip.Addr, port int) unix.Sockaddr {
	if ip.Is4() || ip.Is4In6() {
		return &unix.SockaddrInet4{Addr: ip.Unmap().As4(), Port: port}
	}
	return &unix.SockaddrInet6{Addr: ip.As16(), Port: port}
}

func addrPortOf(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// sctpServer is the SCTP side of an identity server: listening sockets and the
// associations it has accepted and not yet seen end.
type sctpServer struct {
	listeners []*os.File
	closed    atomic.Bool
	mu        sync.Mutex
	conns     map[*os.File]bool
}

// listenSCTP opens a listening SCTP socket on addr:port; it runs inside the server's
// namespace.
func (s *server) listenSCTP(addr string, port int) error {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Errorf("parsing listen address: %w", err)
	}
	fd, err := sctpSocket(ip)
	if err != nil {
		return err
	}
	if err := unix.Bind(fd, sockaddr(ip, port)); err != nil {
		_ = unix.Close(fd)
		return fmt.Errorf("binding SCTP to [%s]:%d: %w", addr, port, err)
	}
	if err := unix.Listen(fd, 64); err != nil {
		_ = unix.Close(fd)
		return fmt.Errorf("listening on SCTP [%s]:%d: %w", addr, port, err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("sctp-listen-[%s]:%d", addr, port))
	s.sctp.listeners = append(s.sctp.listeners, f)
	return nil
}

// serveSCTP accepts associations until the server stops. Each gets the identity reply at
// once and stays open until the client ends it (or the server stops), so that a client
// may hold an association, and its conntrack entry, as long as it needs.
func (s *server) serveSCTP(l *os.File) {
	rc, err := l.SyscallConn()
	if err != nil {
		s.logf("server %q: SCTP listener: %v", s.name, err)
		return
	}
	for {
		var nfd int
		var peer unix.Sockaddr
		var acceptErr error
		err := rc.Read(func(fd uintptr) bool {
			nfd, peer, acceptErr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			return !errors.Is(acceptErr, unix.EAGAIN)
		})
		if s.sctp.closed.Load() {
			if err == nil && acceptErr == nil {
				_ = unix.Close(nfd)
			}
			return
		}
		if err == nil {
			err = acceptErr
		}
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			continue
		}
		if err != nil {
			s.logf("server %q: accepting SCTP: %v", s.name, err)
			return
		}
		conn := os.NewFile(uintptr(nfd), "sctp-assoc")
		if !s.sctp.track(conn) {
			_ = conn.Close()
			return
		}
		s.wg.Go(func() { s.serveAssociation(conn, addrPortOf(peer)) })
	}
}

// track registers an accepted association; false when the server is stopping.
func (s *sctpServer) track(conn *os.File) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	if s.conns == nil {
		s.conns = map[*os.File]bool{}
	}
	s.conns[conn] = true
	return true
}

func (s *server) serveAssociation(conn *os.File, peer netip.AddrPort) {
	defer func() {
		s.sctp.mu.Lock()
		delete(s.sctp.conns, conn)
		s.sctp.mu.Unlock()
		_ = conn.Close()
	}()
	reply := s.name + " " + peer.Addr().Unmap().String() + "\n"
	if err := conn.SetWriteDeadline(time.Now().Add(DefaultDialTimeout)); err != nil {
		s.logf("server %q: SCTP deadline: %v", s.name, err)
		return
	}
	if _, err := conn.Write([]byte(reply)); err != nil {
		s.logf("server %q: replying over SCTP to %s: %v", s.name, peer, err)
		return
	}
	// Wait for the client's end (read returns 0 on its SHUTDOWN) or the server's stop.
	buf := make([]byte, 512)
	for {
		if _, err := conn.Read(buf); err != nil {
			return
		}
	}
}

// stop closes the listeners and every open association.
func (s *sctpServer) stop() {
	s.mu.Lock()
	s.closed.Store(true)
	for c := range s.conns {
		// Closing wakes the association's reader; it then closes the file itself.
		_ = c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	for _, l := range s.listeners {
		_ = l.Close()
	}
}

// SCTPAssociation is a client's open SCTP association to an identity server.
type SCTPAssociation struct {
	// Reply is what the server answered.
	Reply Reply
	// Local is the client's own address and port, as its namespace sees them (before any
	// rewriting on the way).
	Local netip.AddrPort
	f     *os.File
}

// Close ends the association (SCTP SHUTDOWN).
func (a *SCTPAssociation) Close() error {
	return a.f.Close()
}

// OpenSCTP opens an SCTP association from namespace ns to addr:port, reads the identity
// server's reply and keeps the association open until Close, so that its conntrack entry
// stays established. Errors are as Dial's: IsRefused for an ABORT or an ICMP port
// unreachable, IsTimeout when nothing answered within opts.Timeout.
func (tp *Topology) OpenSCTP(ns, addr string, port int, opts DialOptions) (*SCTPAssociation, error) {
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultDialTimeout
	}
	deadline := time.Now().Add(timeout)
	a, err := openSCTP(tp, ns, addr, port, opts.SourcePort, deadline)
	if err != nil {
		return nil, fmt.Errorf("sctp from %s to [%s]:%d: %w", ns, addr, port, err)
	}
	return a, nil
}

func openSCTP(tp *Topology, ns, addr string, port, srcPort int, deadline time.Time) (*SCTPAssociation, error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("parsing address: %w", err)
	}
	var f *os.File
	if err := tp.Do(ns, func() error {
		fd, err := sctpSocket(ip)
		if err != nil {
			return err
		}
		if srcPort != 0 {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
				_ = unix.Close(fd)
				return fmt.Errorf("setting SO_REUSEADDR: %w", err)
			}
			unspec := netip.IPv4Unspecified()
			if ip.Is6() && !ip.Is4In6() {
				unspec = netip.IPv6Unspecified()
			}
			if err := unix.Bind(fd, sockaddr(unspec, srcPort)); err != nil {
				_ = unix.Close(fd)
				return fmt.Errorf("binding source port %d: %w", srcPort, err)
			}
		}
		if err := unix.Connect(fd, sockaddr(ip, port)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			_ = unix.Close(fd)
			return fmt.Errorf("connecting: %w", err)
		}
		f = os.NewFile(uintptr(fd), "sctp-client")
		return nil
	}); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
		}
	}()
	if err := f.SetDeadline(deadline); err != nil {
		return nil, err
	}
	if err := waitConnected(f); err != nil {
		return nil, err
	}
	local, err := localAddrPort(f)
	if err != nil {
		return nil, err
	}
	// The reply is one line; the association stays open after it.
	line, err := bufio.NewReaderSize(f, 512).ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("reading reply: %w", err)
	}
	fields := strings.Fields(line)
	if len(fields) != 2 {
		return nil, fmt.Errorf("malformed reply %q", line)
	}
	ok = true
	return &SCTPAssociation{Reply: Reply{Server: fields[0], Source: fields[1]}, Local: local, f: f}, nil
}

// waitConnected waits, up to f's deadline, for a non-blocking connect to finish, and
// returns its error (ECONNREFUSED for an ABORT or port unreachable).
func waitConnected(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var connErr error
	// The state is checked before every wait, the first included: the poller forgets a
	// readiness that came before this call (the association may be up already), so
	// waiting first could wait for an edge that never comes.
	if err := rc.Write(func(fd uintptr) bool {
		soErr, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			connErr = fmt.Errorf("reading SO_ERROR: %w", err)
			return true
		}
		switch e := unix.Errno(soErr); e {
		case 0:
			if _, err := unix.Getpeername(int(fd)); errors.Is(err, unix.ENOTCONN) {
				return false
			}
			return true
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			return false
		default:
			connErr = fmt.Errorf("connecting: %w", e)
			return true
		}
	}); err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	return connErr
}

func localAddrPort(f *os.File) (netip.AddrPort, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.Sockaddr
	var nameErr error
	if err := rc.Control(func(fd uintptr) { sa, nameErr = unix.Getsockname(int(fd)) }); err != nil {
		return netip.AddrPort{}, err
	}
	if nameErr != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockname: %w", nameErr)
	}
	return addrPortOf(sa), nil
}

// RequireSCTP ends a test that sends real SCTP where the kernel has none (SCTPAvailable):
// it skips with the reason, or fails in CI mode (testutil.CI), where the test must run.
// The host's CI layers, whose kernel lacks SCTP, leave such tests out by name
// (hack/layers.sh's kernel_skip); hack/kernels.sh's VMs run them in CI mode, so a
// guest whose sctp module does not load fails them.
func RequireSCTP(t testing.TB) {
	t.Helper()
	if err := SCTPAvailable(); err != nil {
		testutil.Unavailable(t, "real SCTP traffic: this kernel has no SCTP (%v); "+
			"make kernels runs this test on Debian's kernels, which have it", err)
	}
}
