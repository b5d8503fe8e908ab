package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// DefaultDialTimeout bounds one Dial exchange unless DialOptions.Timeout says otherwise.
const DefaultDialTimeout = 2 * time.Second

// Reply is what an identity server answered.
type Reply struct {
	// Server is the name the server was started with.
	Server string
	// Source is the client address the server saw, IPv4 in dotted form.
	Source string
}

// StartServer starts an identity server in namespace ns listening on every address, IPv4
// and IPv6, on port; proto is "tcp", "udp" or "sctp". For each TCP connection, UDP
// datagram and SCTP association it replies "<name> <source-ip-it-saw>\n". It stops on
// test cleanup. Call it from the test goroutine: it fails the test if it cannot listen
// (for SCTP, also where the kernel has none: check SCTPAvailable first).
func (tp *Topology) StartServer(ns, name, proto string, port int) {
	tp.t.Helper()
	tp.StartServerAt(ns, name, proto, "", port)
}

// StartServerAt is StartServer listening on addr only; "" and "::" mean every address of
// both families, "0.0.0.0" every IPv4 address.
func (tp *Topology) StartServerAt(ns, name, proto, addr string, port int) {
	tp.t.Helper()
	stop, err := tp.Serve(ns, name, proto, addr, port, tp.t.Logf)
	if err != nil {
		tp.t.Fatal(err)
	}
	tp.t.Cleanup(stop)
}

// Serve is StartServerAt for callers that are not tests: it returns the function that
// stops the server, and logs problems through logf.
func (tp *Topology) Serve(ns, name, proto, addr string, port int, logf func(string, ...any)) (stop func(), err error) {
	s := &server{name: name, logf: logf}
	if err := tp.Do(ns, func() error { return s.listen(proto, addr, port) }); err != nil {
		s.stop()
		return nil, fmt.Errorf("starting %s server %q on [%s]:%d in %s: %w", proto, name, addr, port, ns, err)
	}
	s.serve()
	return s.stop, nil
}

// Dialer returns a dial function whose connections are opened inside namespace ns (for
// HTTP and API clients talking to servers in a test namespace).
func (tp *Topology) Dialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := tp.Do(ns, func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

type server struct {
	name    string
	logf    func(format string, args ...any)
	tcp     []net.Listener
	udp     []datagramConn
	sctp    sctpServer
	closers []io.Closer
	wg      sync.WaitGroup
}

// datagramConn reads and writes datagrams together with their local address, so a reply
// leaves from the address the request was sent to even on a host with many addresses
// (node, node2), as a real UDP server on a multi-homed host must.
type datagramConn struct {
	read  func(b []byte) (n int, src net.Addr, dst net.IP, err error)
	write func(b []byte, src net.IP, dst net.Addr) error
}

// listen creates the sockets; it runs inside the server's namespace.
func (s *server) listen(proto, addr string, port int) error {
	switch proto {
	case "tcp":
		l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		s.tcp = append(s.tcp, l)
		s.closers = append(s.closers, l)
		return nil
	case "udp":
		switch addr {
		case "", "::":
			// Two single-family sockets rather than one dual-stack one: only so does
			// every datagram come with its destination address.
			if err := s.listenUDP("udp4", "0.0.0.0", port); err != nil {
				return err
			}
			return s.listenUDP("udp6", "::", port)
		default:
			ip, err := netip.ParseAddr(addr)
			if err != nil {
				return fmt.Errorf("parsing listen address: %w", err)
			}
			if ip.Is4() {
				return s.listenUDP("udp4", addr, port)
			}
			return s.listenUDP("udp6", addr, port)
		}
	case "sctp":
		switch addr {
		case "", "::":
			// Two single-family sockets, as for UDP: an IPv6 SCTP socket that also took
			// IPv4 would list the namespace's IPv4 addresses in its associations.
			if err := s.listenSCTP("0.0.0.0", port); err != nil {
				return err
			}
			return s.listenSCTP("::", port)
		default:
			return s.listenSCTP(addr, port)
		}
	default:
		return fmt.Errorf("unsupported protocol %q (want tcp, udp or sctp)", proto)
	}
}

func (s *server) listenUDP(network, addr string, port int) error {
	c, err := net.ListenPacket(network, net.JoinHostPort(addr, strconv.Itoa(port)))
	if err != nil {
		return err
	}
	s.closers = append(s.closers, c)
	if network == "udp4" {
		p := ipv4.NewPacketConn(c)
		if err := p.SetControlMessage(ipv4.FlagDst, true); err != nil {
			return fmt.Errorf("asking for IPv4 destination addresses: %w", err)
		}
		s.udp = append(s.udp, datagramConn{
			read: func(b []byte) (int, net.Addr, net.IP, error) {
				n, cm, src, err := p.ReadFrom(b)
				if cm == nil {
					return n, src, nil, err
				}
				return n, src, cm.Dst, err
			},
			write: func(b []byte, src net.IP, dst net.Addr) error {
				_, err := p.WriteTo(b, &ipv4.ControlMessage{Src: src}, dst)
				return err
			},
		})
		return nil
	}
	p := ipv6.NewPacketConn(c)
	if err := p.SetControlMessage(ipv6.FlagDst, true); err != nil {
		return fmt.Errorf("asking for IPv6 destination addresses: %w", err)
	}
	s.udp = append(s.udp, datagramConn{
		read: func(b []byte) (int, net.Addr, net.IP, error) {
			n, cm, src, err := p.ReadFrom(b)
			if cm == nil {
				return n, src, nil, err
			}
			return n, src, cm.Dst, err
		},
		write: func(b []byte, src net.IP, dst net.Addr) error {
			_, err := p.WriteTo(b, &ipv6.ControlMessage{Src: src}, dst)
			return err
		},
	})
	return nil
}

func (s *server) serve() {
	for _, l := range s.tcp {
		s.wg.Go(func() { s.serveTCP(l) })
	}
	for _, c := range s.udp {
		s.wg.Go(func() { s.serveUDP(c) })
	}
	for _, l := range s.sctp.listeners {
		s.wg.Go(func() { s.serveSCTP(l) })
	}
}

func (s *server) serveTCP(l net.Listener) {
	for {
		conn, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			s.logf("server %q: accepting: %v", s.name, err)
			return
		}
		// The client sends nothing: closing right after the reply sends a FIN, and the
		// client reads to EOF, so the server side is the one left in TIME_WAIT and the
		// client may reuse its source port at once.
		if _, err := conn.Write([]byte(s.reply(conn.RemoteAddr()))); err != nil {
			s.logf("server %q: replying to %s: %v", s.name, conn.RemoteAddr(), err)
		}
		_ = conn.Close()
	}
}

func (s *server) serveUDP(c datagramConn) {
	buf := make([]byte, 1500)
	for {
		_, src, dst, err := c.read(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			s.logf("server %q: reading: %v", s.name, err)
			return
		}
		// A failed reply (say, a test's rule drops it) must not stop the server.
		if err := c.write([]byte(s.reply(src)), dst, src); err != nil {
			s.logf("server %q: replying to %s: %v", s.name, src, err)
		}
	}
}

func (s *server) reply(remote net.Addr) string {
	var ip netip.Addr
	switch a := remote.(type) {
	case *net.TCPAddr:
		ip = a.AddrPort().Addr()
	case *net.UDPAddr:
		ip = a.AddrPort().Addr()
	}
	return s.name + " " + ip.Unmap().String() + "\n"
}

func (s *server) stop() {
	for _, c := range s.closers {
		_ = c.Close()
	}
	s.sctp.stop()
	s.wg.Wait()
}

// DialOptions tune DialWith.
type DialOptions struct {
	// SourcePort binds the client socket to this local port; 0 picks an ephemeral one.
	SourcePort int
	// Timeout bounds the whole exchange; 0 means DefaultDialTimeout.
	Timeout time.Duration
}

// Dial sends one request from namespace ns to addr:port over proto ("tcp", "udp" or
// "sctp": one association, closed after the reply) and returns the reply. A refused connection returns an error for which IsRefused is true, a
// timeout (after DefaultDialTimeout) one for which IsTimeout is true.
func (tp *Topology) Dial(ns, proto, addr string, port int) (Reply, error) {
	return tp.DialWith(ns, proto, addr, port, DialOptions{})
}

// DialFrom is Dial from local port srcPort, so that consecutive requests share a
// connection-tracking tuple.
func (tp *Topology) DialFrom(ns, proto, addr string, port, srcPort int) (Reply, error) {
	return tp.DialWith(ns, proto, addr, port, DialOptions{SourcePort: srcPort})
}

// DialWith is Dial with options. UDP uses a connected socket, so an ICMP port unreachable
// comes back as a refusal, and a reply from any address but addr:port is never seen.
func (tp *Topology) DialWith(ns, proto, addr string, port int, opts DialOptions) (Reply, error) {
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultDialTimeout
	}
	deadline := time.Now().Add(timeout)
	target := net.JoinHostPort(addr, strconv.Itoa(port))
	fail := func(err error) (Reply, error) {
		return Reply{}, fmt.Errorf("%s from %s to %s: %w", proto, ns, target, err)
	}

	if proto == "sctp" {
		a, err := openSCTP(tp, ns, addr, port, opts.SourcePort, deadline)
		if err != nil {
			return fail(err)
		}
		_ = a.Close()
		return a.Reply, nil
	}
	d := net.Dialer{Deadline: deadline}
	if opts.SourcePort != 0 {
		d.Control = reuseAddr
		switch proto {
		case "tcp":
			d.LocalAddr = &net.TCPAddr{Port: opts.SourcePort}
		case "udp":
			d.LocalAddr = &net.UDPAddr{Port: opts.SourcePort}
		}
	}
	if proto != "tcp" && proto != "udp" {
		return fail(fmt.Errorf("unsupported protocol %q (want tcp or udp)", proto))
	}
	var conn net.Conn
	if err := tp.Do(ns, func() error {
		var err error
		conn, err = d.Dial(proto, target)
		return err
	}); err != nil {
		return fail(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return fail(err)
	}

	var data []byte
	if proto == "tcp" {
		b, err := io.ReadAll(conn)
		if err != nil {
			return fail(fmt.Errorf("reading reply: %w", err))
		}
		data = b
	} else {
		if _, err := conn.Write([]byte("hello\n")); err != nil {
			return fail(fmt.Errorf("sending request: %w", err))
		}
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		if err != nil {
			return fail(fmt.Errorf("reading reply: %w", err))
		}
		data = buf[:n]
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		return fail(fmt.Errorf("malformed reply %q", data))
	}
	return Reply{Server: fields[0], Source: fields[1]}, nil
}

// reuseAddr lets a fixed source port be bound again while an earlier connection from it
// lingers.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var sockErr error
	if err := c.Control(func(fd uintptr) {
		sockErr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return sockErr
}

// IsRefused reports whether err is a refused connection: a TCP reset, an SCTP ABORT, or
// an ICMP port unreachable (as nftables' plain "reject" sends).
func IsRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

// IsUnreachable reports whether err is an ICMP host, network or administratively
// prohibited unreachable, as "reject with icmpx host-unreachable" and similar send.
func IsUnreachable(err error) bool {
	return errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// IsTimeout reports whether err is a timeout: nothing came back, as when a packet or its
// reply was dropped.
func IsTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
