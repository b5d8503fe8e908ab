// Package kerneltest holds the supervisor's real-kernel tests: whole supervisors (fake
// API, real nftables) run against a network namespace of their own. It has no code of its
// own; the tests are in the kernel layer (hack/layers.sh).
package kerneltest
