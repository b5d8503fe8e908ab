package legacy

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// passNetAdmin returns how to start a command so that it gets this process's
// CAP_NET_ADMIN, nil when this process does not hold it.
//
// In the DaemonSet's pod the supervisor runs as user 65532 and holds CAP_NET_ADMIN from
// its own file capability; iptables-nft-save, which it runs to read kube-proxy's rules
// during a migrate rollback, is an applet of xtables-nft-multi, which picks the applet
// by the name it is started under. A file capability on it (or on a copy named for the
// one applet, which anyone starting it can rename with argv[0]) would give every applet,
// iptables-nft-restore and ebtables among them, CAP_NET_ADMIN for whoever runs it. So no
// iptables binary in the image carries one: the process that already holds the
// capability passes it to the commands it chooses to run, as an ambient capability
// (Linux 4.3+), which the kernel keeps across the exec of a program without file
// capabilities and under no_new_privs. Root, which holds it anyway, passes it the same
// way; a process without it (a user's shell) starts commands as before, which then fail
// for want of it rather than at the exec.
func passNetAdmin() *syscall.SysProcAttr {
	if !holdsNetAdmin() {
		return nil
	}
	return &syscall.SysProcAttr{AmbientCaps: []uintptr{unix.CAP_NET_ADMIN}}
}

// holdsNetAdmin reports whether CAP_NET_ADMIN is in this process's permitted set, which
// raising it into the ambient set needs (and in its bounding set, which raising it into
// the inheritable set needs).
func holdsNetAdmin() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	const bit = unix.CAP_NET_ADMIN
	if data[bit/32].Permitted&(1<<(bit%32)) == 0 {
		return false
	}
	inBounding, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, bit, 0, 0, 0)
	return err == nil && inBounding == 1
}
