package healthcheck

import (
	"net"
	"net/netip"
	"strconv"
)

// Listener opens the socket of a health-check node port on one node address. Tests
// substitute one that maps node ports to ephemeral loopback ports.
type Listener interface {
	Listen(addr netip.Addr, port int) (net.Listener, error)
}

// TCPListener is the real Listener: a TCP socket on the address, of its family only (an
// IPv6 socket never takes IPv4 connections).
type TCPListener struct{}

var _ Listener = TCPListener{}

// Listen listens on addr:port; net's errors already name the operation and address.
func (TCPListener) Listen(addr netip.Addr, port int) (net.Listener, error) {
	network := "tcp4"
	if addr.Is6() && !addr.Is4In6() {
		network = "tcp6"
	}
	return net.Listen(network, net.JoinHostPort(addr.Unmap().String(), strconv.Itoa(port)))
}
