// Command pause is the sandbox ("pause") image of test/cluster's node, built offline by
// hack/build-image.sh because no registry is reachable to pull registry.k8s.io/pause. As
// upstream's, it holds a pod's namespaces open until it is told to stop, and, as the
// pod's first process when the pod shares its PID namespace, reaps orphaned children.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
