package healthcheck

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// Listener opens the socket for a health-check node port. Tests substitute one that maps
// node ports to ephemeral loopback ports.
type Listener interface {
	Listen(port int) (net.Listener, error)
}

// TCPListener is the real Listener: it listens on a node port on every address, or only
// on the node IPs it was given (upstream's nodePortAddresses).
type TCPListener struct {
	addrs []string
}

var _ Listener = &TCPListener{}

// NewTCPListener returns a TCPListener that listens on each of addrs, or on all addresses
// when addrs is empty.
func NewTCPListener(addrs []string) *TCPListener {
	return &TCPListener{addrs: addrs}
}

// Listen listens on port at each configured address. With several addresses the returned
// listener accepts from all of them, and closing it closes them all; if any address cannot
// be bound, none stays open, so a retry or another owner can take the port.
func (t *TCPListener) Listen(port int) (net.Listener, error) {
	if len(t.addrs) == 0 {
		// net's errors already name the operation and address.
		return net.Listen("tcp", fmt.Sprintf(":%d", port))
	}
	listeners := make([]net.Listener, 0, len(t.addrs))
	for _, addr := range t.addrs {
		hostPort := net.JoinHostPort(addr, strconv.Itoa(port))
		l, err := net.Listen("tcp", hostPort)
		if err != nil {
			for _, opened := range listeners {
				_ = opened.Close()
			}
			return nil, err
		}
		listeners = append(listeners, l)
	}
	if len(listeners) == 1 {
		return listeners[0], nil
	}
	return newMultiListener(listeners), nil
}

// multiListener merges several listeners into one, so one http.Server serves a node port
// on every node IP.
type multiListener struct {
	listeners []net.Listener
	accepted  chan acceptResult
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup
}

type acceptResult struct {
	conn net.Conn
	err  error
}

func newMultiListener(listeners []net.Listener) *multiListener {
	m := &multiListener{
		listeners: listeners,
		accepted:  make(chan acceptResult),
		done:      make(chan struct{}),
	}
	for _, l := range listeners {
		m.wg.Go(func() { m.acceptLoop(l) })
	}
	return m
}

// acceptLoop hands l's connections and errors to Accept until l is closed.
func (m *multiListener) acceptLoop(l net.Listener) {
	for {
		conn, err := l.Accept()
		select {
		case m.accepted <- acceptResult{conn: conn, err: err}:
		case <-m.done:
			if conn != nil {
				_ = conn.Close()
			}
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// Accept returns the next connection from any of the listeners.
func (m *multiListener) Accept() (net.Conn, error) {
	select {
	case r := <-m.accepted:
		return r.conn, r.err
	case <-m.done:
		return nil, net.ErrClosed
	}
}

// Close closes every listener and waits for their accept loops to end.
func (m *multiListener) Close() error {
	m.closeOnce.Do(func() {
		close(m.done)
		errs := make([]error, 0, len(m.listeners))
		for _, l := range m.listeners {
			errs = append(errs, l.Close())
		}
		m.wg.Wait()
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// Addr returns the first listener's address; the port is the same on all of them.
func (m *multiListener) Addr() net.Addr {
	return m.listeners[0].Addr()
}
